"""Time every candidate launch configuration of the Triton kernels (GPU), to choose tuning.py's.

Prints, per (pass, C, config): median ms over cold-L2 calls and the fraction of the copy bandwidth
measured in the same run (floor bytes: forward 4*S*C, backward 6*S*C for bf16). Writes a JSON-lines
file per row when --out is given.

    python benchmarks/tools/sweep_configs.py --C 128,512,2048,8192 --out $OUT
    python benchmarks/tools/sweep_configs.py --C 128,256 --doc-mix seed \
        --extra "bwd:R=2,BC=128,num_warps=2,stages=4,maxnreg=128" --out $OUT

``--extra`` adds configurations that tuning.py does not list (``fwd:`` or ``bwd:`` then the
dataclass fields, several separated by ``;``), to try one before it becomes a candidate.
"""

import argparse
import datetime
import json
import statistics
import sys

import torch
import triton

from cakeconv.cake_causal_conv1d_det_train_backend.kernels import launch as triton_launch, tuning


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


def random_cu(S, seed, mean=3000):
    """cu_seqlens of documents with lengths uniform in 1..2*mean-1 (one document if mean >= S)."""
    g = torch.Generator().manual_seed(seed)
    cuts = [0]
    while cuts[-1] < S:
        step = S if mean >= S else int(torch.randint(1, 2 * mean, (), generator=g))
        cuts.append(min(S, cuts[-1] + step))
    return torch.tensor(cuts, dtype=torch.int32, device="cuda")


HOST_AHEAD_CYCLES = 1_000_000  # ~0.5 ms at the H200's 1.98 GHz: the host queues the whole call before the GPU reaches it


