"""Where the time of one forward / backward call goes, kernel by kernel (GPU, torch.profiler).

For each C: the device time of every kernel the call launches (median over repeats), their sum,
and the call's wall time between CUDA events (the difference is launch gaps), and the main
kernel's time against the pass's byte floor at the copy bandwidth measured in the same run. Uses
the tuner's picks and the sweep's document mix (benchmarks/op.py: sweep_cu), or
``--doc-mix`` (the benchmark's mixes, e.g. ``seed``, ``uniform:1-8``; several, comma-separated).

    python tools/kernel_times.py --C 128,512 --out $OUT
    python tools/kernel_times.py --C 128,512,2048 --bias no --doc-mix seed,uniform:1-8 --out $OUT
"""

import argparse
import collections
import json
import os
import statistics
import sys

import torch
from torch.profiler import ProfilerActivity, profile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.append(REPO)  # the benchmarks package; after PYTHONPATH, where an A/B puts another cakeconv
from benchmarks.op import FLOOR_FACTOR, mix_cu, sweep_cu  # noqa: E402
from benchmarks.report import run_environment  # noqa: E402
from benchmarks.timing import HOST_AHEAD_MIN_US, DeviceClock, copy_bandwidth  # noqa: E402

from cakeconv.cake_causal_conv1d_det_train_backend.kernels import launch as triton_launch  # noqa: E402

REPS = 10


def profile_call(fn, clock):
    """({kernel name: [device ms per call]}, [wall ms per call]); the host is queued ahead of each
    call and the L2 evicted (benchmarks/timing.py), so the wall time holds the GPU's gaps, not the host's."""
    for _ in range(3):
        fn()
    clock.sync()
    walls = []
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REPS):
            clock.before_call(HOST_AHEAD_MIN_US)
            m0 = clock.mark()
            fn()
            m1 = clock.mark()
            clock.sync()
            walls.append(clock.elapsed_ms(m0, m1))
    per_kernel = collections.defaultdict(list)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA and "cake_conv" in ev.name:
            per_kernel[ev.name].append(ev.time_range.elapsed_us() / 1e3)
    return per_kernel, walls


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--C", default="128,512")
    ap.add_argument("--S", type=int, default=250340)
    ap.add_argument("--bias", choices=("yes", "no"), default="yes")
    ap.add_argument("--doc-mix", default=None, help="benchmark mixes, comma-separated (default: the sweep's)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dev = torch.device("cuda")
    clock = DeviceClock(torch, dev, flush=True)
    copy_gbs, _ = copy_bandwidth(torch, clock, 2 * 2**30, 10, 0.0)  # the benchmark's copy (2 GiB), so fractions compare
    env = run_environment(torch, dev, "cpu")
    print(f"copy bandwidth {copy_gbs:.0f} GB/s | {env['gpu']} | torch {env['torch']} | triton {env['triton']} | "
          f"commit {env['commit']} | {env['date']}", flush=True)
    rows = []
    S = args.S
    mixes = [None] if args.doc_mix is None else args.doc_mix.split(",")
    for mix, C in [(m, int(c)) for m in mixes for c in args.C.split(",")]:
        cu = sweep_cu(S, C) if mix is None else mix_cu(S, mix, seed=C)
        x = torch.randn(S, C, device="cuda").bfloat16()
        dy = torch.randn(S, C, device="cuda").bfloat16()
        y, dx = torch.empty_like(x), torch.empty_like(x)
        w = torch.randn(C, 4, device="cuda")
        b = torch.randn(C, device="cuda") if args.bias == "yes" else None
        ws = torch.empty(triton_launch.backward_workspace_floats(S, C), device="cuda")
        dw = torch.empty(C, 4, device="cuda")
        db = torch.empty(C, device="cuda") if b is not None else None
        calls = {"fwd": lambda: triton_launch.triton_forward(x, w, b, cu, None, y),
                 "bwd": lambda: triton_launch.triton_backward(dy, x, w, b, cu, None, dx, ws, dw, db)}
        for name, fn in calls.items():
            per_kernel, walls = profile_call(fn, clock)
            kern = {k: statistics.median(v) for k, v in per_kernel.items()}
            wall = statistics.median(walls)
            floor_ms = FLOOR_FACTOR[name] * S * C * x.element_size() / (copy_gbs * 1e6)  # the pass's bytes at the copy rate
            main_ms = max(kern.values()) if kern else float("nan")
            print(f"{name} {mix or 'sweep mix'} ({cu.numel() - 1} documents) S={S} C={C} bias={args.bias}: call "
                  f"{wall:.4f} ms, kernels {sum(kern.values()):.4f} ms = "
                  + " + ".join(f"{k} {v:.4f}" for k, v in kern.items())
                  + f"; floor {floor_ms:.4f} ms: main kernel {floor_ms / main_ms:.3f}, call {floor_ms / wall:.3f}",
                  flush=True)
            rows.append(dict(pass_=name, mix=mix, C=C, S=S, bias=args.bias, wall_ms=wall, kernels_ms=kern,
                             floor_ms=floor_ms, copy_gbs=copy_gbs))
    if args.out:
        with open(f"{args.out}/kernel_times.jsonl", "w") as f:
            for r in rows:
                r.update({k: env[k] for k in ("gpu", "torch", "triton", "date", "commit")})
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
