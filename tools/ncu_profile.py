"""Run each Triton kernel of interest once, for Nsight Compute (ncu) to read its counters (GPU).

    ncu --clock-control none -k regex:cake_conv --section SpeedOfLight ... \\
        python tools/ncu_profile.py --C 512

Launches, per C: the forward and the backward with the tuner's picks, plus a device-to-device copy
of the same bytes. The counters are ncu's output; this script only launches. ``--doc-mix`` takes a
mix of the benchmark (e.g. ``uniform:1-8``, ``ones``); without it, the sweep's document lengths
(benchmarks/op.py: sweep_cu). ``--width`` and ``--activation`` pick the taps' width and the
activation (the picks of that width). The stalls of the short-document backward at W = 8 + SiLU:

    ncu --clock-control none -k regex:cake_conv_bwd_kernel --section WarpStateStats --section SchedulerStats \\
        python tools/ncu_profile.py --C 512 --bias no --width 8 --doc-mix uniform:1-64
"""

import argparse
import os
import sys

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.append(REPO)  # the benchmarks package; after PYTHONPATH, where an A/B puts another cakeconv
from benchmarks.op import mix_cu, sweep_cu  # noqa: E402
from benchmarks.report import run_environment  # noqa: E402

from cakeconv.cake_causal_conv1d_det_train_backend.kernels import launch as triton_launch, tuning  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--C", default="512")
    ap.add_argument("--S", type=int, default=250340)
    ap.add_argument("--bias", choices=("yes", "no"), default="yes")
    ap.add_argument("--doc-mix", default=None, help="a benchmark mix, e.g. uniform:1-8 (default: the sweep's)")
    ap.add_argument("--width", type=int, default=4, help="taps W (2..8)")
    ap.add_argument("--activation", choices=("silu", "none"), default="silu")
    args = ap.parse_args()
    env = run_environment(torch, torch.device("cuda"), "cpu")
    print(f"# {env['gpu']} | torch {env['torch']} | triton {env['triton']} | commit {env['commit']} | {env['date']}",
          flush=True)
    S, W, act = args.S, args.width, None if args.activation == "none" else args.activation
    for C in [int(c) for c in args.C.split(",")]:
        x = torch.randn(S, C, device="cuda").bfloat16()
        dy = torch.randn(S, C, device="cuda").bfloat16()
        y, dx = torch.empty_like(x), torch.empty_like(x)
        w = torch.randn(C, W, device="cuda")
        b = torch.randn(C, device="cuda") if args.bias == "yes" else None
        cu = sweep_cu(S, C) if args.doc_mix is None else mix_cu(S, args.doc_mix, seed=C)
        print(f"C={C} documents {cu.numel() - 1} ({args.doc_mix or 'sweep mix'})", flush=True)
        ws = torch.empty(triton_launch.backward_workspace_floats(S, C, W), device="cuda")
        dw = torch.empty(C, W, device="cuda")
        db = torch.empty(C, device="cuda") if b is not None else None
        cfg = tuning.pick_fwd_config(C, 2, False, width=W)
        print(f"C={C} W={W} {args.activation} bias={args.bias} forward {cfg}", flush=True)
        triton_launch.triton_forward(x, w, b, cu, None, y, config=cfg, activation=act)
        cfg = tuning.pick_bwd_config(C, 2, False, has_bias=b is not None, width=W)
        print(f"C={C} W={W} {args.activation} bias={args.bias} backward {cfg}", flush=True)
        triton_launch.triton_backward(dy, x, w, b, cu, None, dx, ws, dw, db, config=cfg, activation=act)
        y.copy_(x)
        torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
