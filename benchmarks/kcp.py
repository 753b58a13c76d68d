"""Context-parallel (KCP) causal conv1d + SiLU against the rank's local op, per layout; one process per GPU.

    torchrun --standalone --nproc-per-node 2 -m benchmarks.kcp --tokens 131072 --name h200x2_kcp
    python -m benchmarks.kcp --replot RUN.jsonl [--out DIR]                   (the PNG again, no GPU)

Per layout and form (single; multi: q, k, v in one call): KCP y and dx bitwise the single-rank op's, then GPU time,
eager loop and host cost against the local op, the slowest rank's medians. T tokens, S local rows, C channels, P ranks.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

import cakeconv
from benchmarks.report import REPO_ROOT, log, pyplot, read_jsonl, run_environment, write_csv, write_jsonl
from benchmarks.timing import DeviceClock, auto_ahead_us, eager_forms, full_kernels_ready, rotation, wall_samples

SEED_DOC_LENGTHS = (15945, 21845, 27746)  # the seed's workload, T = 65,536; --tokens scales it
LAYOUTS = ("contiguous", "zigzag", "zigzag_per_document")
SUBJECTS = {"kcp": 1, "local": 1, "kcp_multi": 3, "local_multi": 3}  # tensors per call
FORMS = {"single": ("kcp", "local"), "multi": ("kcp_multi", "local_multi")}
PASSES = {"fwd": 4, "bwd": 6, "fwdbwd": 10}  # floor bytes per (row, channel) with bf16 x
TARGETS = {"overhead_pct": (3.0, "GPU time: KCP / local - 1 (%)"),  # SPEC 7 at S_local 65,536, C 4,096
           "eager_overhead_pct": (5.0, "eager loop: KCP / local - 1 (%)"),
           "host_chain_ratio": (1.5, "host cost per call: KCP / local (x)")}
NVLS_OFF_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
ENV_FIELDS = ("date", "commit", "gpu", "torch", "triton", "cakeconv", "backend", "process_group")
AHEAD_MAX_US = 500000.0  # the auto window's cap; a tenth of it while the host time is measured
DEFAULTS = {"tokens": (sum(SEED_DOC_LENGTHS), 4096), "channels": (4096, 64), "reps": (20, 2), "warmup": (3, 1),
            "backend": ("auto", "reference"), "chain": (16, 4), "eager_steps": (10, 2), "host_steps": (15, 2),
            "host_channels": (256, 16), "host_tokens_per_rank": (4096, 128)}  # (default, --dry-run's)
TABLES = {"GPU time (ms; overhead = KCP / local - 1, %; host ahead us; host time to enqueue ms)":
          "layout form T S_local fwd_ms bwd_ms fwdbwd_ms local_fwdbwd_ms overhead_pct host_ahead_us host_enqueue_ms "
          "host_leak bitwise bitwise_failed_ranks",
          "eager loop (wall ms per call) and host cost per call (us, GPU idle; ratio = KCP / local)":
          "layout form eager_ms local_eager_ms eager_overhead_pct eager_fwdbwd_gbs host_chain_us local_host_chain_us "
          "host_chain_ratio host_step_us local_host_step_us host_step_ratio"}


def parse_args(argv=None) -> argparse.Namespace:
    """The options, the run's defaults filled in (raises ValueError on a bad one)."""
    p = argparse.ArgumentParser(description="KCP causal conv1d + SiLU against the rank's local op, per layout")
    p.add_argument("--layouts", default=",".join(LAYOUTS), help="comma list")
    for name, (gpu, dry) in DEFAULTS.items():
        p.add_argument("--" + name.replace("_", "-"), type=type(gpu), help=f"default {gpu}; {dry} with --dry-run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU over gloo, backend reference")
    p.add_argument("--out", help="output folder (default benchmarks/results; with --replot the run's folder)")
    p.add_argument("--name", help="stem of the files written (default kcp_p{P})")
    p.add_argument("--replot", metavar="RUN.jsonl", help="redraw the PNG of a finished run (no GPU)")
    args = p.parse_args(argv)
    for name, values in DEFAULTS.items():
        setattr(args, name, values[args.dry_run] if getattr(args, name) is None else getattr(args, name))
    args.layouts = list(dict.fromkeys(s.strip() for s in args.layouts.split(",") if s.strip()))
    if not args.layouts or not set(args.layouts) <= set(LAYOUTS) or min(args.reps, args.chain) < 1 or min(
            args.warmup, args.eager_steps, args.host_steps, args.tokens - 3) < 0:
        raise ValueError(f"--layouts among {LAYOUTS}; --reps, --chain >= 1; --warmup, --eager-steps, --host-steps "
                         ">= 0; --tokens >= 3 (one per document)")
    return args


