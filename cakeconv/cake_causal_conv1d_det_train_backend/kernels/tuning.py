"""Launch configurations of the Triton kernels (block shapes and warps), keyed on C and dtype.

No choice made here changes a single bit of any result: the forward computes every element with
the same instructions whatever the tile, and the backward's dweight/dbias summation order is fixed
by S and W alone (see triton_backward.py). ``FWD_CONFIGS`` / ``BWD_CONFIGS`` list every configuration the
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
    maxnreg: register cap per thread (None: the compiler's choice). 128 keeps four 4-warp programs
    per SM (65536 registers / (128 threads * 128)); a few registers more would leave room for three.
    """

    R: int
    SUB: int
    BC: int
    num_warps: int
    stages: int = 1
    maxnreg: int | None = None


@dataclass(frozen=True)
class BwdConfig:
    """R leaves (of launch.leaf_tree(W)'s rows) side by side, BC channels, num_warps warps.

    stages and maxnreg: as for FwdConfig. step_branch: in masked programs of few segments (and at
    W = 5 + SiLU in those of many), the row steps away from every boundary take the unmasked loop
    body (triton_backward._bwd_run).
    """

    R: int
    BC: int
    num_warps: int
    stages: int = 1
    maxnreg: int | None = None
    step_branch: bool = False


def launch_options(cfg: FwdConfig | BwdConfig) -> dict:
    """Extra keyword arguments of a kernel launch with configuration cfg."""
    return {} if cfg.maxnreg is None else {"maxnreg": cfg.maxnreg}


# Every configuration a heuristic below may return, and the candidates of the configuration sweeps
# (the losers of earlier sweeps on the H200 are dropped).
FWD_CONFIGS = (
    FwdConfig(R=8, SUB=32, BC=128, num_warps=4, stages=3, maxnreg=128),
    FwdConfig(R=8, SUB=32, BC=128, num_warps=4, stages=4, maxnreg=128),
    FwdConfig(R=8, SUB=64, BC=128, num_warps=4, stages=4, maxnreg=128),
    FwdConfig(R=4, SUB=32, BC=128, num_warps=4, stages=4, maxnreg=128),
    FwdConfig(R=2, SUB=64, BC=512, num_warps=4, stages=4, maxnreg=128),
    FwdConfig(R=1, SUB=128, BC=1024, num_warps=4, stages=3, maxnreg=128),
    FwdConfig(R=4, SUB=64, BC=128, num_warps=4, stages=3, maxnreg=128),
    # A candidate for C >= 512 up to W = 5, in place of R = 8, SUB = 32 (C = 512) and R = 8, SUB = 64 (C = 2048): one
    # H100, forward kernel alone, no bias, seed and uniform 1-64 documents, two rounds (tools/sweep_configs.py,
    # results/h100_tables.txt): 2.0-4.0% faster in 11 of 12 (W, activation, mix, C) cases at W = 4 and 5, 0.4%
    # slower at W = 5 + SiLU on 1-64 documents at C = 2048. Not picked yet: this configuration has not run the GPU
    # bits test (tests/test_gpu.py, every configuration against the pick) nor the whole calls.
    FwdConfig(R=4, SUB=32, BC=128, num_warps=4, stages=3, maxnreg=128),
)

BWD_CONFIGS = (
    BwdConfig(R=4, BC=128, num_warps=4, stages=3),
    BwdConfig(R=4, BC=128, num_warps=4, stages=4),
    BwdConfig(R=8, BC=64, num_warps=4, stages=3),
    BwdConfig(R=2, BC=128, num_warps=2, stages=3),
    BwdConfig(R=4, BC=128, num_warps=4, stages=3, maxnreg=128),
    BwdConfig(R=4, BC=128, num_warps=4, stages=4, maxnreg=128),
    BwdConfig(R=8, BC=64, num_warps=4, stages=4, maxnreg=128),
    BwdConfig(R=4, BC=128, num_warps=4, stages=4, maxnreg=128, step_branch=True),
    BwdConfig(R=4, BC=128, num_warps=4, stages=4, maxnreg=168, step_branch=True),
    BwdConfig(R=2, BC=128, num_warps=4, stages=4, maxnreg=128),
    BwdConfig(R=2, BC=128, num_warps=4, stages=4, maxnreg=128, step_branch=True),
)

