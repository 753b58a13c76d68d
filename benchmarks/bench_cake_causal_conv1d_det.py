#!/usr/bin/env python3
"""Benchmark of cakeconv's deterministic packed causal conv1d (any width, SiLU or none) against its peers (one GPU).

Run from the repository root on a CUDA machine:

    python benchmarks/bench_cake_causal_conv1d_det.py                # the full grid, seed document mix
    python benchmarks/bench_cake_causal_conv1d_det.py --quick        # S = 250340, C in 128, 512, 4096
    python benchmarks/bench_cake_causal_conv1d_det.py --rows 512,4096 --bias no --out /tmp/res
    python benchmarks/bench_cake_causal_conv1d_det.py --doc-mix seed,uniform:1-64,ones --rows 250340x512
    python benchmarks/bench_cake_causal_conv1d_det.py --rows 250340x128,250340x512 --passes fwdbwd \\
        --bias no --eager --host-cost                                # SPEC 7's eager loop and host cost
    python benchmarks/bench_cake_causal_conv1d_det.py --out benchmarks/results --name h200_summary ...
    python benchmarks/bench_cake_causal_conv1d_det.py --width 2,3,4,8 --activation silu,none --rows 250340x512
    python benchmarks/bench_cake_causal_conv1d_det.py --dry-run --eager --host-cost   # CPU, reference backend

Three timings (benchmarks/README.md has the long form; SPEC section 7; the protocol is timing.py's):

* GPU time (``--passes fwd,bwd,fwdbwd``, gpu_time.py): floor bytes with bf16 x: fwd reads x and writes y,
  4*S*C bytes; bwd reads x and dy and writes dx, 6*S*C; fwd+bwd 10*S*C. GB/s = floor bytes / median time;
  "f" = that over the copy bandwidth measured in the same run. Every pass is the whole call a user makes,
  between two CUDA events, the host queued ahead of the GPU, cold L2, providers and passes interleaved,
  warm-up rounds dropped, median of the timed calls.
* Eager loop (``--eager``, eager_loop.py): what a user gets, no host-ahead trick: the 16-call chain with one
  backward per step, and one call + its backward per step; wall time per call.
* Host cost (``--host-cost``, host_cost.py): the same at a tiny shape where the GPU is idle, beside a trivial
  autograd.Function and torch.nn.functional.silu.

Widths and activations (``--width 2,...,8``, ``--activation silu,none``; default 4 and silu): every (W,
activation) runs at every mix, shape and bias variant, on the same x and dy (taps [C, W]); a provider that cannot
take a (W, activation) (Dao's: W = 2..4) is skipped there with a note. Document mixes (``--doc-mix``,
doc_mixes.py), the grid and the inputs (shapes.py), the providers (ours, ours_search, ours_ag, fla, dao,
dao_det: providers.py), the correctness check before timing (correctness.py), the rows and files
(report_rows.py), the table (report_table.py) and the plots (report_plots.py) each have their module. Every
row records its mix, number of documents and shortest/longest document, its width and activation, and the
run's GPU, versions, date and commit (environment.py).
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import sys
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
if BENCH_DIR not in sys.path:  # the modules beside this file (it may be imported by path)
    sys.path.insert(0, BENCH_DIR)

from correctness import check_shape  # noqa: E402
from eager_loop import eager_at_shape  # noqa: E402
from environment import REPO_ROOT, run_environment  # noqa: E402
from gpu_time import time_gpu  # noqa: E402
from host_cost import host_cost  # noqa: E402
from measures import EAGER_METHOD, PASS_LABEL, activation_arg, activation_label  # noqa: E402
from progress import fmt_secs, log, note  # noqa: E402
from providers import load_providers, peer_versions  # noqa: E402
from report_plots import plot, plot_host_cost, plot_widths  # noqa: E402
from report_rows import PartialFile, build_rows, write_outputs  # noqa: E402
from report_table import format_table  # noqa: E402
from run_settings import parse_args, resolve_settings  # noqa: E402
from shapes import make_shape  # noqa: E402
from timing import DeviceClock, copy_bandwidth  # noqa: E402

REQUIRED = ("cake_causal_conv1d_det_train_forward", "cake_causal_conv1d_det_train_backward", "cake_causal_conv1d_det")


def import_cakeconv(notes: list):
    """cakeconv, or None with a note. A cakeconv already importable wins (an A/B of code versions puts one on
    PYTHONPATH); otherwise this repository's."""
    if importlib.util.find_spec("cakeconv") is None:
        sys.path.insert(0, REPO_ROOT)
    try:
        import cakeconv
    except Exception as exc:  # noqa: BLE001 - any import failure means "not available"
        notes.append(f"cakeconv did not import ({type(exc).__name__}: {exc})")
        return None
    log(f"cakeconv from {os.path.dirname(os.path.abspath(cakeconv.__file__))}")
    lacking = [n for n in REQUIRED if not hasattr(cakeconv, n)]
    if lacking:
        notes.append(f"cakeconv ({getattr(cakeconv, '__file__', '?')}) lacks {lacking}")
        return None
    return cakeconv


