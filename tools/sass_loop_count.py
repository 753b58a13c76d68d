"""SASS instructions per element in the row loops of the default forward and backward kernels.

Compiles the kernels for sm_90 on any machine (no GPU), disassembles them with the cuobjdump that
Triton ships, finds the two largest loops (backward branches: the masked and the unmasked row
loop) and divides their instruction counts by the elements a thread handles per loop step. The
unmasked loop is the one nearly every program runs. Used in benchmarks/NOTES.md.

    python tools/sass_loop_count.py            # instructions per element (C = 512 picks), both
                                                          # segment lookups of many-segment programs
    python tools/sass_loop_count.py --spills   # register spills in the backward's loops per C
    python tools/sass_loop_count.py --mix-diff # opcodes per element, backward with segment ids at
                                                          # C = 512 without bias: many-segment middle loop
                                                          # against the unmasked loop
    python tools/sass_loop_count.py --all      # the three in turn (benchmarks/results/cpu_sass_loops.txt)
    python tools/sass_loop_count.py --width=8 --spills   # the same for the picks of another width (SiLU)
    python tools/sass_loop_count.py --width=5 --no-silu --segment-ids   # ... without the activation
"""

import collections
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # compile_report (it puts the repository on sys.path)
import triton  # noqa: E402
from compile_report import BWD_SIG, CUOBJDUMP, FWD_SIG, FWD_STRIDES, SEED_WIDTH, TARGET  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

# the taps' width and activation of the compiled kernels (--width=N changes W, --no-silu the activation)
WIDTH = dict(SEED_WIDTH)

from cakeconv.cake_causal_conv1d_det_train_backend.kernels import backward as triton_backward, forward as triton_forward, tuning  # noqa: E402


def step_elements(cfg):
    """Elements a thread handles in one row-loop step: the step's rows (the kernels' STEP: 4, or 8 from
    W = 6 on) times R sub-runs times BC channels, over the program's threads."""
    rows = 4 + 4 * (WIDTH["W"] - 1 > 4)
    return rows * cfg.R * cfg.BC // (32 * cfg.num_warps)


def sass_and_regs(fn, sig, consts, cfg, n_ptrs):
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(n_ptrs)}
    ck = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs), target=TARGET,
                        options={"num_warps": cfg.num_warps, "enable_fp_fusion": False, **tuning.launch_options(cfg)})
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(ck.asm["cubin"])
        f.flush()
        sass = subprocess.run([CUOBJDUMP, "--dump-sass", f.name], capture_output=True, text=True).stdout
        res = subprocess.run([CUOBJDUMP, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    return sass, int(re.search(r"REG:(\d+)", res).group(1))


def largest_loops(sass, n=2):
    """The n largest backward-branch regions, each a list of (address, instruction)."""
    ins = []
    for line in sass.splitlines():
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2).strip()))
    loops = []
    for addr, text in ins:
        target = re.search(r"BRA.*0x([0-9a-f]+)", text)
        if target and int(target.group(1), 16) < addr:
            loops.append([x for x in ins if int(target.group(1), 16) <= x[0] <= addr])
    return sorted(loops, key=len, reverse=True)[:n]


def _opcode(text):
    """The opcode of one SASS instruction, without its predicate and modifiers ("@!P0 LDG.E.128 ..." -> LDG)."""
    return re.match(r"(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", text).group(1)


LOOP_NAMES = ("few segments", "many segments, ends", "many segments, middle", "unmasked")


def row_loops(sass):
    """The four row loops in the kernels' code order (address order), named as LOOP_NAMES: masked
    with preloaded boundaries (programs touching at most FEW_SEGMENTS segments; in a STEP_BRANCH
    backward this loop holds both the masked and the unmasked step body); masked with a segment
    lookup per row (more segments: a binary search, or per-token segment indices) in the first and
    last row blocks, with row-bounds checks; the same in every other row block, without them; unmasked.
    (They are told apart by address, not by size: by size the first two swap in the backward.)"""
    return dict(zip(LOOP_NAMES, sorted(largest_loops(sass, len(LOOP_NAMES)), key=lambda loop: loop[0][0])))


def report(name, sass, regs, elems_per_step):
    """Instructions per element of the four row loops, the unmasked loop's mix, and per loop the
    global loads (LDG: not pipelined; LDGSTS: cp.async, pipelined) and spill accesses."""
    loops = row_loops(sass)
    ops = collections.Counter(_opcode(t) for _, t in loops["unmasked"])
    mix = ", ".join(f"{k} {v / elems_per_step:.1f}" for k, v in ops.most_common(8))
    cells = []
    for loop_name, loop in loops.items():
        opcodes = [_opcode(t) for _, t in loop]
        spills = sum(("LDL" in t) or ("STL" in t) for _, t in loop)
        cells.append(f"{loop_name} {len(loop) / elems_per_step:.1f} ({opcodes.count('LDG')} LDG, "
                     f"{opcodes.count('LDGSTS')} LDGSTS, {spills} spills)")
    print(f"{name}: {regs} registers; instructions per element: " + "; ".join(cells) + f"; unmasked mix: {mix}")


