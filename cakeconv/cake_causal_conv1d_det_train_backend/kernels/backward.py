"""Triton backward kernels: one pass for dx and FP32 dweight/dbias partials, then a fixed-order sum.

Shape legend: S packed tokens, C channels, N segments, R sub-runs per program, BC channels per
program, H = 3 halo rows, L leaves (sub-runs of BWD_SUB rows), G groups of TREE_LEAVES leaves.

Math (FP32, pre recomputed in registers, never read from memory):

    g[t]     = dy[t] * s * (1 + pre[t] * (1 - s)),   s = sigmoid(pre[t])
    dx[t]    = w3 * g[t] + w2 * g[t+1] + w1 * g[t+2] + w0 * g[t+3]    (same segment, else 0/halo)
    dw[c, k] = sum_t g[t, c] * x[t - 3 + k, c],   db[c] = sum_t g[t, c]

The dweight/dbias sum has ONE order, fixed by S alone (never by a tuning choice):
  1. each leaf (BWD_SUB consecutive rows) accumulates its rows in row order with FMAs;
  2. the leaves of each aligned group of TREE_LEAVES leaves are added as a pairwise tree;
  3. the group sums of each aligned block of GROUP_BLOCK groups are added as a pairwise tree
     (missing groups count as zero), and the block sums in block order (one block up to
     S = 2**19 = 524,288 tokens).
A program that owns R = 2**j adjacent leaves adds them with the bottom j levels of that same tree
before writing (fewer partial bytes); the group kernel finishes the tree from level j. So R, BC and
the warp count change speed, never bits.

Launches: S <= TREE_LEAVES * BWD_SUB rows (one group) take one, the one-group kernel, whose last
program per channel block (by ticket) finishes the tree; more groups take two, the main kernel
and the group kernel, whose last program per column block (by ticket) adds the group sums.
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .common import (
    INTERPRET,
    conv_pre,
    load_taps,
    count_bounds_le,
    window_has_boundary,
    halo_tap,
    load_rows,
    load_window,
    row_list_setup,
    pairwise_sum_rows,
    FEW_SEGMENTS,
    SEGMENT_IDS,
    history_flags,
    step_windows,
    load_ids,
    load_ids4,
    segment_of_rows,
    segment_window,
    sigmoid_f32,
    store_at,
    load_at,
    row_ptrs,
)

# Rows per leaf of the dweight tree (fixed: part of the summation order). 64, not 32: a leaf's
# sub-run re-reads 3 x rows before and 3 x and dy rows after it and recomputes 3 rows of g, so
# 64-row leaves halve that overhead (measured faster on the H200 than 32-row leaves).
BWD_SUB = 64
TREE_LEAVES = 128  # leaves per group of the pairwise tree (fixed: part of the summation order)
LOG2_TREE_LEAVES = 7
GROUP_BLOCK = 64  # group sums added as one pairwise tree per block of 64 groups (fixed)
LOG2_GROUP_BLOCK = 6


@triton.jit
def bwd_g_rows(a3, a2, a1, a0, dy, t, b, w0, w1, w2, w3, cu_ptr, hist_ptr, cols, cmask, C, n_seg,
               seq_len, seg,
               HAS_CU: tl.constexpr, HAS_HIST: tl.constexpr, MASKED: tl.constexpr, FEW: tl.constexpr):
    """g = dy * silu'(pre) for rows t; also (d, start, end) of their segments when MASKED, and the
    taps a3, a2, a1 after the segment/halo rule (the x rows t-3..t-1 that pre read)."""
    if MASKED:
        d, pos, in3, in2, in1, end = history_flags(cu_ptr, t, seg, n_seg, seq_len, HAS_CU, HAS_HIST, FEW)
        start = t - pos
        a3 = halo_tap(a3, in3, pos, d, hist_ptr, cols, cmask, C, n_seg, HAS_HIST)
        a2 = halo_tap(a2, in2, pos + 1, d, hist_ptr, cols, cmask, C, n_seg, HAS_HIST)
        a1 = halo_tap(a1, in1, pos + 2, d, hist_ptr, cols, cmask, C, n_seg, HAS_HIST)
    else:
        d = t * 0
        start = t * 0
        end = t * 0
    pre = conv_pre(b, w0, w1, w2, w3, a3, a2, a1, a0)
    s = sigmoid_f32(pre)
    g = dy * (s * (1.0 + pre * (1.0 - s)))
    return g, d, start, end, a3, a2, a1


@triton.jit
def dx_rows(dxp, t, g0, g1, g2, g3, d, end, w0, w1, w2, w3, fut_ptr, cols, cmask, sdx, S, C, n_seg,
            HAS_FUT: tl.constexpr, MASKED: tl.constexpr, AHEAD_IDS: tl.constexpr = False,
            BOUNDS: tl.constexpr = True):
    """dx[t] = w3 g[t] + w2 g[t+1] + w1 g[t+2] + w0 g[t+3] (FMAs in this order), stored.

    Where t + k leaves the segment, g[t + k] is zero, or the look-ahead halo ``fut[d, k-1-q]``
    (q: the rows after t inside its segment). AHEAD_IDS: ``end`` is instead the tuple of the
    segment indices of rows t .. t + 3, and "t + k inside" is their comparison (q clamped to 3,
    counted only for a halo).
    """
    if MASKED:
        if AHEAD_IDS:
            i_0, i_p1, i_p2, i_p3 = end
            # (as history_flags does for rows before t; not one helper: the comparisons' order
            # differs, and a shared order changes the SASS of the KCP variant with indices)
            in1 = i_p1 == i_0
            in2 = i_p2 == i_0
            in3 = i_p3 == i_0
            if HAS_FUT:
                q = in1.to(tl.int32) + in2.to(tl.int32) + in3.to(tl.int32)
            else:
                q = t * 0  # halo_tap reads no halo without one
        else:
            q = end - 1 - t
            in1 = q >= 1
            in2 = q >= 2
            in3 = q >= 3
        g1 = halo_tap(g1, in1, 0 - q, d, fut_ptr, cols, cmask, C, n_seg, HAS_FUT)
        g2 = halo_tap(g2, in2, 1 - q, d, fut_ptr, cols, cmask, C, n_seg, HAS_FUT)
        g3 = halo_tap(g3, in3, 2 - q, d, fut_ptr, cols, cmask, C, n_seg, HAS_FUT)
    dx = w3 * g0
    dx = tl.fma(w2, g1, dx)
    dx = tl.fma(w1, g2, dx)
    dx = tl.fma(w0, g3, dx)
    store_at(dxp, t, dx, cmask, S, MASKED and BOUNDS)


@triton.jit
def _acc_row(acc0, acc1, acc2, acc3, accb, g, a3, a2, a1, a0, inside, DB: tl.constexpr):
    """Add row terms g * x[t-3+k] and g to the dweight/dbias accumulators when ``inside`` (a
    scalar: the row belongs to the program's leaves), else leave them untouched (exactly).
    Without DB (no bias) the dbias accumulator stays zero: nothing reads its sum then, and the
    row loops save one add per element."""
    acc0 = tl.where(inside, tl.fma(g, a3, acc0), acc0)
    acc1 = tl.where(inside, tl.fma(g, a2, acc1), acc1)
    acc2 = tl.where(inside, tl.fma(g, a1, acc2), acc2)
    acc3 = tl.where(inside, tl.fma(g, a0, acc3), acc3)
    if DB:
        accb = tl.where(inside, accb + g, accb)
    return acc0, acc1, acc2, acc3, accb


@triton.jit
def dirty_steps(seg, p0, S, R: tl.constexpr, SUB: tl.constexpr):
    """Bits (int64) of the loop steps of a FEW masked program that need the masked body.

    Step k reads rows t .. t + 6 of every leaf r (t = p0 + r * SUB + 4k) and writes rows t .. t + 3.
    It needs the masked body when a boundary c_j of ``seg`` lies in (t, t + 6] (a row it writes and
    a row it reads are in different segments), or when row t + 6 of the last leaf is at or past S.
    Every other step sees one segment in all its rows, where the unmasked body computes the same
    bits.
    """
    d_lo, d_hi, n_iter, c0, c1, c2, c3, c4 = seg
    bits = _boundary_steps(c1, p0, R, SUB)
    bits |= _boundary_steps(c2, p0, R, SUB)
    bits |= _boundary_steps(c3, p0, R, SUB)
    bits |= _boundary_steps(c4, p0, R, SUB)
    # steps k with p0 + (R - 1) * SUB + 4k + 6 >= S, i.e. k >= ceil(m / 4)
    m = S - p0 - (R - 1) * SUB - 6
    k_s = ((tl.minimum(tl.maximum(m, 0), SUB) + 3) // 4).to(tl.int64)
    one = tl.full((), 1, tl.int64)
    all_bits = (one << (SUB // 4)) - 1
    return bits | (all_bits - ((one << k_s) - 1))


@triton.jit
def _boundary_steps(c, p0, R: tl.constexpr, SUB: tl.constexpr):
    """Bits of the steps k (t = p0 + r * SUB + 4k, some leaf r) with t < c <= t + 6."""
    one = tl.full((), 1, tl.int64)
    bits = one * 0
    for r in tl.static_range(R):
        # int64, and k clamped into [0, SUB / 4] before shifting: a far boundary (INT_MAX past
        # cu[N]) must neither overflow nor shift by 64 or more (undefined, even where unselected)
        rel = c.to(tl.int64) - p0 - r * SUB
        lo = rel - 6  # 4k in [lo, hi]
        hi = rel - 1
        k_lo = (tl.minimum(tl.maximum(lo, 0), SUB) + 3) // 4
        k_hi = tl.minimum(tl.maximum(hi, 0), SUB - 4) // 4
        hit = (hi >= 0) & (lo <= SUB - 4) & (k_lo <= k_hi)
        bits |= tl.where(hit, (one << (k_hi + 1)) - (one << k_lo), 0)
    return bits


@triton.jit
def _bwd_step(xa0, xa1, xa2, x3, x4, x5, x6, dy3, dy4, dy5, dy6, g0, g1, g2, d0, d1, d2, e0, e1, e2,
              acc0, acc1, acc2, acc3, accb, t, i, dx_base, b, w0, w1, w2, w3, cu_ptr, hist_ptr, fut_ptr,
              cols, cmask, sdx, S, C, n_seg, seq_len, seg, ids,
              HAS_CU: tl.constexpr, HAS_HIST: tl.constexpr, HAS_FUT: tl.constexpr, MASKED: tl.constexpr,
              FEW: tl.constexpr, SUB: tl.constexpr, RECOMPUTE: tl.constexpr, BOUNDS: tl.constexpr = True,
              DB: tl.constexpr = True):
    """One loop step of _bwd_run: g of rows t+3..t+6 (x rows t..t+6 and dy rows t+3..t+6 loaded),
    their dweight/dbias terms (rows inside the leaf only), and dx of rows t..t+3 from g[t..t+6].

    Returns the accumulators, g of rows t+4..t+6 and the (d, end) of those rows for the next step.
    RECOMPUTE (FEW masked steps of STEP_BRANCH programs): (d, end) of rows t..t+2 come from the
    boundaries in ``seg`` instead (a masked step may follow an unmasked one, which has none).
    ``ids``: the segment indices of rows t .. t + 6 in a many-segment program with per-token
    indices (HAS_CU == SEGMENT_IDS, not FEW): each row's (d, start, end) comes from its window of
    them, and (d, end) of rows t..t+2 too (nothing is carried; the entries past t + 6 that the
    windows of rows t+4..t+6 would need are never used: their dx is the next step's).
    """
    IDS: tl.constexpr = MASKED and (not FEW) and HAS_CU == SEGMENT_IDS
    if IDS:
        i0, i1, i2, i3, i4, i5, i6 = ids
        seg3, seg4, seg5, seg6 = step_windows(i0, i1, i2, i3, i4, i5, i6)
    else:
        seg3 = seg
        seg4 = seg
        seg5 = seg
        seg6 = seg
    g3, d3, s3, e3, a3, a2, a1 = bwd_g_rows(xa0, xa1, xa2, x3, dy3, t + 3, b, w0, w1, w2, w3, cu_ptr, hist_ptr,
                                            cols, cmask, C, n_seg, seq_len, seg3,
                                            HAS_CU, HAS_HIST, MASKED, FEW)
    acc0, acc1, acc2, acc3, accb = _acc_row(acc0, acc1, acc2, acc3, accb, g3, a3, a2, a1, x3, i + 3 < SUB, DB)
    g4, d4, s4, e4, a3, a2, a1 = bwd_g_rows(xa1, xa2, x3, x4, dy4, t + 4, b, w0, w1, w2, w3, cu_ptr, hist_ptr,
                                            cols, cmask, C, n_seg, seq_len, seg4,
                                            HAS_CU, HAS_HIST, MASKED, FEW)
    acc0, acc1, acc2, acc3, accb = _acc_row(acc0, acc1, acc2, acc3, accb, g4, a3, a2, a1, x4, i + 4 < SUB, DB)
    g5, d5, s5, e5, a3, a2, a1 = bwd_g_rows(xa2, x3, x4, x5, dy5, t + 5, b, w0, w1, w2, w3, cu_ptr, hist_ptr,
                                            cols, cmask, C, n_seg, seq_len, seg5,
                                            HAS_CU, HAS_HIST, MASKED, FEW)
    acc0, acc1, acc2, acc3, accb = _acc_row(acc0, acc1, acc2, acc3, accb, g5, a3, a2, a1, x5, i + 5 < SUB, DB)
    g6, d6, s6, e6, a3, a2, a1 = bwd_g_rows(x3, x4, x5, x6, dy6, t + 6, b, w0, w1, w2, w3, cu_ptr, hist_ptr,
                                            cols, cmask, C, n_seg, seq_len, seg6,
                                            HAS_CU, HAS_HIST, MASKED, FEW)
    acc0, acc1, acc2, acc3, accb = _acc_row(acc0, acc1, acc2, acc3, accb, g6, a3, a2, a1, x6, i + 6 < SUB, DB)
    dxp = dx_base + i * sdx
    if MASKED and FEW and RECOMPUTE:
        d0, _, e0 = segment_of_rows(cu_ptr, t, seg, n_seg, seq_len, HAS_CU, True)
        d1, _, e1 = segment_of_rows(cu_ptr, t + 1, seg, n_seg, seq_len, HAS_CU, True)
        d2, _, e2 = segment_of_rows(cu_ptr, t + 2, seg, n_seg, seq_len, HAS_CU, True)
    if IDS:  # dx_rows compares the indices of rows t+j .. t+j+3 itself
        dx_rows(dxp, t, g0, g1, g2, g3, i0, (i0, i1, i2, i3), w0, w1, w2, w3, fut_ptr, cols, cmask, sdx, S, C,
                n_seg, HAS_FUT, MASKED, True, BOUNDS)
        dx_rows(dxp + sdx, t + 1, g1, g2, g3, g4, i1, (i1, i2, i3, i4), w0, w1, w2, w3, fut_ptr, cols, cmask, sdx,
                S, C, n_seg, HAS_FUT, MASKED, True, BOUNDS)
        dx_rows(dxp + 2 * sdx, t + 2, g2, g3, g4, g5, i2, (i2, i3, i4, i5), w0, w1, w2, w3, fut_ptr, cols, cmask,
                sdx, S, C, n_seg, HAS_FUT, MASKED, True, BOUNDS)
        dx_rows(dxp + 3 * sdx, t + 3, g3, g4, g5, g6, i3, (i3, i4, i5, i6), w0, w1, w2, w3, fut_ptr, cols, cmask,
                sdx, S, C, n_seg, HAS_FUT, MASKED, True, BOUNDS)
    else:
        dx_rows(dxp, t, g0, g1, g2, g3, d0, e0, w0, w1, w2, w3, fut_ptr, cols, cmask, sdx, S, C, n_seg,
                HAS_FUT, MASKED, False, BOUNDS)
        dx_rows(dxp + sdx, t + 1, g1, g2, g3, g4, d1, e1, w0, w1, w2, w3, fut_ptr, cols, cmask, sdx, S, C, n_seg,
                HAS_FUT, MASKED, False, BOUNDS)
        dx_rows(dxp + 2 * sdx, t + 2, g2, g3, g4, g5, d2, e2, w0, w1, w2, w3, fut_ptr, cols, cmask, sdx, S, C,
                n_seg, HAS_FUT, MASKED, False, BOUNDS)
        dx_rows(dxp + 3 * sdx, t + 3, g3, g4, g5, g6, d3, e3, w0, w1, w2, w3, fut_ptr, cols, cmask, sdx, S, C,
                n_seg, HAS_FUT, MASKED, False, BOUNDS)
    return acc0, acc1, acc2, acc3, accb, g4, g5, g6, d4, d5, d6, e4, e5, e6


@triton.jit
def _bwd_run(x_ptr, dy_ptr, dx_ptr, cu_ptr, hist_ptr, fut_ptr, p0, rows0, cols, cmask, sx, sdy, sdx, S, C,
             n_seg, seq_len, seg, b, w0, w1, w2, w3,
             HAS_CU: tl.constexpr, HAS_HIST: tl.constexpr, HAS_FUT: tl.constexpr, MASKED: tl.constexpr, FEW: tl.constexpr,
             SUB: tl.constexpr, R: tl.constexpr, BC: tl.constexpr, STAGES: tl.constexpr,
             STEP_BRANCH: tl.constexpr, BOUNDS: tl.constexpr = True, DB: tl.constexpr = True):
    """Walk R leaves from rows0 ([R]); returns the five [R, BC] accumulators (one row per leaf).

    Step i (rows t = rows0 + i .. t + 3) loads x and dy of rows t+3..t+6, computes g of those
    rows and adds their dweight/dbias terms (rows inside the leaf only), then stores dx of rows
    t..t+3 from g[t..t+6]. Rows are added to the accumulators in row order (rows0, rows0 + 1, ...),
    the leaf's fixed order. A loaded row is used in its own step and the next one only: that is
    what lets Triton software-pipeline the loop (loads via shared memory, ``STAGES`` deep); a row
    kept two steps (the dweight window reading x[t-3] of rows loaded two steps earlier) stopped it.
    STEP_BRANCH (a speed choice, same bits): in a FEW masked program, the steps away from every
    boundary run the unmasked body (faster on the H200 at C >= 512 without bias).
    BOUNDS: rows outside [0, S) read as zero and are not stored. Masked programs of many segments
    that touch no such row (rows p0 - 3 .. p_last + 3 inside) run without it: the checks and
    their predicates cost the short-document loop 12 of its 53 instructions per element (sm_90
    SASS), and every value they would mask is in range there, so the bits are the same.
    """
    xm3 = load_rows(x_ptr, rows0 - 3, sx, cols, cmask, S, MASKED and BOUNDS)
    xm2 = load_rows(x_ptr, rows0 - 2, sx, cols, cmask, S, MASKED and BOUNDS)
    xm1 = load_rows(x_ptr, rows0 - 1, sx, cols, cmask, S, MASKED and BOUNDS)
    xa0 = load_rows(x_ptr, rows0, sx, cols, cmask, S, MASKED and BOUNDS)
    xa1 = load_rows(x_ptr, rows0 + 1, sx, cols, cmask, S, MASKED and BOUNDS)
    xa2 = load_rows(x_ptr, rows0 + 2, sx, cols, cmask, S, MASKED and BOUNDS)
    dy0 = load_rows(dy_ptr, rows0, sdy, cols, cmask, S, MASKED and BOUNDS)
    dy1 = load_rows(dy_ptr, rows0 + 1, sdy, cols, cmask, S, MASKED and BOUNDS)
    dy2 = load_rows(dy_ptr, rows0 + 2, sdy, cols, cmask, S, MASKED and BOUNDS)
    acc0 = tl.zeros([R, BC], dtype=tl.float32)
    acc1 = tl.zeros([R, BC], dtype=tl.float32)
    acc2 = tl.zeros([R, BC], dtype=tl.float32)
    acc3 = tl.zeros([R, BC], dtype=tl.float32)
    accb = tl.zeros([R, BC], dtype=tl.float32)
    # Many segments with per-token indices: the indices of rows t..t+2 are carried from step to
    # step, those of rows t+3..t+6 loaded with x and dy (placeholders otherwise; nothing reads them).
    IDS: tl.constexpr = MASKED and (not FEW) and HAS_CU == SEGMENT_IDS
    if IDS:
        im3 = load_ids(cu_ptr, rows0 - 3, n_seg, seq_len, BOUNDS)
        im2 = load_ids(cu_ptr, rows0 - 2, n_seg, seq_len, BOUNDS)
        im1 = load_ids(cu_ptr, rows0 - 1, n_seg, seq_len, BOUNDS)
        i0 = load_ids(cu_ptr, rows0, n_seg, seq_len, BOUNDS)
        i1 = load_ids(cu_ptr, rows0 + 1, n_seg, seq_len, BOUNDS)
        i2 = load_ids(cu_ptr, rows0 + 2, n_seg, seq_len, BOUNDS)
        # the rows after rows0 + 2 are not needed here: (d, end) of rows t..t+2 are the step's
        seg0, seg1, seg2, _unused = step_windows(im3, im2, im1, i0, i1, i2, i2)
    else:
        i0 = rows0 * 0
        i1 = rows0 * 0
        i2 = rows0 * 0
        seg0 = seg
        seg1 = seg
        seg2 = seg
    g0, d0, s0, e0, a3, a2, a1 = bwd_g_rows(xm3, xm2, xm1, xa0, dy0, rows0, b, w0, w1, w2, w3, cu_ptr, hist_ptr,
                                            cols, cmask, C, n_seg, seq_len, seg0,
                                            HAS_CU, HAS_HIST, MASKED, FEW)
    acc0, acc1, acc2, acc3, accb = _acc_row(acc0, acc1, acc2, acc3, accb, g0, a3, a2, a1, xa0, True, DB)
    g1, d1, s1, e1, a3, a2, a1 = bwd_g_rows(xm2, xm1, xa0, xa1, dy1, rows0 + 1, b, w0, w1, w2, w3, cu_ptr, hist_ptr,
                                            cols, cmask, C, n_seg, seq_len, seg1,
                                            HAS_CU, HAS_HIST, MASKED, FEW)
    acc0, acc1, acc2, acc3, accb = _acc_row(acc0, acc1, acc2, acc3, accb, g1, a3, a2, a1, xa1, True, DB)
    g2, d2, s2, e2, a3, a2, a1 = bwd_g_rows(xm1, xa0, xa1, xa2, dy2, rows0 + 2, b, w0, w1, w2, w3, cu_ptr, hist_ptr,
                                            cols, cmask, C, n_seg, seq_len, seg2,
                                            HAS_CU, HAS_HIST, MASKED, FEW)
    acc0, acc1, acc2, acc3, accb = _acc_row(acc0, acc1, acc2, acc3, accb, g2, a3, a2, a1, xa2, True, DB)
    x_base = row_ptrs(x_ptr, rows0, sx, cols)
    dy_base = row_ptrs(dy_ptr, rows0, sdy, cols)
    dx_base = row_ptrs(dx_ptr, rows0, sdx, cols)
    if MASKED and FEW and STEP_BRANCH:
        dirty = dirty_steps(seg, p0, S, R, SUB)
    for i in tl.range(0, SUB, 4, num_stages=STAGES):
        t = rows0 + i
        xp = x_base + i * sx
        dyp = dy_base + i * sdy
        x3 = load_at(xp + 3 * sx, t + 3, cmask, S, MASKED and BOUNDS)
        x4 = load_at(xp + 4 * sx, t + 4, cmask, S, MASKED and BOUNDS)
        x5 = load_at(xp + 5 * sx, t + 5, cmask, S, MASKED and BOUNDS)
        x6 = load_at(xp + 6 * sx, t + 6, cmask, S, MASKED and BOUNDS)
        dy3 = load_at(dyp + 3 * sdy, t + 3, cmask, S, MASKED and BOUNDS)
        dy4 = load_at(dyp + 4 * sdy, t + 4, cmask, S, MASKED and BOUNDS)
        dy5 = load_at(dyp + 5 * sdy, t + 5, cmask, S, MASKED and BOUNDS)
        dy6 = load_at(dyp + 6 * sdy, t + 6, cmask, S, MASKED and BOUNDS)
        i3, i4, i5, i6 = load_ids4(cu_ptr, t, n_seg, seq_len, i0, 3, IDS, BOUNDS)
        ids = (i0, i1, i2, i3, i4, i5, i6)
        if MASKED and FEW and STEP_BRANCH:
            # Few segments: only the steps next to a boundary (or reaching row S) take the masked
            # body; the others run the unmasked one, which computes the same bits there.
            if ((dirty >> (i // 4)) & 1) == 0:
                acc0, acc1, acc2, acc3, accb, g4, g5, g6, d4, d5, d6, e4, e5, e6 = _bwd_step(
                    xa0, xa1, xa2, x3, x4, x5, x6, dy3, dy4, dy5, dy6, g0, g1, g2, d0, d1, d2, e0, e1, e2,
                    acc0, acc1, acc2, acc3, accb, t, i, dx_base, b, w0, w1, w2, w3, cu_ptr, hist_ptr, fut_ptr,
                    cols, cmask, sdx, S, C, n_seg, seq_len, seg, ids, HAS_CU, HAS_HIST, HAS_FUT, False, False, SUB, True, BOUNDS, DB)
            else:
                acc0, acc1, acc2, acc3, accb, g4, g5, g6, d4, d5, d6, e4, e5, e6 = _bwd_step(
                    xa0, xa1, xa2, x3, x4, x5, x6, dy3, dy4, dy5, dy6, g0, g1, g2, d0, d1, d2, e0, e1, e2,
                    acc0, acc1, acc2, acc3, accb, t, i, dx_base, b, w0, w1, w2, w3, cu_ptr, hist_ptr, fut_ptr,
                    cols, cmask, sdx, S, C, n_seg, seq_len, seg, ids, HAS_CU, HAS_HIST, HAS_FUT, True, True, SUB, True, BOUNDS, DB)
        else:
            acc0, acc1, acc2, acc3, accb, g4, g5, g6, d4, d5, d6, e4, e5, e6 = _bwd_step(
                xa0, xa1, xa2, x3, x4, x5, x6, dy3, dy4, dy5, dy6, g0, g1, g2, d0, d1, d2, e0, e1, e2,
                acc0, acc1, acc2, acc3, accb, t, i, dx_base, b, w0, w1, w2, w3, cu_ptr, hist_ptr, fut_ptr,
                cols, cmask, sdx, S, C, n_seg, seq_len, seg, ids, HAS_CU, HAS_HIST, HAS_FUT, MASKED, FEW, SUB, False, BOUNDS, DB)
        xa0 = x4
        xa1 = x5
        xa2 = x6
        g0 = g4
        g1 = g5
        g2 = g6
        i0 = i4
        i1 = i5
        i2 = i6
        if not (FEW and STEP_BRANCH) and not IDS:  # those recompute (d, end) of their rows: nothing to carry
            d0 = d4
            d1 = d5
            d2 = d6
            e0 = e4
            e1 = e5
            e2 = e6
    return acc0, acc1, acc2, acc3, accb


@triton.jit(do_not_specialize=["S", "C8", "n_seg", "seq_len"])
def cake_conv_bwd_kernel(x_ptr, dy_ptr, dx_ptr, w_ptr, b_ptr, cu_ptr, hist_ptr, fut_ptr, ws_ptr,
                         S, C8, n_seg, seq_len,
                         SX8: tl.constexpr, SDY8: tl.constexpr, SDX8: tl.constexpr,
                         HAS_BIAS: tl.constexpr, HAS_CU: tl.constexpr, HAS_HIST: tl.constexpr, HAS_FUT: tl.constexpr,
                         R: tl.constexpr, LOGR: tl.constexpr, SUB: tl.constexpr, BC: tl.constexpr,
                         STAGES: tl.constexpr, STEP_BRANCH: tl.constexpr):
    """dx rows and the dweight/dbias partial of R adjacent leaves (rows [p0, p0 + R * SUB)).

    Grid: (cdiv(S, R * SUB) * cdiv(C, BC),), channel blocks fastest. SX8, SDY8, SDX8: row
    strides / 8, compile-time constants (a loop step's rows are one base address plus immediate
    offsets). Writes ws[pid_s, k, c] (k = 0..3 taps, 4 = bias), the level-LOGR node of the
    pairwise leaf tree. ``hist`` [N, 3, C] (HAS_HIST) and ``fut`` [N, 3, C]
    FP32 (HAS_FUT) hold the x rows before and the g rows after each segment (KCP). Without HAS_FUT
    the last rows of a segment get dx without the look-ahead terms: KCP then rewrites them with
    cake_conv_bwd_dx_rows_kernel once fut has arrived (the exchange overlaps this kernel).
    """
    if not INTERPRET:
        # the group kernel that follows may launch once every program has started (it waits for
        # this kernel's results before reading any: programmatic dependent launch)
        gdc_launch_dependents()
    C = C8 * 8
    # 1-D grid, channel blocks fastest: the programs of one row block run side by side and
    # read whole rows together.
    n_cblk = tl.cdiv(C, BC)
    pid_s = tl.program_id(0) // n_cblk
    pid_c = tl.program_id(0) % n_cblk
    sx: tl.constexpr = SX8 * 8
    sdy: tl.constexpr = SDY8 * 8
    sdx: tl.constexpr = SDX8 * 8
    cols = pid_c * BC + tl.arange(0, BC)
    cmask = cols < C
    b, w0, w1, w2, w3 = load_taps(w_ptr, b_ptr, cols, cmask, HAS_BIAS, BC)
    p0 = pid_s * (R * SUB)
    p_last = p0 + R * SUB - 1
    rows0 = p0 + tl.arange(0, R) * SUB
    # Taps reach 3 rows back, the g look-ahead 3 rows forward.
    n_lo, masked = window_has_boundary(cu_ptr, n_seg, p0 - 3, p_last + 3, seq_len, HAS_CU)
    if masked:
        d_lo = tl.maximum(n_lo - 1, 0)
        d_hi = count_bounds_le(cu_ptr, n_seg, p_last + 3, seq_len, HAS_CU) - 1
        seg = segment_window(cu_ptr, n_seg, d_lo, d_hi, seq_len, HAS_CU)
        if d_hi - d_lo < FEW_SEGMENTS:
            acc0, acc1, acc2, acc3, accb = _bwd_run(
                x_ptr, dy_ptr, dx_ptr, cu_ptr, hist_ptr, fut_ptr, p0, rows0, cols, cmask, sx, sdy, sdx, S, C,
                n_seg, seq_len, seg, b, w0, w1, w2, w3, HAS_CU, HAS_HIST, HAS_FUT, True, True, SUB, R, BC, STAGES, STEP_BRANCH,
                DB=HAS_BIAS)
        elif (p0 - 3 < 0) | (p_last + 3 >= S):  # reads rows outside [0, S): the first or last row block
            # Not software-pipelined (1 stage): a fourth pipelined loop made the kernel's shared memory
            # twice that of one loop's buffers (Triton 3.6's allocator placed two loops' apart).
            acc0, acc1, acc2, acc3, accb = _bwd_run(
                x_ptr, dy_ptr, dx_ptr, cu_ptr, hist_ptr, fut_ptr, p0, rows0, cols, cmask, sx, sdy, sdx, S, C,
                n_seg, seq_len, seg, b, w0, w1, w2, w3, HAS_CU, HAS_HIST, HAS_FUT, True, False, SUB, R, BC, 1, STEP_BRANCH,
                True, DB=HAS_BIAS)
        else:  # many segments away from both ends (short documents): no row bounds to check
            acc0, acc1, acc2, acc3, accb = _bwd_run(
                x_ptr, dy_ptr, dx_ptr, cu_ptr, hist_ptr, fut_ptr, p0, rows0, cols, cmask, sx, sdy, sdx, S, C,
                n_seg, seq_len, seg, b, w0, w1, w2, w3, HAS_CU, HAS_HIST, HAS_FUT, True, False, SUB, R, BC, STAGES, STEP_BRANCH,
                False, DB=HAS_BIAS)
    else:
        no_seg = (n_lo, n_lo, 0, 0, 0, 0, 0, 0)  # unused: no row needs its segment
        acc0, acc1, acc2, acc3, accb = _bwd_run(
            x_ptr, dy_ptr, dx_ptr, cu_ptr, hist_ptr, fut_ptr, p0, rows0, cols, cmask, sx, sdy, sdx, S, C,
            n_seg, seq_len, no_seg, b, w0, w1, w2, w3, HAS_CU, HAS_HIST, HAS_FUT, False, False, SUB, R, BC, STAGES, STEP_BRANCH,
            DB=HAS_BIAS)
    base = ws_ptr + pid_s.to(tl.int64) * 5 * C + cols
    tl.store(base + 0 * C, pairwise_sum_rows(acc0, R, BC, LOGR), mask=cmask)
    tl.store(base + 1 * C, pairwise_sum_rows(acc1, R, BC, LOGR), mask=cmask)
    tl.store(base + 2 * C, pairwise_sum_rows(acc2, R, BC, LOGR), mask=cmask)
    tl.store(base + 3 * C, pairwise_sum_rows(acc3, R, BC, LOGR), mask=cmask)
    tl.store(base + 4 * C, pairwise_sum_rows(accb, R, BC, LOGR), mask=cmask)


@triton.jit
def is_last_ticket(ticket_ptr, i, n):
    """Draw a ticket of counter i (an int32 that is 0 when the launch starts) after this program's
    stores; true in the one program of the n sharing the counter that draws the last (n - 1), and
    which then sees every store the other n - 1 made before drawing theirs: the threads meet at a
    barrier after their stores, and the ticket is an acquire-release atomic at GPU scope (the last
    program must read what they wrote with ``.cg`` loads, from L2, not a stale L1 line)."""
    tl.debug_barrier()
    ticket = tl.atomic_add(ticket_ptr + i, 1, sem="acq_rel", scope="gpu")
    return ticket == n - 1


@triton.jit
def reset_ticket(ticket_ptr, i):
    """Set counter i back to 0 for the next launch on the stream (the last program, when done)."""
    tl.atomic_xchg(ticket_ptr + i, 0, sem="relaxed", scope="gpu")


@triton.jit(do_not_specialize=["S", "C8", "n_seg", "seq_len"])
def cake_conv_bwd_one_group_kernel(x_ptr, dy_ptr, dx_ptr, w_ptr, b_ptr, cu_ptr, hist_ptr, fut_ptr, ws_ptr,
                                   dw_ptr, db_ptr, ticket_ptr,
                                   S, C8, n_seg, seq_len,
                                   SX8: tl.constexpr, SDY8: tl.constexpr, SDX8: tl.constexpr,
                                   HAS_BIAS: tl.constexpr, HAS_CU: tl.constexpr, HAS_HIST: tl.constexpr,
                                   HAS_FUT: tl.constexpr, R: tl.constexpr, LOGR: tl.constexpr, SUB: tl.constexpr,
                                   BC: tl.constexpr, STAGES: tl.constexpr, STEP_BRANCH: tl.constexpr,
                                   M: tl.constexpr, LOGM: tl.constexpr, EPI_BC: tl.constexpr):
    """``cake_conv_bwd_kernel`` (called here, inlined) for one group of the dweight tree (S <= TREE_LEAVES * BWD_SUB rows),
    which then also writes dweight and dbias: one launch for the whole backward.

    Every program writes its node as the main kernel does, then takes a ticket of its channel
    block: ``ticket[pid_c]``, an int32 counter that is 0 when the launch starts. The program that
    draws the last ticket (n_nodes - 1) is the only one left, and every node of its channel block
    is written; it adds them as the group kernel adds a group,

        dw[c, k] = pairwise tree over nodes i = 0..M-1 of ws[i, k, c]   (missing nodes read as 0;
        db[c]    = the same with k = 4)                                  M = TREE_LEAVES / R),

    the documented order of one group: step 3 over one group would add only +0.0 terms to it
    (and 0 + the block sum), and a sum that starts from +0.0, as every node's does, is never -0.0 (in
    round-to-nearest, x + y = -0.0 needs both -0.0), so it would return the group sum unchanged.
    The ticket decides which program adds, never the order of the additions. It writes them in
    dw's / db's dtype and sets its counter back to 0 for the next launch on the stream (launch.py
    keeps the counters per device and stream; a CUDA graph and the custom ops take theirs from the
    workspace, zeroed by a memset).

    Ordering: ``is_last_ticket`` (the last program's ``.cg`` loads see every node). EPI_BC:
    channels added per step of the last program (bounds its [M, EPI_BC] registers).
    """
    cake_conv_bwd_kernel(x_ptr, dy_ptr, dx_ptr, w_ptr, b_ptr, cu_ptr, hist_ptr, fut_ptr, ws_ptr, S, C8, n_seg, seq_len,
                         SX8, SDY8, SDX8, HAS_BIAS, HAS_CU, HAS_HIST, HAS_FUT, R, LOGR, SUB, BC, STAGES, STEP_BRANCH)
    C = C8 * 8
    n_cblk = tl.cdiv(C, BC)
    pid_c = tl.program_id(0) % n_cblk
    n_nodes = tl.cdiv(S, R * SUB)
    if is_last_ticket(ticket_ptr, pid_c, n_nodes):
        nodes = tl.arange(0, M)
        node_off = nodes.to(tl.int64)[:, None] * 5 * C
        nmask = (nodes < n_nodes)[:, None]
        for j in tl.static_range(BC // EPI_BC):
            cols = pid_c * BC + j * EPI_BC + tl.arange(0, EPI_BC)
            cm = cols < C
            for k in tl.static_range(4):
                v = tl.load(ws_ptr + node_off + k * C + cols[None, :], mask=nmask & cm[None, :], other=0.0,
                            cache_modifier=".cg")
                tl.store(dw_ptr + cols * 4 + k, pairwise_sum_rows(v, M, EPI_BC, LOGM).to(dw_ptr.dtype.element_ty),
                         mask=cm)
            if HAS_BIAS:
                v = tl.load(ws_ptr + node_off + 4 * C + cols[None, :], mask=nmask & cm[None, :], other=0.0,
                            cache_modifier=".cg")
                tl.store(db_ptr + cols, pairwise_sum_rows(v, M, EPI_BC, LOGM).to(db_ptr.dtype.element_ty), mask=cm)
        reset_ticket(ticket_ptr, pid_c)


@triton.jit(do_not_specialize=["n_nodes", "n_leaves", "n_groups", "C"])
def cake_conv_bwd_group_kernel(ws_ptr, dw_ptr, db_ptr, ticket_ptr, n_nodes, n_leaves, n_groups, C,
                               HAS_BIAS: tl.constexpr, M: tl.constexpr, LOGM: tl.constexpr, BLK: tl.constexpr,
                               GB: tl.constexpr, LOGGB: tl.constexpr):
    """Steps 2 and 3 of the order (module docstring), two or more groups, one launch after the main kernel.

    Columns j < 5 C of the partials: j = k * C + c, tap k of channel c (k = 4: the bias). Program
    (g, pj) adds group g in the columns j of block pj (BLK of them),

        gs[g, j] = pairwise tree over i = 0..M-1 of ws[g * M + i, j]   (missing nodes read as 0;
                                                                        M = TREE_LEAVES / R),

    into the group sums (ws + n_leaves * 5 C), then takes a ticket of its column block:
    ``ticket[pj]``, an int32 counter that is 0 when the launch starts. The program drawing the last
    one (n_groups - 1) is the only one of its column block left, with every group sum of its
    columns written; it adds them as the documented order does,

        total[j] = 0 + T(block 0) + T(block 1) + ...   T: pairwise tree over GB groups (missing: 0)
        dw[c, k] = total[j] (k < 4),   db[c] = total[j] (k = 4, HAS_BIAS)

    in dw's / db's dtype, and sets its counter back to 0 for the next launch on the stream (the
    counters: launch.py, ``TicketCounters``). The ticket decides which program adds, never the order
    of the additions. Ordering: ``is_last_ticket`` (the last program's ``.cg`` loads see every
    group sum).

    Launched as a programmatic dependent of the main kernel (its launch overlaps the main kernel's
    last programs): it waits for the main kernel's results (``gdc_wait``) before reading anything.
    Grid: (G, cdiv(5 C, BLK)).
    """
    if not INTERPRET:
        gdc_wait()
    g = tl.program_id(0)
    pj = tl.program_id(1)
    C5 = 5 * C
    cols = pj * BLK + tl.arange(0, BLK)
    cm = cols < C5
    nodes = g * M + tl.arange(0, M)
    offs = nodes.to(tl.int64)[:, None] * C5 + cols[None, :]
    v = tl.load(ws_ptr + offs, mask=(nodes < n_nodes)[:, None] & cm[None, :], other=0.0)
    gsum = pairwise_sum_rows(v, M, BLK, LOGM)
    gs_ptr = ws_ptr + tl.cast(C, tl.int64) * 5 * n_leaves  # (tl.cast: either may be a compile-time 1)
    tl.store(gs_ptr + g.to(tl.int64) * C5 + cols, gsum, mask=cm)
    if is_last_ticket(ticket_ptr, pj, n_groups):
        total = tl.zeros([BLK], dtype=tl.float32)
        blk0 = 0 * n_groups
        while blk0 < n_groups:  # a while loop: the CPU interpreter cannot range() over a tensor
            gi = blk0 + tl.arange(0, GB)
            goffs = gi.to(tl.int64)[:, None] * C5 + cols[None, :]
            gv = tl.load(gs_ptr + goffs, mask=(gi < n_groups)[:, None] & cm[None, :], other=0.0, cache_modifier=".cg")
            total += pairwise_sum_rows(gv, GB, BLK, LOGGB)
            blk0 += GB
        k = cols // C
        c = cols - k * C
        tl.store(dw_ptr + c * 4 + k, total.to(dw_ptr.dtype.element_ty), mask=cm & (k < 4))
        if HAS_BIAS:
            tl.store(db_ptr + c, total.to(db_ptr.dtype.element_ty), mask=cm & (k == 4))
        reset_ticket(ticket_ptr, pj)


@triton.jit(do_not_specialize=["n_rows", "S", "C8", "n_seg"])
def cake_conv_bwd_head_kernel(x_ptr, dy_ptr, w_ptr, b_ptr, cu_ptr, hist_ptr, rows_ptr, g_ptr,
                              n_rows, S, C8, n_seg,
                              SX8: tl.constexpr, SDY8: tl.constexpr, SG: tl.constexpr,
                              HAS_BIAS: tl.constexpr, RB: tl.constexpr, BC: tl.constexpr):
    """g[i, c] = dy[t] * silu'(pre[t]) in FP32 for the listed local rows t = rows[i] (KCP).

    The rows whose g another fragment's dx needs (its look-ahead across a rank boundary). The same
    helpers and FMA sequence as the main backward kernel, so the bits are those it computes for
    the same rows. Grid: (cdiv(n_rows, RB), cdiv(C, BC)); ``cu`` are the local segment
    boundaries, ``hist`` [N, 3, C] the x rows before each segment.
    """
    C, cols, cmask, b, w0, w1, w2, w3, i, imask, t = row_list_setup(w_ptr, b_ptr, rows_ptr, n_rows, S, C8,
                                                                    HAS_BIAS, RB, BC)
    sx: tl.constexpr = SX8 * 8
    sdy: tl.constexpr = SDY8 * 8
    a3, a2, a1, a0 = load_window(x_ptr, t, sx, cols, cmask, S)
    dy = load_rows(dy_ptr, t, sdy, cols, cmask, S, True)
    seg = segment_window(cu_ptr, n_seg, 0, n_seg - 1, S, True)
    g, d, start, end, _, _, _ = bwd_g_rows(a3, a2, a1, a0, dy, t, b, w0, w1, w2, w3, cu_ptr, hist_ptr, cols, cmask,
                                           C, n_seg, S, seg, True, True, True, False)
    offs = i.to(tl.int64)[:, None] * SG + cols[None, :]
    tl.store(g_ptr + offs, g, mask=imask[:, None] & cmask[None, :])


@triton.jit(do_not_specialize=["n_rows", "S", "C8", "n_seg"])
def cake_conv_bwd_dx_rows_kernel(x_ptr, dy_ptr, dx_ptr, w_ptr, b_ptr, cu_ptr, hist_ptr, fut_ptr, rows_ptr,
                                 n_rows, S, C8, n_seg,
                                 SX8: tl.constexpr, SDY8: tl.constexpr, SDX8: tl.constexpr,
                                 HAS_BIAS: tl.constexpr, RB: tl.constexpr, BC: tl.constexpr):
    """dx of the listed local rows t = rows[i] with the look-ahead halo ``fut`` (KCP).

    The last rows of each segment whose document goes on elsewhere: g[t..t+3] recomputed with the
    main kernel's helpers (same bits), rows past the segment taken from fut, and the same FMA
    sequence for dx. Grid: (cdiv(n_rows, RB), cdiv(C, BC)).
    """
    C, cols, cmask, b, w0, w1, w2, w3, i, imask, t = row_list_setup(w_ptr, b_ptr, rows_ptr, n_rows, S, C8,
                                                                    HAS_BIAS, RB, BC)
    sx: tl.constexpr = SX8 * 8
    sdy: tl.constexpr = SDY8 * 8
    sdx: tl.constexpr = SDX8 * 8
    xm3, xm2, xm1, x0 = load_window(x_ptr, t, sx, cols, cmask, S)
    x1 = load_rows(x_ptr, t + 1, sx, cols, cmask, S, True)
    x2 = load_rows(x_ptr, t + 2, sx, cols, cmask, S, True)
    x3 = load_rows(x_ptr, t + 3, sx, cols, cmask, S, True)
    dy0 = load_rows(dy_ptr, t, sdy, cols, cmask, S, True)
    dy1 = load_rows(dy_ptr, t + 1, sdy, cols, cmask, S, True)
    dy2 = load_rows(dy_ptr, t + 2, sdy, cols, cmask, S, True)
    dy3 = load_rows(dy_ptr, t + 3, sdy, cols, cmask, S, True)
    seg = segment_window(cu_ptr, n_seg, 0, n_seg - 1, S, True)
    g0, d0, s0, e0, _, _, _ = bwd_g_rows(xm3, xm2, xm1, x0, dy0, t, b, w0, w1, w2, w3, cu_ptr, hist_ptr, cols, cmask,
                                C, n_seg, S, seg, True, True, True, False)
    g1, d1, s1, e1, _, _, _ = bwd_g_rows(xm2, xm1, x0, x1, dy1, t + 1, b, w0, w1, w2, w3, cu_ptr, hist_ptr, cols, cmask,
                                C, n_seg, S, seg, True, True, True, False)
    g2, d2, s2, e2, _, _, _ = bwd_g_rows(xm1, x0, x1, x2, dy2, t + 2, b, w0, w1, w2, w3, cu_ptr, hist_ptr, cols, cmask,
                                C, n_seg, S, seg, True, True, True, False)
    g3, d3, s3, e3, _, _, _ = bwd_g_rows(x0, x1, x2, x3, dy3, t + 3, b, w0, w1, w2, w3, cu_ptr, hist_ptr, cols, cmask,
                                C, n_seg, S, seg, True, True, True, False)
    dx_rows(row_ptrs(dx_ptr, t, sdx, cols), t, g0, g1, g2, g3, d0, e0, w0, w1, w2, w3, fut_ptr, cols, cmask, sdx, S, C, n_seg,
            True, True)
