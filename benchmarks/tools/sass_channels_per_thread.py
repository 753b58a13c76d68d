"""SASS instructions per element of the backward's row loops at C = 512 (segment-index variant),
for backward configurations with 1, 2 and 4 channels per thread (no GPU needed).

The masked loops of short documents are bound by instruction issue (ncu; benchmarks/NOTES.md): a
row's mask comparisons are made once per thread, so a thread holding more channels of the row
shares them. This compiles each configuration for sm_90 and prints, per configuration, the
registers, the instructions per element of the unmasked loop and of the two masked loops
(benchmarks/tools/sass_loop_count.py's ``report``) and the spill accesses in the whole kernel.
Tuning never changes bits, so any of these may serve the index variant if it is faster.

    python benchmarks/tools/sass_channels_per_thread.py [--bias]
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sass_loop_count import BWD_SIG, ROWS_PER_STEP, bwd_consts, report, sass_and_regs  # noqa: E402

from cakeconv.cake_causal_conv1d_det_train_backend.kernels import backward, tuning  # noqa: E402
from cakeconv.cake_causal_conv1d_det_train_backend.kernels.tuning import BwdConfig  # noqa: E402

C = 512
SEGMENT_IDS = 2  # HAS_CU of the variant that reads per-token segment indices


def candidates(bias: bool):
    return [
        tuning.pick_bwd_config(C, 2, False, has_bias=bias),
        BwdConfig(R=4, BC=128, num_warps=2, stages=4, maxnreg=255, step_branch=True),
        BwdConfig(R=4, BC=256, num_warps=4, stages=4, maxnreg=255, step_branch=True),
        BwdConfig(R=2, BC=256, num_warps=4, stages=4, maxnreg=255, step_branch=True),
        BwdConfig(R=2, BC=128, num_warps=2, stages=3, step_branch=True),
        BwdConfig(R=2, BC=128, num_warps=2, stages=4, step_branch=True),
        BwdConfig(R=2, BC=64, num_warps=1, stages=3, step_branch=True),
        BwdConfig(R=1, BC=128, num_warps=2, stages=3, step_branch=True),
        BwdConfig(R=1, BC=256, num_warps=2, stages=3, maxnreg=255, step_branch=True),
    ]


def main():
    bias = "--bias" in sys.argv[1:]
    for cfg in candidates(bias):
        sass, regs = sass_and_regs(backward.cake_conv_bwd_kernel, BWD_SIG, bwd_consts(cfg, C, bias, SEGMENT_IDS), cfg, 9)
        spills = sum(("LDL" in line) or ("STL" in line) for line in sass.splitlines())
        per_thread = cfg.BC // (32 * cfg.num_warps)
        report(f"C={C} bias={bias} {cfg} channels/thread={per_thread} spill accesses (kernel)={spills}", sass, regs,
               ROWS_PER_STEP * cfg.R * per_thread)
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
