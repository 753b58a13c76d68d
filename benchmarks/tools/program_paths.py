"""Which row loop each program of the picks runs on the benchmark's inputs (CPU only, no GPU).

A program of the forward (R * SUB rows) or the backward (R leaves of BWD_SUB rows) whose rows,
with their 3-row history, hold no document boundary runs the unmasked loop; one touching at most
FEW_SEGMENTS (4) segments runs the masked loop with preloaded boundaries; one touching more runs
the searching loop (a binary search over cu_seqlens per row: about 2.4x the unmasked loop's
instructions and 5x its global loads per step in the forward at C = 1536, per
``sass_loop_count.py``). Programs are launched in row-block order, channel blocks fastest, so a
searching row block late in S runs in the grid's last wave.

    python benchmarks/tools/program_paths.py --rows 250340x1536,262144x1536

Uses the benchmark's own document lengths (the seed mix of benchmarks/doc_mixes.py, same seed).
"""

import argparse
import bisect
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: the benchmark's modules
from doc_mixes import doc_lengths  # noqa: E402
from shapes import shape_seed  # noqa: E402

from cakeconv.cake_causal_conv1d_det_train_backend.kernels import backward as triton_backward, common as triton_common, tuning  # noqa: E402

FEW_SEGMENTS = triton_common.FEW_SEGMENTS.value


def row_block_paths(cu, S, rows, ahead):
    """Per row block of `rows` rows: 'unmasked', 'few' or 'search'. The kernels' own test: a
    boundary of cu (whose last entry is S) in (p0 - 3, p_last + ahead] makes the block masked;
    ahead = 0 in the forward, 3 in the backward (its look-ahead rows)."""
    paths = []
    for p0 in range(0, S, rows):
        p_hi = p0 + rows - 1 + ahead
        lo, hi = bisect.bisect_right(cu, p0 - 3), bisect.bisect_right(cu, p_hi)
        if hi == lo:
            paths.append("unmasked")
        else:
            paths.append("few" if (hi - 1) - max(lo - 1, 0) < FEW_SEGMENTS else "search")
    return paths


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="250340x1024,250340x1280,250340x1536,262144x1536", help="SxC list")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mean-doc-len", type=int, default=3000)
    ap.add_argument("--resident", type=int, default=132 * 4, help="programs resident at once (H200 picks: 4 per SM)")
    args = ap.parse_args()
    for item in args.rows.split(","):
        S, C = (int(v) for v in item.split("x"))
        lens = doc_lengths(S, shape_seed(args.seed, S, C), args.mean_doc_len)
        cu = [0]
        for n in lens:
            cu.append(cu[-1] + n)
        fwd = tuning.pick_fwd_config(C, 2, False)
        bwd = tuning.pick_bwd_config(C, 2, False)
        for name, rows, bc, ahead in (("forward", fwd.R * fwd.SUB, fwd.BC, 0),
                                      ("backward", bwd.R * triton_backward.BWD_SUB, bwd.BC, 3)):
            paths = row_block_paths(cu, S, rows, ahead)
            n_cblk = -(-C // bc)
            n_prog = len(paths) * n_cblk
            waves = n_prog / args.resident
            search = [i for i, p in enumerate(paths) if p == "search"]
            # programs launched after a searching block's own: fewer than one wave of them leaves its
            # extra time exposed at the end of the kernel
            where = ", ".join(f"block {i} ({(len(paths) - 1 - i) * n_cblk / args.resident:.1f} waves of programs after it)"
                              for i in search)
            print(f"S={S} C={C} {name}: {len(lens)} documents, {len(paths)} row blocks of {rows} rows x {n_cblk} "
                  f"channel blocks ({waves:.1f} waves); unmasked {paths.count('unmasked')}, few {paths.count('few')}, "
                  f"search {len(search)}" + (f": {where}" if search else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
