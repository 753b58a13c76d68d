"""How many Triton kernel variants a model's channel counts compile, today and with runtime row strides (no GPU).

For each group of channel counts C, the training-step variants of ``cakeconv.warmup``'s problem (bf16 x, FP32 taps,
no bias, W = 4, SiLU, int32 cu_seqlens) are derived for sm_90 with Triton's own binder, as the warm-up does. The
row strides are compile-time constants of the kernels today (``SX8``, ``SY8``, ``SDY8``, ``SDX8``, ``SG``: a stride
over 8), so two C of the same launch configuration still compile apart. The second count drops those constants
from each variant's key: what would be left to compile if the strides were runtime integers (Triton would then
specialize them on divisibility by 16, which every C here keeps: C / 8 is a multiple of 16).

    python tools/variant_sharing.py                       # the groups below
    python tools/variant_sharing.py 1024,2048,4352 512    # groups of your own
"""

from __future__ import annotations

import os
import sys

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cakeconv.cake_causal_conv1d_det_train_backend.kernels import launch  # noqa: E402
from cakeconv.cake_causal_conv1d_det_train_backend.kernels.specialization import cuda_target  # noqa: E402
from cakeconv.warmup import WarmupProblem, problem_specializations  # noqa: E402

STRIDES = {"SX8", "SY8", "SDY8", "SDX8", "SG"}
GROUPS = ("512,2048", "1024,1536,2048,2560", "1024,2048,4352", "128,256,512,1024,2048,4096")


def without_strides(fn, spec) -> str:
    """A variant's key with the row-stride constexprs left out."""
    options, signature, constexprs, attrs = spec
    kept = {k: v for k, v in constexprs.items() if fn.arg_names[k[0]] not in STRIDES}
    return repr((sorted(signature.items()), sorted(kept.items()), sorted(attrs.items()),
                 sorted(options.__dict__.items())))


def main(argv) -> None:
    target = cuda_target(90)
    for group in argv or GROUPS:
        channels = [int(c) for c in group.split(",")]
        today, runtime = set(), set()
        for C in channels:
            specs = problem_specializations([WarmupProblem(C)], target)
            today |= set(specs)
            runtime |= {(name, without_strides(launch.KERNEL_FNS[name], spec)) for name, spec in specs.values()}
        print(f"C = {group}: {len(today)} variants compile today, {len(runtime)} with runtime row strides")


if __name__ == "__main__":
    main(sys.argv[1:])