# Small fixed configuration for the CPU interpreter (TRITON_INTERPRET=1): tiny tiles run fastest.
FWD_INTERPRET = FwdConfig(R=2, SUB=8, BC=16, num_warps=1)
BWD_INTERPRET = BwdConfig(R=2, BC=16, num_warps=1, step_branch=True)  # the branching loop: its bits are tested


_FWD_SMALL = FwdConfig(R=8, SUB=32, BC=128, num_warps=4, stages=4, maxnreg=128)
_FWD_MID = FwdConfig(R=8, SUB=64, BC=128, num_warps=4, stages=4, maxnreg=128)
_FWD_WIDE = FwdConfig(R=1, SUB=128, BC=1024, num_warps=4, stages=3, maxnreg=128)
_FWD_ODD = FwdConfig(R=4, SUB=32, BC=128, num_warps=4, stages=4, maxnreg=128)
_BWD_TINY = BwdConfig(R=8, BC=64, num_warps=4, stages=3)
_BWD = BwdConfig(R=4, BC=128, num_warps=4, stages=4, maxnreg=128)
_BWD_BRANCH = BwdConfig(R=4, BC=128, num_warps=4, stages=4, maxnreg=128, step_branch=True)
# Without bias, W <= 5: a cap of 168 registers (three 4-warp programs per SM instead of four) leaves the
# many-segment loops without spills. Backward alone on one H100, 1-64-token documents, C = 512: W = 5 + SiLU
# 0.703 -> 0.784 of copy, W = 4 + SiLU 0.850 -> 0.869, same bits; with bias and at W >= 6 it was slower on
# short documents (every case, the seed mix and C = 2048: notes 3.7, results/h100_tables.txt).
_BWD_BRANCH_NO_BIAS = BwdConfig(R=4, BC=128, num_warps=4, stages=4, maxnreg=168, step_branch=True)
# Wide taps (W >= WIDE_TAPS): the sliding window holds H + 4 = W + 3 rows (forward) and the backward
# carries about 2 W + 15 tiles, so the picks halve the rows per program to keep them in registers.
# Forward at W = 8, no activation, uniform 1-64 documents, C = 512 (one H200, sweep_configs.py):
# R = 8 SUB = 32 0.26 of copy, R = 4 SUB = 64 0.68, R = 2 SUB = 128 0.58; at W = 5 the R = 8 pick
# kept 0.885 (W = 4: 0.893). The backward's R = 2 picks follow the register count (unmeasured).
# With 8-row steps (W >= 6), W = 8 + SiLU, no bias, one H100 (sweep_configs.py, results/h100_tables.txt):
# 3 stages against 4, seed / 1-64 documents, 0.899 / 0.849 against 0.881 / 0.810 at C = 512, 0.927 /
# 0.904 against 0.918 / 0.851 at C = 2048; at C = 512 none of seven other shapes came within 1% of it.
WIDE_TAPS = 6
_FWD_WIDE_TAPS = FwdConfig(R=4, SUB=64, BC=128, num_warps=4, stages=3, maxnreg=128)
_BWD_WIDE_TAPS = BwdConfig(R=2, BC=128, num_warps=4, stages=4, maxnreg=128)
_BWD_WIDE_TAPS_BRANCH = BwdConfig(R=2, BC=128, num_warps=4, stages=4, maxnreg=128, step_branch=True)


