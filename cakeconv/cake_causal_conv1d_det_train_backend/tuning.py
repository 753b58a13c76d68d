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

    stages: software-pipelining depth of the row loop (1: none; > 1: loads via shared memory).
    """

    R: int
    SUB: int
    BC: int
    num_warps: int
    stages: int = 1


@dataclass(frozen=True)
class BwdConfig:
    """R leaves (of triton_backward.BWD_SUB rows) side by side, BC channels, num_warps warps.

    stages: software-pipelining depth of the row loop (1: none; > 1: loads via shared memory).
    maxnreg: register cap per thread (None: the compiler's choice); 128 keeps four 4-warp programs
    per SM where the compiler would take 145 registers and leave room for three.
    """

    R: int
    BC: int
    num_warps: int
    stages: int = 1
    maxnreg: int | None = None

    def launch_options(self) -> dict:
        """Extra keyword arguments of the kernel launch."""
        return {} if self.maxnreg is None else {"maxnreg": self.maxnreg}


FWD_CONFIGS = (
    # v2 (no software pipelining): the reference of the v3 sweep.
    FwdConfig(R=8, SUB=32, BC=128, num_warps=4),
    # v3: software-pipelined row loops (cp.async into shared memory, `stages` deep).
    FwdConfig(R=8, SUB=32, BC=128, num_warps=4, stages=3),
    FwdConfig(R=8, SUB=32, BC=128, num_warps=4, stages=4),
    FwdConfig(R=8, SUB=64, BC=128, num_warps=4, stages=4),
    FwdConfig(R=2, SUB=64, BC=512, num_warps=4, stages=4),
    FwdConfig(R=1, SUB=128, BC=1024, num_warps=4, stages=3),
    FwdConfig(R=4, SUB=64, BC=256, num_warps=4, stages=4),
)

BWD_CONFIGS = (
    # v2 (not pipelined): the reference of the v4 sweep.
    BwdConfig(R=4, BC=128, num_warps=4),
    # v4: software-pipelined row loops (loads through shared memory with cp.async, `stages` deep).
    BwdConfig(R=4, BC=128, num_warps=4, stages=2),
    BwdConfig(R=4, BC=128, num_warps=4, stages=3),
    BwdConfig(R=4, BC=128, num_warps=4, stages=4),
    BwdConfig(R=8, BC=64, num_warps=4, stages=3),
    BwdConfig(R=2, BC=128, num_warps=2, stages=3),
    BwdConfig(R=8, BC=128, num_warps=4, stages=3),
    # v6 (constant strides: 145 registers at R=4, BC=128): the same tiles capped at 128 registers.
    BwdConfig(R=4, BC=128, num_warps=4, stages=3, maxnreg=128),
    BwdConfig(R=4, BC=128, num_warps=4, stages=4, maxnreg=128),
    BwdConfig(R=2, BC=256, num_warps=4, stages=3, maxnreg=128),
)

# Small fixed configuration for the CPU interpreter (TRITON_INTERPRET=1): tiny tiles run fastest.
FWD_INTERPRET = FwdConfig(R=2, SUB=8, BC=16, num_warps=1)
BWD_INTERPRET = BwdConfig(R=2, BC=16, num_warps=1)


_FWD_SMALL = FwdConfig(R=8, SUB=32, BC=128, num_warps=4, stages=4)
_FWD_MID = FwdConfig(R=8, SUB=64, BC=128, num_warps=4, stages=4)
_FWD_WIDE = FwdConfig(R=1, SUB=128, BC=1024, num_warps=4, stages=3)
_BWD_TINY = BwdConfig(R=8, BC=64, num_warps=4, stages=3)
_BWD_SMALL = BwdConfig(R=8, BC=128, num_warps=4, stages=3)
_BWD_MID = BwdConfig(R=4, BC=128, num_warps=4, stages=3)
_BWD_WIDE = BwdConfig(R=4, BC=128, num_warps=4, stages=4)


def pick_fwd_config(C: int, itemsize: int, interpret: bool) -> FwdConfig:
    """Forward configuration for C channels: the fastest of FWD_CONFIGS in the H200 sweep
    (benchmarks/NOTES.md, forward v3) at the nearest measured C."""
    if interpret:
        return FWD_INTERPRET
    if C <= 512:
        return _FWD_SMALL  # 0.54 of copy bandwidth at C = 128, 0.78 at 512
    if C >= 4096 and C % 1024 == 0:
        return _FWD_WIDE  # 0.88 at C = 8192
    return _FWD_MID  # 0.85 at C = 2048 and 8192 (128-channel blocks: no idle lanes at any C % 128)


def pick_bwd_config(C: int, itemsize: int, interpret: bool) -> BwdConfig:
    """Backward configuration for C channels: the fastest of BWD_CONFIGS in the H200 sweep
    (benchmarks/NOTES.md, backward v4)."""
    if interpret:
        return BWD_INTERPRET
    if C <= 64:
        return _BWD_TINY
    if C <= 128:
        return _BWD_SMALL  # 0.40 at C = 128
    if C <= 1024:
        return _BWD_MID  # 0.60 at C = 512
    return _BWD_WIDE  # 0.61 at C = 2048, 0.66 at 8192


def cdiv(a: int, b: int) -> int:
    return triton.cdiv(a, b)