def environment(torch, st, cakeconv, provs, argv) -> dict:
    """The run's env line: environment.run_environment, cakeconv's and the peers' versions, the settings."""
    env = run_environment(torch, st.device, "cpu (dry-run)")
    env["cakeconv"] = getattr(cakeconv, "__version__", None) if cakeconv is not None else None
    env["cakeconv_path"] = os.path.dirname(os.path.abspath(cakeconv.__file__)) if cakeconv is not None else None
    env.update(peer_versions(provs))
    env["ours_backend"] = st.backend
    env["doc_mixes"] = st.mixes
    env["widths"] = st.widths
    env["activations"] = st.activations
    env["chain"] = st.chain
    env["calls_per_sample"] = st.n_calls
    env["host_ahead"] = "auto" if st.ahead_auto else st.base_ahead_us
    env["argv"] = list(sys.argv[1:] if argv is None else argv)
    return env


def where_of(sh, use_bias=None) -> str:
    """The words that name a shape (and its W, activation and bias variant) in progress lines and notes."""
    if use_bias is None:
        return f"{sh.mix} S={sh.S} C={sh.C}"
    return (f"{sh.mix} S={sh.S} C={sh.C} W={sh.width} {'silu' if sh.activation else 'no activation'} "
            f"bias={'yes' if use_bias else 'no'}")


def prepare(provs, sh, notes: list, use_bias=None, need_bwd_graph=False) -> list:
    """The providers that prepared this shape (use_bias None) or this bias variant; the others are noted."""
    where = where_of(sh, use_bias)
    ready = []
    for p in provs:
        try:
            if use_bias is None:
                p.prepare_shape(sh)
            else:
                p.prepare_bias(sh, use_bias, need_bwd_graph=need_bwd_graph)
        except Exception as exc:  # noqa: BLE001 - a provider that fails is reported and dropped
            what = "failed to prepare" if use_bias is None else "failed"
            note(notes, f"{p.name} {what} {where}: {type(exc).__name__}: {exc}")
            continue
        ready.append(p)
    return ready


