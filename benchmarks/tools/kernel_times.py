"""Where the time of one forward / backward call goes, kernel by kernel (GPU, torch.profiler).

For each C: the device time of every kernel the call launches (median over repeats), their sum,
and the call's wall time between CUDA events (the difference is launch gaps). Uses the tuner's
picks and the sweep's document mix (benchmarks/tools/sweep_configs.random_cu).

    python benchmarks/tools/kernel_times.py --C 128,512 --out $OUT
"""

import argparse
import collections
import json
import statistics
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from sweep_configs import random_cu  # benchmarks/tools/ is on sys.path when run as a script

from cakeconv.cake_causal_conv1d_det_train_backend.kernels import launch as triton_launch

REPS = 10


def profile_call(fn, flush):
    """({kernel name: [device ms per call]}, [wall ms per call])."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    walls = []
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REPS):
            flush.zero_()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            walls.append(s.elapsed_time(e))
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
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    rows = []
    S = args.S
    for C in [int(c) for c in args.C.split(",")]:
        cu = random_cu(S, C)
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
            per_kernel, walls = profile_call(fn, flush)
            kern = {k: statistics.median(v) for k, v in per_kernel.items()}
            wall = statistics.median(walls)
            print(f"{name} S={S} C={C} bias={args.bias}: call {wall:.4f} ms, kernels {sum(kern.values()):.4f} ms = "
                  + " + ".join(f"{k} {v:.4f}" for k, v in kern.items()), flush=True)
            rows.append(dict(pass_=name, C=C, S=S, bias=args.bias, wall_ms=wall, kernels_ms=kern))
    if args.out:
        with open(f"{args.out}/kernel_times.jsonl", "w") as f:
            for r in rows:
                r.update(gpu=torch.cuda.get_device_name(), torch=torch.__version__)
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