def bwd_consts(cfg, C, bias, has_cu=True):
    """The backward kernel's compile-time arguments for the tuner's pick at C (contiguous rows)."""
    return {"HAS_BIAS": bias, "HAS_CU": has_cu, "HAS_HIST": False, "HAS_FUT": False, "R": cfg.R,
            "LOGR": cfg.R.bit_length() - 1, "SUB": triton_backward.BWD_SUB, "BC": cfg.BC,
            "STAGES": cfg.stages, "STEP_BRANCH": cfg.step_branch, "SX8": C // 8, "SDY8": C // 8, "SDX8": C // 8,
            **WIDTH}


def spill_report(channels=(128, 512, 1024, 2048, 8192)):
    """Local-memory loads and stores (register spills) inside the backward pick's four row loops,
    with and without bias, per C (the row stride is a compile-time constant, so each C compiles
    anew)."""
    for C in channels:
        cfg = tuning.pick_bwd_config(C, 2, False, width=WIDTH["W"])
        cells = []
        for bias in (False, True):
            sass, _ = sass_and_regs(triton_backward.cake_conv_bwd_kernel, BWD_SIG, bwd_consts(cfg, C, bias), cfg, 9)
            spills = {k: sum(("LDL" in t) or ("STL" in t) for _, t in loop) for k, loop in row_loops(sass).items()}
            cells.append(f"bias={bias}: spills " + ", ".join(f"{k} {v}" for k, v in spills.items()))
        print(f"backward C={C} {cfg}: " + " | ".join(cells), flush=True)


def mix_diff(C=512):
    """Opcodes per element in which the backward's many-segment middle loop (segment indices, the
    pick at C without bias) differs from its unmasked loop: what the segment rule costs."""
    cfg = tuning.pick_bwd_config(C, 2, False, width=WIDTH["W"])
    sass, _ = sass_and_regs(triton_backward.cake_conv_bwd_kernel, BWD_SIG, bwd_consts(cfg, C, False, 2), cfg, 9)
    loops = row_loops(sass)
    per_step = step_elements(cfg)
    middle = collections.Counter(_opcode(t) for _, t in loops["many segments, middle"])
    unmasked = collections.Counter(_opcode(t) for _, t in loops["unmasked"])
    print(f"backward (segment ids) C={C} {cfg}, no bias: middle {sum(middle.values()) / per_step:.1f}, "
          f"unmasked {sum(unmasked.values()) / per_step:.1f} instructions per element")
    for op in sorted(set(middle) | set(unmasked), key=lambda k: unmasked[k] - middle[k]):
        if middle[op] != unmasked[op]:
            print(f"  {op:10s} middle {middle[op] / per_step:5.2f}  unmasked {unmasked[op] / per_step:5.2f}  "
                  f"difference {(middle[op] - unmasked[op]) / per_step:+.2f}")


def main():
    args = sys.argv[1:]
    for a in args:
        if a.startswith("--width="):
            WIDTH["W"] = int(a.split("=", 1)[1])
    if "--no-silu" in args:
        WIDTH["ACT"] = 0
    if "--all" in args:  # what benchmarks/results/cpu_sass_loops.txt holds: the three reports in turn
        loop_report(args)
        spill_report()
        mix_diff()
        return 0
    if "--spills" in args:
        spill_report()
        return 0
    if "--mix-diff" in args:
        mix_diff()
        return 0
    loop_report(args)
    return 0


def loop_report(args):
    """Instructions per element of the row loops of the C = 512 picks, per segment lookup."""
    # HAS_CU True: rows of many-segment programs placed by a binary search over cu; SEGMENT_IDS (2):
    # by comparing per-token segment indices (kernels/segment_ids.py). --segment-ids: only the latter
    variants = (2,) if "--segment-ids" in args else (True, 2)
    for has_cu in variants:
        lookup = "search" if has_cu is True else "segment ids"
        cfg = tuning.pick_fwd_config(512, 2, False, width=WIDTH["W"])
        sass, regs = sass_and_regs(triton_forward.cake_conv_fwd_kernel, FWD_SIG,
                                   {"HAS_BIAS": True, "HAS_CU": has_cu, "HAS_HIST": False, "R": cfg.R, "SUB": cfg.SUB,
                                    "BC": cfg.BC, "STAGES": cfg.stages, **FWD_STRIDES, **WIDTH}, cfg, 6)
        report(f"forward ({lookup}) {cfg}", sass, regs, step_elements(cfg))
        cfg = tuning.pick_bwd_config(512, 2, False, width=WIDTH["W"])
        sass, regs = sass_and_regs(triton_backward.cake_conv_bwd_kernel, BWD_SIG, bwd_consts(cfg, 512, True, has_cu),
                                   cfg, 9)
        report(f"backward ({lookup}) {cfg}", sass, regs, step_elements(cfg))


if __name__ == "__main__":
    sys.exit(main())