def run_variant(torch, st, sh, live, use_bias, clock, notes, record, checks, counter, tag):
    """Check, then GPU time and eager loop of one shape and bias variant. Returns (calls made so far,
    the progress summary)."""
    active = prepare(live, sh, notes, use_bias, need_bwd_graph="bwd" in st.passes)
    if st.check and active:
        log(f"{tag}: {sh.n_docs} documents ({sh.doc_min}-{sh.doc_max}); checking {[p.name for p in active]} "
            "against the FP32 reference")
        checks += check_shape(torch, sh, active, use_bias, notes)
    base = {"mix": sh.mix, "S": sh.S, "C": sh.C, "width": sh.width, "activation": activation_label(sh.activation),
            "n_docs": sh.n_docs, "doc_min": sh.doc_min, "doc_max": sh.doc_max, "bias": use_bias}

    def on_error(name, p_, exc):
        note(notes, f"{name} {p_} failed {where_of(sh, use_bias)}: {type(exc).__name__}: {exc}")

    calls = [(p, p_, p.around(p.callable_for(p_, sh, use_bias))) for p in active for p_ in st.passes]
    g = time_gpu(clock, calls, len(sh.sets), counter, st.reps, st.warmup, st.base_ahead_us, st.ahead_auto, on_error)
    calls = None  # drop the closures (they hold this shape's tensors)
    summary = []
    for (name, p_), ts in g.times.items():
        if name in g.failed or not ts:
            continue
        record({**base, "method": "gpu", "pass": p_, "provider": name, "times": ts,
                "host_ms": statistics.median(g.host_times[(name, p_)]), "n_sets": len(sh.sets),
                "host_ahead_us": g.window_us[(name, p_)] if st.sleeping else 0.0})
        summary.append(f"{name}:{PASS_LABEL[p_]}={statistics.median(ts):.3f}ms")
    if st.eager_at(sh.mix, sh.C):
        for (name, mode), ts in eager_at_shape(torch, sh, active, use_bias, st, clock.sync, notes).items():
            record({**base, "method": EAGER_METHOD[mode], "pass": "fwdbwd", "provider": name, "times": ts,
                    "host_ms": 0.0, "chain": st.chain if mode == "chain" else 1, "n_sets": 1})
            summary.append(f"{name}:{EAGER_METHOD[mode]}={statistics.median(ts):.3f}ms/call")
    for p in active:
        p.release_bias()
    return g.counter, summary


def taking(provs, width: int, activation: str, notes: list, noted: set) -> list:
    """The providers that take (width, activation label); each one that does not is noted once per pair."""
    out = []
    for p in provs:
        why = p.supports(width, activation_arg(activation))
        if why is None:
            out.append(p)
        elif (p.name, width, activation) not in noted:
            noted.add((p.name, width, activation))
            note(notes, f"{p.name}: skipped at W={width}, activation {activation}: {why}")
    return out


def run_grid(torch, st, provs, clock, notes, record, checks, t_start) -> None:
    """Every mix x shape x (W, activation) x bias variant of the run, with progress lines (elapsed time, ETA)."""
    grid = [(mix, S, C) for mix in st.mixes for S, C in st.shapes] if (st.passes or st.eager_modes) else []
    total_w = sum(S * C for _, S, C in grid) * len(st.bias_variants) * len(st.width_acts)
    done_w = counter = 0
    noted = set()
    for i_shape, (mix, S, C) in enumerate(grid):
        sh = make_shape(torch, S, C, st.device, st.seed, st.mean_doc_len, st.l2_bytes, st.max_sets, mix=mix)
        live = prepare(provs, sh, notes)
        for width, act in st.width_acts:
            sh.use_taps(torch, width, activation_arg(act))
            fit = taking(live, width, act, notes, noted)
            for use_bias in st.bias_variants:
                tag = f"[{i_shape + 1}/{len(grid)}] {where_of(sh, use_bias)}"
                t0 = time.perf_counter()
                counter, summary = run_variant(torch, st, sh, fit, use_bias, clock, notes, record, checks, counter, tag)
                done_w += S * C
                el = time.perf_counter() - t_start
                eta = el / max(1, done_w) * (total_w - done_w)
                log(f"{tag}: {len(sh.sets)} sets, {sh.n_docs} docs, {time.perf_counter() - t0:.1f}s  "
                    f"{'  '.join(summary)}  elapsed {fmt_secs(el)} ETA {fmt_secs(eta)}")
        for p in provs:
            p.release_shape()
        del sh
        if st.device.type == "cuda":
            torch.cuda.empty_cache()


def host_ahead_notes(rows, st) -> list[str]:
    """Notes on the GPU-time rows whose host time came near their host-ahead window, and on long windows."""
    if st.device.type != "cuda" or not st.sleeping:
        return []
    gpu = [r for r in rows if r["method"] == "gpu"]
    out = []
    slow = [r for r in gpu if r["host_ms"] > 0.8 * r["host_ahead_us"] * 1e-3]
    if slow:
        worst = sorted(slow, key=lambda r: -r["host_ms"])[:6]
        out.append(f"{len(slow)} rows took the host longer than 80% of their host-ahead window to enqueue (host-bound, "
                   "or a host sync inside the call): their spans include host time; worst: "
                   + ", ".join(f"{r['provider']} {PASS_LABEL[r['pass']]} {r['mix']} S={r['S']} C={r['C']} "
                               f"W={r['width']} {r['activation']} "
                               f"{r['host_ms']:.2f} ms of {r['host_ahead_us'] / 1e3:.1f}" for r in worst))
    longer = sorted({(r["provider"], round(r["host_ahead_us"] / 1e3, 1)) for r in gpu
                     if r["host_ahead_us"] > st.base_ahead_us})
    if longer:
        out.append("host-ahead windows longer than %.1f ms (auto: 3x the host time of the call): " % (st.base_ahead_us / 1e3)
                   + ", ".join(f"{p} {w} ms" for p, w in longer[:12]))
    return out


