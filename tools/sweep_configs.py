"""Time every candidate launch configuration of the Triton kernels (GPU), to choose tuning.py's.

Prints, per (pass, C, config): median ms over cold-L2 calls, the host queued ahead (benchmarks/timing.py),
and the fraction of the copy bandwidth measured in the same run (floor bytes: forward 4*S*C, backward
6*S*C for bf16). Writes a JSON-lines file, a row per configuration with the run's GPU, versions, date
and commit, when --out is given: each row as it is measured, so a run cut by a time limit keeps its rows.

    python tools/sweep_configs.py --C 128,512,2048,8192 --out $OUT
    python tools/sweep_configs.py --C 128,256 --doc-mix seed \
        --extra "bwd:R=2,BC=128,num_warps=2,stages=4,maxnreg=128" --out $OUT
    python tools/sweep_configs.py --C 512,2048 --width 8 --activation none --doc-mix uniform:1-64

``--extra`` adds configurations that tuning.py does not list (``fwd:`` or ``bwd:`` then the
dataclass fields, several separated by ``;``), to try one before it becomes a candidate. ``--quick``
adds the kernels' quick twins (compile_ahead.py: what the first steps run while the full kernels
compile), one row per pass and C named ``quick``.
"""

import argparse
import json
import os
import statistics
import sys

import torch
import triton

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.append(REPO)  # the benchmarks package; after PYTHONPATH, where an A/B puts another cakeconv
from benchmarks.op import mix_cu, sweep_cu  # noqa: E402
from benchmarks.report import run_environment, write_jsonl  # noqa: E402
from benchmarks.timing import HOST_AHEAD_MIN_US, DeviceClock, copy_bandwidth  # noqa: E402

from cakeconv.cake_causal_conv1d_det_train_backend.kernels import launch as triton_launch, tuning  # noqa: E402


def fwd_candidates(C):
    return [c for c in tuning.FWD_CONFIGS if c.BC <= max(64, triton.next_power_of_2(C))]


def bwd_candidates(C):
    return [c for c in tuning.BWD_CONFIGS if c.BC <= max(64, triton.next_power_of_2(C))]


def parse_extra(text):
    """{"fwd": [FwdConfig...], "bwd": [BwdConfig...]} from "fwd:R=8,SUB=16,BC=128,num_warps=4;bwd:R=2,..."."""
    out = {"fwd": [], "bwd": []}
    for item in filter(None, (t.strip() for t in (text or "").split(";"))):
        kind, _, fields = item.partition(":")
        if kind not in out:
            raise ValueError(f"--extra: {item!r} must start with fwd: or bwd:")
        kw = {}
        for f in fields.split(","):
            k, _, v = f.partition("=")
            kw[k.strip()] = v.strip() == "True" if v.strip() in ("True", "False") else (None if v.strip() == "None" else int(v))
        out[kind].append((tuning.FwdConfig if kind == "fwd" else tuning.BwdConfig)(**kw))
    return out


def time_calls(clock, fn_list, reps):
    """Median ms of fn_list[i % len] over reps calls (3 more first, dropped), one at a time, each after the
    host-ahead sleep and the L2 eviction (timing.py): a call's launch set-up is host time that must not
    land inside the span."""
    ts = []
    for i in range(reps + 3):
        fn = fn_list[i % len(fn_list)]
        clock.before_call(HOST_AHEAD_MIN_US)
        m0 = clock.mark()
        fn()
        m1 = clock.mark()
        clock.sync()
        if i >= 3:
            ts.append(clock.elapsed_ms(m0, m1))
    return statistics.median(ts)


def quick_calls(pass_, sets, inputs, cu, S, act):
    """The calls of the pass's quick twins, one per input set (triton_forward / triton_backward with
    ``quick=True`` launches)."""
    w, b, ws, dw, db = inputs
    x = sets[0][0]
    meta = triton_launch.optional_meta(b, cu)
    if pass_ == "fwd":
        launch = triton_launch.prepare_forward(S, x.shape[1], x.stride(0), x.stride(0), x.dtype, w.dtype, *meta, None,
                                               width=w.shape[1], activation=act, quick=True)
        return [lambda s=s: launch.run(s[0], w, b, cu, s[2]) for s in sets]
    launch = triton_launch.prepare_backward(S, x.shape[1], x.stride(0), x.stride(0), x.stride(0), x.dtype, x.dtype,
                                            w.dtype, *meta, None, dw.dtype, width=w.shape[1], activation=act,
                                            quick=True)
    return [lambda s=s: launch.run(s[1], s[0], w, b, cu, s[3], ws, dw, db) for s in sets]


