"""Compile the Triton kernels for sm_90 on any machine (no GPU needed) and report resources.

For each launch configuration of tuning.py: registers, spills (local loads/stores), and the width
of the global loads/stores in the PTX (16-byte accesses show as ``v4.b32`` for bf16 rows).

    python tools/compile_report.py
"""

import collections
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.append(REPO)  # the package; after PYTHONPATH, where an A/B puts another cakeconv
from cakeconv.cake_causal_conv1d_det_train_backend.kernels import backward as triton_backward, forward as triton_forward, tuning  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
C_REPORT = 512  # the row strides are compile-time constants: contiguous rows of this many channels
FWD_STRIDES = {"SX8": C_REPORT // 8, "SY8": C_REPORT // 8}
BWD_STRIDES = {"SX8": C_REPORT // 8, "SDY8": C_REPORT // 8, "SDX8": C_REPORT // 8}
CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")

FWD_SIG = {"x_ptr": "*bf16", "y_ptr": "*bf16", "w_ptr": "*fp32", "b_ptr": "*fp32", "cu_ptr": "*i32",
           "hist_ptr": "*bf16", "S": "i32", "C8": "i32", "n_seg": "i32",
           "seq_len": "i32", "SX8": "constexpr", "SY8": "constexpr", "HAS_BIAS": "constexpr", "HAS_CU": "constexpr", "HAS_HIST": "constexpr",
           "R": "constexpr", "SUB": "constexpr", "BC": "constexpr",
           "STAGES": "constexpr", "W": "constexpr", "ACT": "constexpr"}
BWD_SIG = {"x_ptr": "*bf16", "dy_ptr": "*bf16", "dx_ptr": "*bf16", "w_ptr": "*fp32", "b_ptr": "*fp32",
           "cu_ptr": "*i32", "hist_ptr": "*bf16", "fut_ptr": "*fp32", "ws_ptr": "*fp32", "S": "i32",
           "C8": "i32", "n_seg": "i32", "seq_len": "i32", "SX8": "constexpr", "SDY8": "constexpr", "SDX8": "constexpr",
           "HAS_BIAS": "constexpr", "HAS_CU": "constexpr", "HAS_HIST": "constexpr", "HAS_FUT": "constexpr", "R": "constexpr",
           "LOGR": "constexpr", "SUB": "constexpr", "BC": "constexpr", "STAGES": "constexpr",
           "STEP_BRANCH": "constexpr", "W": "constexpr", "ACT": "constexpr"}
# The taps' width and the activation (W, ACT = 1: SiLU) of the kernels these tools compile: the seed's.
SEED_WIDTH = {"W": 4, "ACT": 1}


def compile_one(fn, sig, consts, cfg, n_ptrs):
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(n_ptrs)}  # as the JIT sees aligned tensors
    ck = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs), target=TARGET,
                        options={"num_warps": cfg.num_warps, "enable_fp_fusion": False, **tuning.launch_options(cfg)})
    ptx = ck.asm["ptx"]
    acc = collections.Counter(re.findall(r"\b((?:ld|st)\.(?:global|local)[\.\w]*|cp\.async\.c[ag][\.\w]*)", ptx))
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(ck.asm["cubin"])
        f.flush()
        res = subprocess.run([CUOBJDUMP, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    regs = re.search(r"REG:(\d+)", res)
    stack = re.search(r"STACK:(\d+)", res)
    return (int(regs.group(1)) if regs else -1), (int(stack.group(1)) if stack else -1), dict(acc, smem=ck.metadata.shared)


def main():
    rows = []
    for cfg in tuning.FWD_CONFIGS:
        consts = {"HAS_BIAS": True, "HAS_CU": True, "HAS_HIST": False, "R": cfg.R, "SUB": cfg.SUB, "BC": cfg.BC,
                  "STAGES": cfg.stages, **FWD_STRIDES, **SEED_WIDTH}
        rows.append(("fwd", cfg) + compile_one(triton_forward.cake_conv_fwd_kernel, FWD_SIG, consts, cfg, 6))
    for cfg in tuning.BWD_CONFIGS:
        consts = {"HAS_BIAS": True, "HAS_CU": True, "HAS_HIST": False, "HAS_FUT": False, "R": cfg.R, "LOGR": cfg.R.bit_length() - 1,
                  "SUB": triton_backward.BWD_SUB, "BC": cfg.BC, "STAGES": cfg.stages,
                  "STEP_BRANCH": cfg.step_branch, **BWD_STRIDES, **SEED_WIDTH}
        rows.append(("bwd", cfg) + compile_one(triton_backward.cake_conv_bwd_kernel, BWD_SIG, consts, cfg, 9))
    for kind, cfg, regs, stack, acc in rows:
        print(f"{kind} {cfg}: regs {regs} stack {stack} accesses {acc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