def pick_fwd_config(C: int, itemsize: int, interpret: bool, width: int = 4) -> FwdConfig:
    """Forward configuration for C channels and ``width`` taps: the fastest of FWD_CONFIGS in the
    H200 sweep at the nearest measured C."""
    if interpret:
        return FWD_INTERPRET
    if width >= WIDE_TAPS:
        return _FWD_ODD if C <= 128 else _FWD_WIDE_TAPS
    if C <= 128:
        # 128-row programs: 256-row ones make 7.4 programs per SM at S = 250,340 (978 of them), so the
        # SMs holding 8 set the time; 128-row ones make 14.8 (the benchmark's seed mix: 38.6 -> 36.6 us;
        # the backward's 128-row programs measured slower there, 71.5 -> 77.0 us)
        return _FWD_ODD
    if C <= 512:
        return _FWD_SMALL  # 0.81 of copy bandwidth at C = 512 (kernel alone)
    if C >= 4096 and C % 1024 == 0:
        return _FWD_WIDE  # 0.92 at C = 8192 (kernel alone)
    if C % 128 != 0:
        return _FWD_ODD  # 0.86 at C = 1160, where _FWD_MID reached 0.64-0.65 (same run)
    return _FWD_MID  # 0.88 at C = 2048 (128-channel blocks: no idle lanes at any C % 128)


def pick_bwd_config(C: int, itemsize: int, interpret: bool, has_bias: bool = False, width: int = 4) -> BwdConfig:
    """Backward configuration for C channels and ``width`` taps (and whether there is a bias): the
    fastest of BWD_CONFIGS in the H200 runs; the register cap of _BWD_BRANCH_NO_BIAS from one H100's."""
    if interpret:
        return BWD_INTERPRET
    if width >= WIDE_TAPS and C > 64:
        branch = C >= 1024 or (C >= 512 and not has_bias)
        return _BWD_WIDE_TAPS_BRANCH if branch else _BWD_WIDE_TAPS
    if C <= 64:
        return _BWD_TINY
    if C >= 1024 or (C >= 512 and not has_bias):
        # the unmasked body away from boundaries: 0.85 at C = 1024, 0.79 at 1160, 0.80 at 512 without
        # bias (the masked loop everywhere: 0.82, 0.76, 0.77; same run)
        return _BWD_BRANCH if has_bias else _BWD_BRANCH_NO_BIAS
    return _BWD  # the unmasked-body branch is slower here: at C = 128, and at 512 with bias (0.82 -> 0.79)


def configs_at_width(width: int) -> tuple[tuple[FwdConfig, ...], tuple[BwdConfig, ...]]:
    """(forward, backward) configurations the two picks above return at ``width`` taps for some C,
    dtype and bias, the interpreter's aside: what a compiled run at that width can launch (the quick
    twins' configurations are picked below)."""
    if width >= WIDE_TAPS:
        return (_FWD_ODD, _FWD_WIDE_TAPS), (_BWD_TINY, _BWD_WIDE_TAPS, _BWD_WIDE_TAPS_BRANCH)
    return (_FWD_ODD, _FWD_SMALL, _FWD_WIDE, _FWD_MID), (_BWD_TINY, _BWD, _BWD_BRANCH, _BWD_BRANCH_NO_BIAS)


# The quick twins' one configuration for every C (compile_ahead.py: what a first training step runs while
# the full kernels compile): one compiled twin then serves every channel count. Chosen for a short
# compile and a moderate register count, not measured for speed (the full kernels take over).
_FWD_QUICK = FwdConfig(R=4, SUB=32, BC=128, num_warps=4)
_BWD_QUICK = BwdConfig(R=4, BC=128, num_warps=4)
_BWD_QUICK_WIDE_TAPS = BwdConfig(R=2, BC=128, num_warps=4)


def pick_quick_configs(interpret: bool, width: int = 4) -> tuple[FwdConfig, BwdConfig]:
    """(forward, backward) configurations of the quick twins at ``width`` taps: the same for every C."""
    if interpret:
        return FWD_INTERPRET, BWD_INTERPRET
    return _FWD_QUICK, _BWD_QUICK_WIDE_TAPS if width >= WIDE_TAPS else _BWD_QUICK


def cdiv(a: int, b: int) -> int:
    return triton.cdiv(a, b)