def sweep_pass(pass_, C, picks, sets, inputs, cu, args, clock, bw, record):
    """Time every configuration of ``picks`` for one pass at one C; one row each, printed and given to
    ``record`` as soon as it is measured (a run cut short keeps the rows it measured)."""
    S = args.S
    w, b, ws, dw, db = inputs
    act = None if args.activation == "none" else args.activation
    for cfg in picks:
        if cfg == "quick":
            fns = quick_calls(pass_, sets, inputs, cu, S, act)
        elif pass_ == "fwd":
            fns = [lambda s=s: triton_launch.triton_forward(s[0], w, b, cu, None, s[2], config=cfg, activation=act)
                   for s in sets]
        else:
            fns = [lambda s=s: triton_launch.triton_backward(s[1], s[0], w, b, cu, None, s[3], ws, dw, db, config=cfg,
                                                             activation=act)
                   for s in sets]
        ms = time_calls(clock, fns, args.reps)
        frac = (4 if pass_ == "fwd" else 6) * S * C / ms / 1e6 / bw
        record(dict(pass_=pass_, C=C, cfg=str(cfg), ms=ms, frac=frac, mean_doc=args.mean_doc,
                    doc_mix=args.doc_mix, n_docs=cu.numel() - 1, bias=args.bias, width=args.width,
                    activation=args.activation))
        print(f"{pass_} W={args.width} {args.activation} C={C:5d} {cfg}: {ms:.4f} ms  {frac:.3f}", flush=True)


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--C", default="128,512,2048,8192")
    ap.add_argument("--S", type=int, default=250340)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--out", default=None, help="output folder (made if missing): one .jsonl a run, named by the width, "
                    "activation, bias and document mix")
    ap.add_argument("--passes", default="fwd,bwd")
    ap.add_argument("--picks", action="store_true",
                    help="only the configuration tuning.py picks for each C (to compare code versions in one run; "
                         "with --extra: the pick and --extra's configurations)")
    ap.add_argument("--mean-doc", type=int, default=3000,
                    help="mean document length (uniform in 1..2*mean); larger than S: one document, no masked programs")
    ap.add_argument("--doc-mix", default=None,
                    help="one of the benchmark's document mixes (e.g. seed, uniform:1-8) instead of --mean-doc")
    ap.add_argument("--extra", default=None,
                    help='configurations to add, e.g. "fwd:R=8,SUB=16,BC=128,num_warps=4,stages=4,maxnreg=128;bwd:R=2,BC=128,num_warps=2"')
    ap.add_argument("--bias", choices=("yes", "no"), default="yes")
    ap.add_argument("--width", type=int, default=4, help="taps W (2..8)")
    ap.add_argument("--activation", choices=("silu", "none"), default="silu")
    ap.add_argument("--quick", action="store_true", help="also the quick twins (module docstring)")
    ap.add_argument("--shard", default="0/1", metavar="I/N",
                    help="only every N-th configuration from the I-th (compile warm-ups in N processes)")
    return ap.parse_args()


def candidates(pass_, C, args, extra, has_bias):
    """The configurations of one pass at C: the tuner's pick (--picks) or every candidate and --extra's;
    this process's shard of them."""
    shard, n_shards = (int(v) for v in args.shard.split("/"))
    if pass_ == "fwd":
        picks = ([tuning.pick_fwd_config(C, 2, False, width=args.width)] if args.picks else fwd_candidates(C)) + extra["fwd"]
    else:
        picks = ([tuning.pick_bwd_config(C, 2, False, has_bias=has_bias, width=args.width)] if args.picks
                 else bwd_candidates(C)) + extra["bwd"]
    return (picks + ["quick"] * args.quick)[shard::n_shards]


def main():
    args = parse_args()
    extra = parse_extra(args.extra)
    device = torch.device("cuda")
    clock = DeviceClock(torch, device, flush=True)
    bw, _ = copy_bandwidth(torch, clock, 1 << 30, 10, HOST_AHEAD_MIN_US)
    env = run_environment(torch, device, "cpu")
    print(f"# {env['gpu']} copy bandwidth {bw:.0f} GB/s | torch {env['torch']} | triton {env['triton']} | "
          f"commit {env['commit']} | {env['date']}", flush=True)
    rows = []
    S = args.S
    out = None
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        mix = (args.doc_mix or f"mean{args.mean_doc}").replace(":", "_")
        out = os.path.join(args.out, f"sweep_configs_W{args.width}_{args.activation}_bias-{args.bias}_{mix}.jsonl")
        write_jsonl(out, [])

    def record(r):  # appended as measured, as benchmarks.op's partial rows are
        rows.append(r)
        if out is not None:
            with open(out, "a") as f:
                f.write(json.dumps({**r, **{k: env[k] for k in ("gpu", "torch", "triton", "date", "commit")},
                                    "copy_gbps": bw, "S": S}) + "\n")

    for C in [int(c) for c in args.C.split(",")]:
        cu = mix_cu(S, args.doc_mix, seed=C) if args.doc_mix else sweep_cu(S, C, args.mean_doc)
        sets = []
        for _ in range(3):
            x = torch.randn(S, C, device="cuda").bfloat16()
            dy = torch.randn(S, C, device="cuda").bfloat16()
            sets.append((x, dy, torch.empty_like(x), torch.empty_like(x)))
        w = torch.randn(C, args.width, device="cuda")
        b = torch.randn(C, device="cuda") if args.bias == "yes" else None
        ws = torch.empty(triton_launch.backward_workspace_floats(S, C, args.width), device="cuda")
        dw = torch.empty(C, args.width, device="cuda")
        db = torch.empty(C, device="cuda") if b is not None else None
        for pass_ in ("fwd", "bwd"):
            if pass_ in args.passes:
                picks = candidates(pass_, C, args, extra, b is not None)
                sweep_pass(pass_, C, picks, sets, (w, b, ws, dw, db), cu, args, clock, bw, record)
        del sets
    print("\n# best per (pass, C)")
    for p in ("fwd", "bwd"):
        for C in sorted({r["C"] for r in rows}):
            cand = [r for r in rows if r["pass_"] == p and r["C"] == C]
            if cand:
                best = min(cand, key=lambda r: r["ms"])
                print(f"{p} C={C:5d} best {best['cfg']} {best['ms']:.4f} ms frac {best['frac']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
