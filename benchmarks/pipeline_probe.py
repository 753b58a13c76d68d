"""Does Triton software-pipeline a row loop? Compile two small loops for sm_90 (no GPU needed).

Both loops walk rows t = rows0 + i of an [R, BC] tile, load x[t+1] and dy[t+1], and keep a
window of earlier x rows in registers. ``carry=1``: every loaded row is used in its own step and
the next one only. ``carry=3``: a loaded row is kept three steps (as the v2 backward kept x[t-3]).
The printed count of ``cp.async`` instructions in the PTX says whether the loads were moved through
shared memory (pipelined) or not.

    python benchmarks/pipeline_probe.py
    -> carry=1: 6 cp.async   carry=3: 0 cp.async   (Triton 3.6.0, num_stages=3)
"""

import re
import sys

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


@triton.jit
def _probe(x_ptr, dy_ptr, out_ptr, ws_ptr, stride, CARRY: tl.constexpr, STAGES: tl.constexpr):
    R: tl.constexpr = 8
    BC: tl.constexpr = 128
    rows0 = tl.program_id(0) * (R * 32) + tl.arange(0, R) * 32
    cols = tl.arange(0, BC)
    xa = tl.zeros([R, BC], tl.float32)  # x of the row before, kept from the previous step
    xb = tl.zeros([R, BC], tl.float32)  # x two rows before (only read when CARRY == 3)
    xc = tl.zeros([R, BC], tl.float32)  # x three rows before (only read when CARRY == 3)
    acc = tl.zeros([R, BC], tl.float32)
    for i in tl.range(0, 32, 1, num_stages=STAGES):
        t = rows0 + i
        offs = (t + 1)[:, None] * stride + cols[None, :]
        x1 = tl.load(x_ptr + offs).to(tl.float32)
        dy1 = tl.load(dy_ptr + offs).to(tl.float32)
        g = dy1 * (x1 + xa)
        if CARRY == 3:
            acc = tl.fma(g, xc, acc)
            xc = xb
            xb = xa
        else:
            acc = tl.fma(g, xa, acc)
        xa = x1
        tl.store(out_ptr + offs, g.to(tl.bfloat16))
    tl.store(ws_ptr + tl.program_id(0) * BC + cols, tl.sum(acc, 0))


def count_cp_async(carry: int, stages: int = 3) -> int:
    sig = {"x_ptr": "*bf16", "dy_ptr": "*bf16", "out_ptr": "*bf16", "ws_ptr": "*fp32", "stride": "i32",
           "CARRY": "constexpr", "STAGES": "constexpr"}
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(5)}
    src = ASTSource(fn=_probe, signature=sig, constexprs={"CARRY": carry, "STAGES": stages}, attrs=attrs)
    ck = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    return len(re.findall(r"cp\.async\.c[ag]", ck.asm["ptx"]))


def main():
    print("   ".join(f"carry={c}: {count_cp_async(c)} cp.async" for c in (1, 3)), f"(Triton {triton.__version__}, num_stages=3)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
