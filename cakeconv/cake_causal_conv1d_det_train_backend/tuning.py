"""Launch configurations of the Triton kernels (block shapes and warps), keyed on C and dtype.

No choice made here changes a single bit of any result: the forward computes every element with
the same instructions whatever the tile, and the backward's dweight/dbias summation order is fixed
by S alone (see triton_backward.py). ``FWD_CONFIGS`` / ``BWD_CONFIGS`` list every configuration the
heuristics may return, so a test can run them all and compare bits.

Nothing here queries the GPU driver at import time.
"""

from __future__ import annotations

from dataclasses import dataclass

import triton


@dataclass(frozen=True)
class FwdConfig:
    """R sub-runs of SUB rows side by side, BC channels per program, num_warps warps.

    prefetch (0/1): request the next four rows before the current four rows' arithmetic.
    stages: software-pipelining depth of the row loop (1: none; > 1: loads via shared memory).
    """

    R: int
    SUB: int
    BC: int
    num_warps: int
    prefetch: int = 0
    stages: int = 1


@dataclass(frozen=True)
class BwdConfig:
    """R leaves (of triton_backward.BWD_SUB rows) side by side, BC channels, num_warps warps.

    stages: software-pipelining depth of the row loop (1: none; > 1: loads via shared memory).
    prefetch (0/1): request the next step's rows before the current step's arithmetic.
    """

    R: int
    BC: int
    num_warps: int
    stages: int = 1
    prefetch: int = 0


FWD_CONFIGS = (
    FwdConfig(R=16, SUB=16, BC=128, num_warps=4),
    FwdConfig(R=16, SUB=16, BC=128, num_warps=4, prefetch=1),
    FwdConfig(R=8, SUB=32, BC=128, num_warps=4),
    FwdConfig(R=8, SUB=32, BC=128, num_warps=4, prefetch=1),
    FwdConfig(R=8, SUB=16, BC=64, num_warps=2),
    FwdConfig(R=4, SUB=32, BC=256, num_warps=4),
    FwdConfig(R=4, SUB=32, BC=256, num_warps=4, prefetch=1),
    FwdConfig(R=2, SUB=64, BC=512, num_warps=4),
    FwdConfig(R=2, SUB=64, BC=512, num_warps=4, prefetch=1),
    FwdConfig(R=1, SUB=64, BC=1024, num_warps=4),
    FwdConfig(R=1, SUB=64, BC=1024, num_warps=4, prefetch=1),
    FwdConfig(R=1, SUB=128, BC=1024, num_warps=4),
    FwdConfig(R=1, SUB=256, BC=1024, num_warps=4),
    FwdConfig(R=1, SUB=128, BC=1024, num_warps=4, prefetch=1),
    FwdConfig(R=2, SUB=128, BC=512, num_warps=4, prefetch=1),
    # Software-pipelined row loops (cp.async into shared memory; compile_report.py shows it only
    # for 8 elements per thread). Not yet timed on the H200: candidates for the next sweep.
    FwdConfig(R=8, SUB=32, BC=128, num_warps=4, stages=3),
    FwdConfig(R=8, SUB=64, BC=128, num_warps=4, stages=4),
    FwdConfig(R=2, SUB=64, BC=512, num_warps=4, stages=4),
    FwdConfig(R=1, SUB=128, BC=1024, num_warps=4, stages=3),
)

BWD_CONFIGS = (
    BwdConfig(R=16, BC=64, num_warps=4),
    BwdConfig(R=16, BC=64, num_warps=8),
    BwdConfig(R=8, BC=64, num_warps=4),
    BwdConfig(R=8, BC=128, num_warps=4),
    BwdConfig(R=8, BC=128, num_warps=8),
    BwdConfig(R=4, BC=128, num_warps=4),
    BwdConfig(R=4, BC=256, num_warps=4),
    BwdConfig(R=4, BC=256, num_warps=8),
    BwdConfig(R=2, BC=512, num_warps=8),
    BwdConfig(R=8, BC=256, num_warps=8),
    # Prefetch candidates (v3; not yet timed on the H200).
    BwdConfig(R=4, BC=128, num_warps=4, prefetch=1),
    BwdConfig(R=2, BC=128, num_warps=2, prefetch=1),
    BwdConfig(R=4, BC=64, num_warps=2, prefetch=1),
    BwdConfig(R=2, BC=256, num_warps=4, prefetch=1),
    BwdConfig(R=8, BC=128, num_warps=8, prefetch=1),
)

# Small fixed configuration for the CPU interpreter (TRITON_INTERPRET=1): tiny tiles run fastest.
FWD_INTERPRET = FwdConfig(R=2, SUB=8, BC=16, num_warps=1)
BWD_INTERPRET = BwdConfig(R=2, BC=16, num_warps=1)


def pick_fwd_config(C: int, itemsize: int, interpret: bool) -> FwdConfig:
    """Forward configuration for C channels: the fastest of FWD_CONFIGS in the H200 sweep
    (benchmarks/NOTES.md, forward v2) at the nearest measured C."""
    if interpret:
        return FWD_INTERPRET
    if C <= 128:
        return FWD_CONFIGS[1]  # 0.54 of copy bandwidth at C = 128
    if C % 1024 == 0:
        return FWD_CONFIGS[13]  # 0.75-0.76 at C = 2048, 8192
    return FWD_CONFIGS[2]  # 0.65 at C = 512, 0.70 at C = 2048 (128-channel blocks: no idle lanes)


def pick_bwd_config(C: int, itemsize: int, interpret: bool) -> BwdConfig:
    """Backward configuration for C channels: the fastest of BWD_CONFIGS in the H200 sweep
    (benchmarks/NOTES.md, backward v2)."""
    if interpret:
        return BWD_INTERPRET
    if C <= 64:
        return BWD_CONFIGS[2]
    return BWD_CONFIGS[5]  # 0.38 (C = 128), 0.42 (512), 0.51 (2048), 0.52 (8192)


def cdiv(a: int, b: int) -> int:
    return triton.cdiv(a, b)