def write_results(rows, checks, env, notes, st, elapsed) -> str:
    """The files of the run (report_rows, report_plots) and its table; returns the table."""
    os.makedirs(st.out, exist_ok=True)
    paths = write_outputs(rows, checks, env, notes, st.out, elapsed, st.stem)
    if st.plot:
        pngs = [plot(rows, st.sweep_s, env, st.out, notes, st.stem), plot_host_cost(rows, env, st.out, notes, st.stem),
                plot_widths(rows, st.sweep_s, env, st.out, notes, st.stem)]
        paths += [p for p in pngs if p]
    table_path = os.path.join(st.out, st.stem + "_table.txt")
    paths.append(table_path)
    text = format_table(rows, checks, env, notes, st.passes, st.bias_variants, st.sweep_s, paths, elapsed)
    with open(table_path, "w") as f:
        f.write(text + "\n")
    return text


def main(argv=None):
    args = parse_args(argv)
    t_start = time.perf_counter()
    import torch

    st = resolve_settings(args, torch)
    notes: list[str] = []
    cakeconv = import_cakeconv(notes)
    provs = load_providers(torch, st.names, cakeconv, st.backend, st.device.type == "cuda", notes)
    for n in notes:
        log("note: " + n)
    if not provs:
        raise SystemExit("no provider available")
    env = environment(torch, st, cakeconv, provs, argv)
    st.l2_bytes = env["l2_bytes"] or 60 * 2**20
    clock = DeviceClock(torch, st.device, flush=st.flush)
    copy_gbs_0, _ = copy_bandwidth(torch, clock, st.copy_bytes, 10, st.base_ahead_us)
    log(f"copy bandwidth (start): {copy_gbs_0:.0f} GB/s (read + write, median of 10)")
    partial = PartialFile(st.out, st.stem, env, copy_gbs_0)  # rows follow as they are measured
    log(f"{env['gpu']}  torch {env['torch']}  triton {env['triton']}  providers {[p.name for p in provs]}  "
        f"mixes {st.mixes}  shapes {len(st.shapes) if (st.passes or st.eager_modes) else 0}  bias {st.bias_variants}  "
        f"passes {st.passes}  reps {st.reps} (+{st.warmup} warm-up)  eager {st.eager_modes or 'off'}  "
        f"host cost {'on' if st.host_cost else 'off'}")
    results, checks = [], []  # raw timings: the rows are built once the copy bandwidth is final

    def record(r):
        results.append(r)
        partial.add(r)  # written as we go, so a run cut short by a time limit still leaves its rows

    run_grid(torch, st, provs, clock, notes, record, checks, t_start)
    if st.host_cost:
        host_cost(torch, st.device, provs, st, clock.sync, notes, record)
    copy_gbs_1, _ = copy_bandwidth(torch, clock, st.copy_bytes, 10, st.base_ahead_us)
    # The higher of the two readings: a copy that slows down during the run must not inflate the fractions.
    copy_gbs = max(copy_gbs_0, copy_gbs_1)
    log(f"copy bandwidth (end): {copy_gbs_1:.0f} GB/s; used: {copy_gbs:.0f} GB/s (the higher reading)")
    env.update(copy_gbs=copy_gbs, copy_gbs_start=copy_gbs_0, copy_gbs_end=copy_gbs_1)
    rows = build_rows(results, env, copy_gbs, st.warmup, st.flush)
    notes += host_ahead_notes(rows, st)
    print(write_results(rows, checks, env, notes, st, time.perf_counter() - t_start), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