def l2_flush_buffer():
    """The 256 MiB buffer whose read (``evict_l2``) empties the L2 before a timed call."""
    return torch.empty(256 * 2**20 // 4, dtype=torch.float32, device="cuda").normal_()


def evict_l2(flush):
    """Evict the L2 by READING ``flush``, as the benchmark does. (Until session 20 this wrote it,
    ``flush.zero_()``: the L2 then held dirty lines that the timed call wrote back to DRAM, which
    made the C = 128 backward 91 us here against 71.5 us in the benchmark, and ranked configurations
    differently: a 128-row backward came out 10% faster here and 7.6% slower in the benchmark.)"""
    flush.sum()


def time_calls(fn_list, reps, flush):
    """Median ms of fn_list[i % len] over reps calls, each after an L2 eviction, the host queued
    ahead (a call's launch set-up is host time that must not land inside the span)."""
    ts = []
    for i in range(reps + 3):
        evict_l2(flush)
        torch.cuda._sleep(HOST_AHEAD_CYCLES)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        fn = fn_list[i % len(fn_list)]
        s.record()
        fn()
        e.record()
        e.synchronize()
        if i >= 3:
            ts.append(s.elapsed_time(e))
    return statistics.median(ts)


def copy_bandwidth(flush):
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    ms = time_calls([lambda: b.copy_(a)], 10, flush)
    del a, b
    return 2 * n / ms / 1e6  # GB/s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--C", default="128,512,2048,8192")
    ap.add_argument("--S", type=int, default=250340)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--out", default=None)
    ap.add_argument("--passes", default="fwd,bwd")
    ap.add_argument("--picks", action="store_true",
                    help="only the configuration tuning.py picks for each C (to compare code versions in one run)")
    ap.add_argument("--mean-doc", type=int, default=3000,
                    help="mean document length (uniform in 1..2*mean); larger than S: one document, no masked programs")
    ap.add_argument("--doc-mix", default=None,
                    help="one of the benchmark's document mixes (e.g. seed, uniform:1-8) instead of --mean-doc")
    ap.add_argument("--extra", default=None,
                    help='configurations to add, e.g. "fwd:R=8,SUB=16,BC=128,num_warps=4,stages=4,maxnreg=128;bwd:R=2,BC=128,num_warps=2"')
    ap.add_argument("--bias", choices=("yes", "no"), default="yes")
    ap.add_argument("--shard", default="0/1", metavar="I/N",
                    help="only every N-th configuration from the I-th (compile warm-ups in N processes)")
    args = ap.parse_args()
    shard, n_shards = (int(v) for v in args.shard.split("/"))
    extra = parse_extra(args.extra)
    flush = l2_flush_buffer()
    bw = copy_bandwidth(flush)
    print(f"# {torch.cuda.get_device_name()} copy bandwidth {bw:.0f} GB/s", flush=True)
    rows = []
    S = args.S
    for C in [int(c) for c in args.C.split(",")]:
        if args.doc_mix:
            # here, not at the top: ncu_profile imports this module (benchmarks/tools/ is on sys.path as a script)
            from ncu_profile import mix_cu
            cu = mix_cu(S, args.doc_mix, seed=C)
        else:
            cu = random_cu(S, C, args.mean_doc)
        sets = []
        for k in range(3):
            x = torch.randn(S, C, device="cuda").bfloat16()
            dy = torch.randn(S, C, device="cuda").bfloat16()
            sets.append((x, dy, torch.empty_like(x), torch.empty_like(x)))
        w = torch.randn(C, 4, device="cuda")
        b = torch.randn(C, device="cuda") if args.bias == "yes" else None
        ws = torch.empty(triton_launch.backward_workspace_floats(S, C), device="cuda")
        dw = torch.empty(C, 4, device="cuda")
        db = torch.empty(C, device="cuda") if b is not None else None
        if "fwd" in args.passes:
            picks = [tuning.pick_fwd_config(C, 2, False)] if args.picks else fwd_candidates(C) + extra["fwd"]
            picks = picks[shard::n_shards]
            for cfg in picks:
                fns = [lambda s=s: triton_launch.triton_forward(s[0], w, b, cu, None, s[2], config=cfg) for s in sets]
                ms = time_calls(fns, args.reps, flush)
                frac = 4 * S * C / ms / 1e6 / bw
                rows.append(dict(pass_="fwd", C=C, cfg=str(cfg), ms=ms, frac=frac, mean_doc=args.mean_doc,
                                 doc_mix=args.doc_mix, n_docs=cu.numel() - 1, bias=args.bias))
                print(f"fwd C={C:5d} {cfg}: {ms:.4f} ms  {frac:.3f}", flush=True)
        if "bwd" in args.passes:
            picks = [tuning.pick_bwd_config(C, 2, False, has_bias=b is not None)] if args.picks else bwd_candidates(C) + extra["bwd"]
            picks = picks[shard::n_shards]
            for cfg in picks:
                fns = [lambda s=s: triton_launch.triton_backward(s[1], s[0], w, b, cu, None, s[3], ws, dw, db, config=cfg) for s in sets]
                ms = time_calls(fns, args.reps, flush)
                frac = 6 * S * C / ms / 1e6 / bw
                rows.append(dict(pass_="bwd", C=C, cfg=str(cfg), ms=ms, frac=frac, mean_doc=args.mean_doc,
                                 doc_mix=args.doc_mix, n_docs=cu.numel() - 1, bias=args.bias))
                print(f"bwd C={C:5d} {cfg}: {ms:.4f} ms  {frac:.3f}", flush=True)
        del sets
    print("\n# best per (pass, C)")
    for p in ("fwd", "bwd"):
        for C in sorted({r["C"] for r in rows}):
            cand = [r for r in rows if r["pass_"] == p and r["C"] == C]
            if cand:
                best = min(cand, key=lambda r: r["ms"])
                print(f"{p} C={C:5d} best {best['cfg']} {best['ms']:.4f} ms frac {best['frac']:.3f}")
    if args.out:
        stamp = datetime.datetime.now(datetime.timezone.utc).isoformat()
        with open(f"{args.out}/sweep_configs.jsonl", "w") as f:
            for r in rows:
                r.update(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                         date=stamp, copy_gbps=bw, S=S)
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