def doc_lengths(tokens: int, layout: str | None, P: int) -> list[int]:
    """The seed's documents scaled to ``tokens``, then padded at the ends: T % P, T % 2P or each length % 2P == 0."""
    exact = [n * tokens / sum(SEED_DOC_LENGTHS) for n in SEED_DOC_LENGTHS]
    lengths = [int(v) for v in exact]
    for i in sorted(range(len(exact)), key=lambda i: lengths[i] - exact[i])[: tokens - sum(lengths)]:
        lengths[i] += 1
    up = lambda n, m: -(-n // m) * m  # noqa: E731
    if layout == "zigzag_per_document":
        return [up(n, 2 * P) for n in lengths]
    pad = 0 if layout is None else up(sum(lengths), P if layout == "contiguous" else 2 * P) - sum(lengths)
    return lengths[:-1] + [lengths[-1] + pad]


def shape(args, tokens: int, C: int, layout: str, P: int, device, seed: int):
    """(doc lengths, cu_N1, KCP context, 3 x (x_TC, dy_TC bf16 N(0, 1), w_C4 N(0, 0.25), b_C N(0, 0.04)) the same on
    every rank, chain taps {subject: [[(w, b)] per call]})."""
    lengths = doc_lengths(tokens, layout, P)
    cu_N1 = torch.tensor(list(itertools.accumulate(lengths, initial=0)), dtype=torch.int32, device=device)
    gens = [torch.Generator(device=device).manual_seed(s) for s in (seed, seed + 7)]
    randn = lambda g, *size: torch.randn(*size, generator=gens[g], device=device, dtype=torch.float32)  # noqa: E731
    taps_bias = lambda g: ((randn(g, C, 4) * 0.5).contiguous(), (randn(g, C) * 0.2).contiguous())  # noqa: E731
    inputs = [(randn(0, sum(lengths), C).to(torch.bfloat16), randn(0, sum(lengths), C).to(torch.bfloat16),
               *taps_bias(0)) for _ in range(3)]
    base = [[taps_bias(1) for _ in range(3)] for _ in range(args.chain)]
    taps = {s: [[tuple(t.clone().requires_grad_(True) for t in wb) for wb in call[:n]] for call in base]
            for s, n in SUBJECTS.items()}
    return lengths, cu_N1, cakeconv.build_kcp_context(cu_N1, layout=layout, device=device), inputs, taps


def setup(args):
    """(device, owns_group, env): NCCL on LOCAL_RANK's GPU or gloo on the CPU; a group already there is used."""
    os.environ.update(NVLS_OFF_ENV)  # NVLink multicast off, before the process group exists
    use_cuda = not args.dry_run and torch.cuda.is_available()
    if not args.dry_run and not use_cuda:
        raise ValueError("no CUDA device: run with --dry-run to exercise the benchmark on the CPU")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if use_cuda else torch.device("cpu")
    if use_cuda:  # LOCAL_RANK: torchrun's
        torch.cuda.set_device(device)
    if owns_group := not dist.is_initialized():  # torchrun's ranks, or a plain `python -m`: one rank
        one_rank = {} if "WORLD_SIZE" in os.environ else {"store": dist.HashStore(), "rank": 0, "world_size": 1}
        dist.init_process_group("nccl" if use_cuda else "gloo", **one_rank)
    env = run_environment(torch, device, "cpu")
    env.update(cakeconv=getattr(cakeconv, "__version__", None), backend=args.backend, world_size=dist.get_world_size(),
               process_group=str(dist.get_backend()), nccl=None, **{k: os.environ.get(k) for k in NVLS_OFF_ENV})
    if use_cuda:
        v = torch.cuda.nccl.version()  # a tuple in recent torch, an int in older ones
        env["nccl"] = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
    return device, owns_group, env


class RankClock(DeviceClock):
    """timing.DeviceClock across ranks: ``barrier()`` leaves the device idle and every rank there."""

    def barrier(self) -> None:
        self.sync()
        dist.barrier(**({"device_ids": [self.device.index]} if self.cuda else {}))
        self.sync()


def subject_ops(ctx, backend: str) -> dict:
    """{subject: op(xs, wbs) -> [y per tensor]}: xs the call's inputs, wbs their [(taps, bias)]."""
    kcp, multi = cakeconv.cake_causal_conv1d_det_kcp, cakeconv.cake_causal_conv1d_det_multi_kcp
    local, cu = cakeconv.cake_causal_conv1d_det, ctx.local_cu_seqlens
    op_local = lambda xs, wbs: [local(x, w, b, cu_seqlens=cu, backend=backend) for x, (w, b) in zip(xs, wbs)]  # noqa
    return {"kcp": lambda xs, wbs: [kcp(xs[0], wbs[0][0], ctx, bias=wbs[0][1], backend=backend)], "local": op_local,
            "kcp_multi": lambda xs, wbs: list(multi(list(xs), [w for w, _ in wbs], ctx, biases=[b for _, b in wbs],
                                                    backend=backend)), "local_multi": op_local}


def check_layout(ctx, inputs, cu_N1, backend, device, layout) -> dict:
    """{form: ranks whose KCP y or dx is not bitwise the single-rank op's on the whole batch}, on every rank."""
    index_S = ctx.local_token_indices.to(device)
    ops, ok = subject_ops(ctx, backend), {}
    for form, (kcp, _) in FORMS.items():
        xs = [ctx.shard(t[0]).requires_grad_(True) for t in inputs[:SUBJECTS[kcp]]]
        ys = ops[kcp](xs, [(t[2], t[3]) for t in inputs[:SUBJECTS[kcp]]])
        torch.autograd.backward(ys, [ctx.shard(t[1]) for t in inputs[:SUBJECTS[kcp]]])
        ok[form] = True
        for (x_TC, dy_TC, w_C4, b_C), x_SC, y_SC in zip(inputs, xs, ys):
            x_ref = x_TC.detach().clone().requires_grad_(True)
            y_ref = cakeconv.cake_causal_conv1d_det(x_ref, w_C4, b_C, cu_seqlens=cu_N1, backend=backend)
            y_ref.backward(dy_TC)
            ok[form] = (ok[form] and torch.equal(y_SC.detach(), y_ref.detach().index_select(0, index_S))
                        and torch.equal(x_SC.grad, x_ref.grad.index_select(0, index_S)))
        if not ok[form]:
            log(f"[kcp bench] rank {dist.get_rank()}: {layout} {form}: KCP y/dx NOT bitwise the single-rank op's")
    ok_P = [None] * dist.get_world_size()
    dist.all_gather_object(ok_P, ok)
    return {f: [r for r, o in enumerate(ok_P) if not o[f]] for f in FORMS}


def time_gpu(operands: dict, clock: RankClock, args, device) -> dict:
    """Medians ``{subject}_{fwd,bwd,fwdbwd,host_ms}`` of operands {subject: (op, xs, wbs, dys)}, interleaved; window:
    auto_ahead_us of the largest host time of one iteration after the warm-up, over ranks."""

    def step(op, xs, wbs, dys):  # .grad to None outside the span: no accumulation kernel is timed
        for t in xs + [t for wb in wbs for t in wb]:
            t.grad = None
        clock.barrier()
        clock.before_call(clock.host_ahead_us)  # the sleep, then the L2 eviction
        m0, t0 = clock.mark(), time.perf_counter()
        ys = op(xs, wbs)
        m1 = clock.mark()
        torch.autograd.backward(ys, dys)
        return m0, m1, (time.perf_counter() - t0) * 1e3, clock.mark()  # the host time before the last mark

    names = list(operands)
    samples = {f"{n}_{k}": [] for n in names for k in (*PASSES, "host_ms")}
    clock.host_ahead_us = 0.0
    for r in range(args.warmup):
        for name in rotation(names, r):
            step(*operands[name])
        clock.sync()
    full_kernels_ready()
    if clock.can_sleep:
        clock.host_ahead_us = AHEAD_MAX_US / 10  # the GPU far behind while the host time is measured
        host_K = torch.tensor([max(step(*operands[n])[2] for n in names)], dtype=torch.float64, device=device)
        clock.sync()
        dist.all_reduce(host_K, op=dist.ReduceOp.MAX)
        clock.host_ahead_us = auto_ahead_us(float(host_K.item()), AHEAD_MAX_US)
    for r in range(args.reps):
        marks = [(name, step(*operands[name])) for name in rotation(names, r)]
        clock.sync()
        for name, (m0, m1, host_ms, m2) in marks:
            for k, v in zip((*PASSES, "host_ms"), (clock.elapsed_ms(m0, m1), clock.elapsed_ms(m1, m2),
                                                   clock.elapsed_ms(m0, m2), host_ms)):
                samples[f"{name}_{k}"].append(v)
    return {k: statistics.median(v) for k, v in samples.items()}


def time_eager(ops, taps, xs, dys, clock, chain: int, modes: dict, samples: int, warmup: int) -> dict:
    """Median wall ms per call of eager_forms' ``modes`` {mode: key suffix} per subject, interleaved, ranks met."""
    subjects = {}
    for mode, suffix in modes.items():
        for name, op in ops.items():
            n, wbs = SUBJECTS[name], taps[name]
            leaves = [x.detach().requires_grad_(True) for x in xs[:n]]  # own leaves, shared storage
            params = leaves + [t for call in wbs for wb in call for t in wb]
            subjects[name + suffix] = eager_forms(torch, lambda y, i, op=op, wbs=wbs: op(y, wbs[i]), leaves, dys[:n],
                                                  params, chain, chain, (mode,))[mode]
    out = wall_samples(subjects, samples, warmup, clock.barrier, clock.sync)
    return {k: statistics.median(v) for k, v in out.items()}


def run_layout(args, layout, device, clock):
    """Check and time one layout: (every rank's statistics, failed ranks per form, doc lengths, host T)."""
    P = dist.get_world_size()
    lengths, cu_N1, ctx, inputs, taps = shape(args, args.tokens, args.channels, layout, P, device, args.seed)
    failures = check_layout(ctx, inputs, cu_N1, args.backend, device, layout)
    xs = [ctx.shard(t[0]).detach().requires_grad_(True) for t in inputs]  # the timing operands: leaves
    dys = [ctx.shard(t[1]).contiguous() for t in inputs]
    wbs = [(w.detach().clone().requires_grad_(True), b.detach().clone().requires_grad_(True)) for *_, w, b in inputs]
    ops, t0, inputs = subject_ops(ctx, args.backend), time.perf_counter(), None  # inputs freed
    stats = time_gpu({n: (op, xs[:SUBJECTS[n]], wbs[:SUBJECTS[n]], dys[:SUBJECTS[n]]) for n, op in ops.items()},
                     clock, args, device)
    stats.update(S=float(ctx.num_local_tokens), segments=float(ctx.num_segments), host_ahead_us=clock.host_ahead_us,
                 hist_rows=float(ctx.plan.hist.num_recv), fut_rows=float(ctx.plan.fut.num_recv))
    if args.eager_steps > 0:
        stats.update(time_eager(ops, taps, xs, dys, clock, args.chain, {"chain": "_eager_ms"}, args.eager_steps,
                                0 if args.dry_run else 1))
    xs, dys, wbs, host_T = None, None, None, None  # freed before the host cost
    torch.cuda.empty_cache()  # a no-op without CUDA
    if args.host_steps > 0:  # the host cost at a tiny shape, its own context; untimed rounds compile its kernels
        h_lengths, _, h_ctx, h_inputs, h_taps = shape(args, args.host_tokens_per_rank * P, args.host_channels, layout,
                                                      P, device, args.seed + 1)
        h_xs, h_dys = ([h_ctx.shard(t[i]).contiguous() for t in h_inputs] for i in (0, 1))
        stats.update(time_eager(subject_ops(h_ctx, args.backend), h_taps, h_xs, h_dys, clock, args.chain, {
            "chain": "_host_chain_ms", "step": "_host_step_ms"}, args.host_steps, 0 if args.dry_run else 3),
                     host_S_local=float(h_ctx.num_local_tokens))
        host_T = sum(h_lengths)
    stats_P = [None] * P  # every rank's statistics, in rank order
    dist.all_gather_object(stats_P, stats)
    if dist.get_rank() == 0:
        log(f"[kcp bench] {layout}: T={sum(lengths)} S_local={ctx.num_local_tokens} {time.perf_counter() - t0:.1f}s; "
            + ", ".join(f"{n} fwd+bwd {max(s[f'{n}_fwdbwd'] for s in stats_P):.3f} ms" for n in SUBJECTS))
    return stats_P, failures, lengths, host_T


def build_rows(env, args, layout, stats_P, failures, lengths, host_T) -> list[dict]:
    """A timing row per form, every figure the slowest rank's; GB/s of PASSES x S_local x C_total bytes."""
    by = lambda k: [s[k] for s in stats_P]  # noqa: E731
    slow = lambda k: max(by(k)) if k in stats_P[0] else None  # noqa: E731
    pct = lambda a, b: 100.0 * (a - b) / b if (a is not None and b) else None  # noqa: E731
    base, S, rows = doc_lengths(args.tokens, None, 1), int(stats_P[0]["S"]), []
    for form, (kcp, local) in FORMS.items():
        c_total = args.channels * SUBJECTS[kcp]
        gbs = lambda f, ms: f * S * c_total / (ms * 1e-3) / 1e9 if ms else None  # noqa: E731
        ms, loc = {p: slow(f"{kcp}_{p}") for p in PASSES}, {p: slow(f"{local}_{p}") for p in PASSES}
        ahead, enqueue = max(by("host_ahead_us")), slow(f"{kcp}_host_ms")
        eager, local_eager = slow(f"{kcp}_eager_ms"), slow(f"{local}_eager_ms")
        row = {"kind": "timing", **{k: env.get(k) for k in ENV_FIELDS}, "layout": layout, "P": len(stats_P),
               "form": form, "num_tensors": SUBJECTS[kcp], "C": args.channels, "C_total": c_total, "T": sum(lengths),
               "doc_lengths": lengths, "doc_lengths_unpadded": base, "pad_tokens": sum(lengths) - sum(base),
               "S_local": S, **{f"{k}_by_rank": [int(v) for v in by(k if k != "S_local" else "S")]
                                for k in ("S_local", "segments", "hist_rows", "fut_rows")},
               "halo_bytes_max": max(s["hist_rows"] * c_total * 2 + s["fut_rows"] * c_total * 4 for s in stats_P),
               **{f"{p}_ms": ms[p] for p in PASSES}, **{f"local_{p}_ms": loc[p] for p in PASSES},
               "overhead_pct": pct(ms["fwdbwd"], loc["fwdbwd"]),
               "overhead_pct_max_rank": max(map(pct, by(f"{kcp}_fwdbwd"), by(f"{local}_fwdbwd"))),
               "fwdbwd_ms_by_rank": by(f"{kcp}_fwdbwd"), "local_fwdbwd_ms_by_rank": by(f"{local}_fwdbwd"),
               **{f"{p}_gbs": gbs(f, ms[p]) for p, f in PASSES.items()},
               "host_ahead_us": ahead, "host_enqueue_ms": enqueue, "local_host_enqueue_ms": slow(f"{local}_host_ms"),
               "host_leak": bool(ahead > 0 and enqueue > 0.8 * ahead * 1e-3),  # enqueue > 80% of the window
               "chain": args.chain, "eager_ms": eager, "local_eager_ms": local_eager,
               "eager_overhead_pct": pct(eager, local_eager),
               "eager_ms_by_rank": by(f"{kcp}_eager_ms") if eager is not None else None,
               "eager_fwdbwd_gbs": gbs(PASSES["fwdbwd"], eager), "host_T": host_T,
               "host_C": args.host_channels if host_T else None,
               "host_S_local": int(stats_P[0]["host_S_local"]) if host_T else None}
        for m in ("chain", "step"):
            k_ms, l_ms = slow(f"{kcp}_host_{m}_ms"), slow(f"{local}_host_{m}_ms")
            row.update({f"host_{m}_us": k_ms and k_ms * 1e3, f"local_host_{m}_us": l_ms and l_ms * 1e3,
                        f"host_{m}_ratio": k_ms / l_ms if (k_ms is not None and l_ms) else None})
        rows.append({**row, "bitwise": not failures[form], "bitwise_failed_ranks": failures[form], "reps": args.reps,
                     "warmup": args.warmup, "eager_steps": args.eager_steps, "host_steps": args.host_steps,
                     "l2_flush": env["gpu"] != "cpu", "dry_run": args.dry_run})
    return rows


def plot(rows, env, path: str) -> str | None:
    """The PNG (GPU-time, eager overheads, host-cost ratio; SPEC 7's targets dashed): its path, or None."""
    plt = pyplot([])
    if plt is None or not rows:
        return None
    layouts = list(dict.fromkeys(r["layout"] for r in rows))
    fig, axes = plt.subplots(1, len(TARGETS), figsize=(5 * len(TARGETS), 4))
    for ax, (key, (target, title)) in zip(axes, TARGETS.items()):
        for j, form in enumerate(FORMS):
            ax.bar([i + 0.4 * j for i in range(len(layouts))], [next((r.get(key) or 0.0 for r in rows if (
                r["layout"], r["form"]) == (lay, form)), 0.0) for lay in layouts], 0.4, label=form)
        ax.axhline(target, color="k", linestyle="--", linewidth=1, label=f"target {target:g}")
        ax.set(title=title, xticks=[i + 0.2 for i in range(len(layouts))], xticklabels=layouts)
        ax.legend(fontsize=7)
    fig.suptitle(f"KCP vs the local op, slowest rank | {env.get('gpu')} x{env.get('world_size')} | T={rows[0]['T']} "
                 f"S_local={rows[0]['S_local']} C={rows[0]['C']} | {str(env.get('date', ''))[:10]}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_outputs(rows, env, args, elapsed: float) -> None:
    """Print the table; write <name>.jsonl (an env line, then the rows), .csv, _table.txt and .png."""
    r0, stem = rows[0], os.path.join(args.out or os.path.join(REPO_ROOT, "benchmarks", "results"),
                                     args.name or f"kcp_p{env['world_size']}")
    out = [f"# KCP causal conv1d + SiLU | {env['gpu']} x{env['world_size']} ({env['process_group']}) | " + " | ".join(
        f"{k} {env.get(k)}" for k in ("torch", "triton", "cakeconv", "backend", "date", "commit")),
        f"# documents {r0['doc_lengths_unpadded']} (T={args.tokens}), C={args.channels}; slowest rank's medians; "
        f"{args.reps} reps + {args.warmup} warm-up; eager chain {args.chain} x {args.eager_steps}; host cost "
        f"T={r0['host_T']}, C={r0['host_C']} x {args.host_steps}"]

    def cell(v):
        return format(v, ".4g" if abs(v) < 1e4 else ".0f") if isinstance(v, float) else "-" if v is None else v
    for title, keys in TABLES.items():  # markdown tables
        out += ["", title, "| " + " | ".join(keys.split()) + " |", "|" + "---|" * len(keys.split())]
        out += ["| " + " | ".join(str(cell(r[k])) for k in keys.split()) + " |" for r in rows]
    out += [""] + [f"# {r['layout']}: padded to {r['doc_lengths']} (+{r['pad_tokens']} tokens, T={r['T']})"
                   for r in rows if r["pad_tokens"] and r["form"] == "single"]
    out += ["# local = cake_causal_conv1d_det on the rank's S_local rows with ctx.local_cu_seqlens (no exchange); "
            "multi: q, k, v in one KCP call vs three local calls; leak: host time inside the GPU-time span",
            f"# SPEC 7's targets at S_local = 65536 (--tokens {65536 * env['world_size']}), C = 4096: "
            + ", ".join(f"{k} <= {limit:g}" for k, (limit, _) in TARGETS.items())
            + ("; on the CPU (gloo) the times only exercise the pipeline" if env["gpu"] == "cpu" else ""),
            f"# time taken: {elapsed:.1f} s"]
    os.makedirs(os.path.dirname(stem), exist_ok=True)
    write_jsonl(stem + ".jsonl", [{"kind": "env", **env}, *rows])
    write_csv(stem + ".csv", rows, [k for k, v in r0.items()  # the scalar fields
                                    if k != "kind" and not k.endswith("_by_rank") and not isinstance(v, list)])
    with open(stem + "_table.txt", "w") as fh:
        fh.write("\n".join(out) + "\n")
    print("\n".join(out), flush=True)
    log(f"[kcp bench] wrote {stem}.jsonl, .csv, _table.txt; plot: {plot(rows, env, stem + '.png')}")


def run(argv=None) -> list[dict]:
    """The timing rows (every rank; rank 0 writes), in the process group there or its own; ValueError: bad options."""
    args, t_start = parse_args(argv), time.perf_counter()
    device, owns_group, env = setup(args)
    try:
        if dist.get_rank() == 0:
            log(f"[kcp bench] {env['gpu']} x{env['world_size']} ({env['process_group']}): {vars(args)}")
        clock, rows = RankClock(torch, device, flush=True), []
        for layout in args.layouts:
            rows += build_rows(env, args, layout, *run_layout(args, layout, device, clock))
            torch.cuda.empty_cache()  # a no-op without CUDA
        if dist.get_rank() == 0:
            write_outputs(rows, env, args, time.perf_counter() - t_start)
        clock.barrier()
        return rows
    finally:
        if owns_group:
            dist.destroy_process_group()


def main(argv=None) -> int:
    """``--replot RUN.jsonl [--out DIR]``: the run's PNG again (no GPU); else ``run``: 1 if a check failed."""
    args = parse_args(argv)
    if not args.replot:
        return 0 if all(r["bitwise"] for r in run(argv)) else 1
    lines, out = read_jsonl(args.replot), args.out or os.path.dirname(os.path.abspath(args.replot))
    os.makedirs(out, exist_ok=True)
    print(plot([r for r in lines if r.get("kind") == "timing"], next(r for r in lines if r.get("kind") == "env"),
               os.path.join(out, os.path.splitext(os.path.basename(args.replot))[0] + ".png")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
