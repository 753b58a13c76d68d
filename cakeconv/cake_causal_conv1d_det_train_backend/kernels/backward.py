"""Triton backward kernels: one pass for dx and FP32 dweight/dbias partials, then a fixed-order sum.

Shape legend: S packed tokens, C channels, N segments, R sub-runs per program, BC channels per
program, W taps (2..8, compile-time), H = W - 1 halo rows, L leaves (sub-runs of the SUB rows of
launch.leaf_tree(W): BWD_SUB up to W = 4, 2 BWD_SUB from W = 5), G groups of 8,192 rows.

Math (FP32, pre recomputed in registers, never read from memory):

    g[t]     = dy[t] * s * (1 + pre[t] * (1 - s)),  s = sigmoid(pre[t])   (ACT = 1: SiLU)
    g[t]     = dy[t]                                                       (ACT = 0: no activation)
    dx[t]    = w[W-1] g[t] + w[W-2] g[t+1] + ... + w[0] g[t+H]   (FMAs in this order; same segment,
                                                                  else 0 / the look-ahead halo)
    dw[c, k] = sum_t g[t, c] * x[t - H + k, c],   db[c] = sum_t g[t, c]

The dweight/dbias sum has ONE order, fixed by S and W alone (never by a tuning choice):
  1. each leaf (SUB consecutive rows) accumulates its rows in row order with FMAs;
  2. the leaves of each aligned group (8,192 rows: 8192 / SUB leaves) are added as a pairwise tree;
  3. the group sums of each aligned block of GROUP_BLOCK groups are added as a pairwise tree
     (missing groups count as zero), and the block sums in block order (one block up to
     S = 2**19 = 524,288 tokens).
A program that owns R = 2**j adjacent leaves adds them with the bottom j levels of that same tree
before writing (fewer partial bytes); the group kernel finishes the tree from level j. So R, BC and
the warp count change speed, never bits.

Launches: S <= 8,192 rows (one group, every W) take one, the one-group kernel, whose last
program per channel block (by ticket) finishes the tree; more groups take two, the main kernel
and the group kernel, whose last program per column block (by ticket) adds the group sums.
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .common import (
    INTERPRET,
    act_grad,
    conv_pre,
    halo_window,
    ids_windows,
    window_has_boundary,
    halo_tap,
    load_rows,
    repeated,
    row_offset,
    load_window,
    row_list_setup,
    pairwise_sum_rows,
    FEW_SEGMENTS,
    SEGMENT_IDS,
    history_flags,
    load_ids,
    load_ids_rows,
    segment_of_rows,
    segment_window,
    store_at,
    load_at,
    row_ptrs,
    program_rows,
    program_segments,
    rows_ahead,
)

# Rows per leaf of the dweight tree up to W = 4 (fixed: part of the summation order; from W = 5 twice
# that, launch.leaf_tree). 64, not 32: a leaf's sub-run re-reads H x rows before and H x and dy rows
# after it and recomputes H rows of g; 64-row leaves halve that (faster on the H200 at W = 4).
BWD_SUB = 64
TREE_LEAVES = 128  # leaves per group of the pairwise tree up to W = 4 (fixed: part of the order)
LOG2_TREE_LEAVES = 7
GROUP_BLOCK = 64  # group sums added as one pairwise tree per block of 64 groups (fixed)
LOG2_GROUP_BLOCK = 6


@triton.jit
def bwd_g_rows(win, dy, t, b, ws, cu_ptr, hist_ptr, cols, cmask, C, n_seg, seq_len, seg,
               HAS_CU: tl.constexpr, HAS_HIST: tl.constexpr, MASKED: tl.constexpr, FEW: tl.constexpr,
               ACT: tl.constexpr):
    """g = dy * act'(pre) for rows t from their x window ``win`` (rows t - H .. t); also (d, start,
    end) of their segments when MASKED, and the window after the segment/halo rule (the x rows
    that pre read, the dweight terms' factors)."""
    H: tl.constexpr = len(ws) - 1
    if MASKED:
        d, pos, ins, end = history_flags(cu_ptr, t, seg, n_seg, seq_len, HAS_CU, HAS_HIST, FEW, H)
        start = t - pos
        win = halo_window(win, ins, pos, d, hist_ptr, cols, cmask, C, n_seg, HAS_HIST, H)
    else:
        d = t * 0
        start = t * 0
        end = t * 0
    pre = conv_pre(b, ws, win)
    g = act_grad(dy, pre, ACT)
    return g, d, start, end, win


@triton.jit
def dx_rows(dxp, t, gwin, d, end, ws, fut_ptr, cols, cmask, sdx, S, C, n_seg,
            HAS_FUT: tl.constexpr, MASKED: tl.constexpr, AHEAD_IDS: tl.constexpr = False,
            BOUNDS: tl.constexpr = True, ACT: tl.constexpr = 1):
    """dx[t] = w[H] g[t] + w[H-1] g[t+1] + ... + w[0] g[t+H] (FMAs in this order), stored;
    ``gwin`` holds g of rows t .. t + H.

    Where t + k leaves the segment, g[t + k] is zero, or the look-ahead halo ``fut[d, k-1-q]``
    (q: the rows after t inside its segment). AHEAD_IDS: ``end`` is instead the tuple of the
    segment indices of rows t .. t + H, and "t + k inside" is their comparison (q clamped to H,
    counted only for a halo). ACT (the kernel's activation) only picks how those are compared.
    """
    H: tl.constexpr = len(ws) - 1
    if MASKED:
        ins = ()
        if AHEAD_IDS:
            # (as history_flags does for rows before t; not one helper: the comparisons' order
            # differs, and a shared order changes the SASS of the KCP variant with indices)
            for k in tl.static_range(1, H + 1):
                if H > 4 and (ACT == 1 or H > 6):
                    # The same flag as ==, the indices never decreasing, but a comparison of its own: not
                    # merged with history_flags' == of the same two rows, whose merged flag lives across
                    # the step. There the compiler kept such flags as bits of general registers (two LOP3
                    # to store one, one to read it back): sm_90 SASS of the short-document loop at C = 512,
                    # W = 6 / 7 / 8 with SiLU and W = 8 without, 7-12% fewer instructions this way; W = 6
                    # and 7 without activation 3-5% more (notes 3.7).
                    ins = ins + (end[0] >= end[k],)
                else:
                    ins = ins + (end[k] == end[0],)
            if HAS_FUT:
                q = ins[0].to(tl.int32)
                for k in tl.static_range(2, H + 1):
                    q = q + ins[k - 1].to(tl.int32)
            else:
                q = t * 0  # halo_tap reads no halo without one
        else:
            q = end - 1 - t
            for k in tl.static_range(1, H + 1):
                ins = ins + (q >= k,)
        masked = (gwin[0],)
        for k in tl.static_range(1, H + 1):
            masked = masked + (halo_tap(gwin[k], ins[k - 1], (k - 1) - q, d, fut_ptr, cols, cmask, C, n_seg, HAS_FUT,
                                        H),)
        gwin = masked
    dx = ws[H] * gwin[0]
    for k in tl.static_range(1, H + 1):
        dx = tl.fma(ws[H - k], gwin[k], dx)
    store_at(dxp, t, dx, cmask, S, MASKED and BOUNDS)


@triton.jit
def _acc_row(accs, accb, g, win, inside, DB: tl.constexpr):
    """Add row terms g * x[t-H+k] (win[k]) and g to the dweight/dbias accumulators when ``inside``
    (a scalar: the row belongs to the program's leaves), else leave them untouched (exactly).
    Without DB (no bias) the dbias accumulator stays zero: nothing reads its sum then, and the
    row loops save one add per element."""
    out = ()
    for k in tl.static_range(len(accs)):
        out = out + (tl.where(inside, tl.fma(g, win[k], accs[k]), accs[k]),)
    if DB:
        accb = tl.where(inside, accb + g, accb)
    return out, accb


@triton.jit
def dirty_steps(seg, p0, S, R: tl.constexpr, SUB: tl.constexpr, H: tl.constexpr, STEP: tl.constexpr):
    """Bits (int64) of the loop steps of a FEW masked program that need the masked body.

    Step k reads rows t .. t + H + STEP - 1 of every leaf r (t = p0 + r * SUB + STEP k) and writes
    rows t .. t + STEP - 1. It needs the masked body when a boundary c_j of ``seg`` lies in
    (t, t + H + STEP - 1] (a row it writes and a row it reads are in different segments), or when
    row t + H + STEP - 1 of the last leaf is at or past S. Every other step sees one segment in all
    its rows, where the unmasked body computes the same bits.
    """
    d_lo, d_hi, n_iter, c0, c1, c2, c3, c4 = seg
    bits = _boundary_steps(c1, p0, R, SUB, H, STEP)
    bits |= _boundary_steps(c2, p0, R, SUB, H, STEP)
    bits |= _boundary_steps(c3, p0, R, SUB, H, STEP)
    bits |= _boundary_steps(c4, p0, R, SUB, H, STEP)
    # steps k with p0 + (R - 1) * SUB + STEP k + H + STEP - 1 >= S, i.e. k >= ceil(m / STEP)
    m = S - p0 - (R - 1) * SUB - (H + STEP - 1)
    k_s = ((tl.minimum(tl.maximum(m, 0), SUB) + (STEP - 1)) // STEP).to(tl.int64)
    one = tl.full((), 1, tl.int64)
    all_bits = (one << (SUB // STEP)) - 1
    return bits | (all_bits - ((one << k_s) - 1))


@triton.jit
def _boundary_steps(c, p0, R: tl.constexpr, SUB: tl.constexpr, H: tl.constexpr, STEP: tl.constexpr):
    """Bits of the steps k (t = p0 + r * SUB + STEP k, some leaf r) with t < c <= t + H + STEP - 1."""
    one = tl.full((), 1, tl.int64)
    bits = one * 0
    for r in tl.static_range(R):
        # int64, and k clamped into [0, SUB / STEP] before shifting: a far boundary (INT_MAX past
        # cu[N]) must neither overflow nor shift by 64 or more (undefined, even where unselected)
        rel = c.to(tl.int64) - p0 - r * SUB
        lo = rel - (H + STEP - 1)  # STEP k in [lo, hi]
        hi = rel - 1
        k_lo = (tl.minimum(tl.maximum(lo, 0), SUB) + (STEP - 1)) // STEP
        k_hi = tl.minimum(tl.maximum(hi, 0), SUB - STEP) // STEP
        hit = (hi >= 0) & (lo <= SUB - STEP) & (k_lo <= k_hi)
        bits |= tl.where(hit, (one << (k_hi + 1)) - (one << k_lo), 0)
    return bits


@triton.jit
def _bwd_step(xs, dys, gs, ds, es, accs, accb, t, i, dx_base, b, ws, cu_ptr, hist_ptr, fut_ptr,
              cols, cmask, sdx, S, C, n_seg, seq_len, seg, ids,
              HAS_CU: tl.constexpr, HAS_HIST: tl.constexpr, HAS_FUT: tl.constexpr, MASKED: tl.constexpr,
              FEW: tl.constexpr, SUB: tl.constexpr, RECOMPUTE: tl.constexpr, ACT: tl.constexpr,
              STEP: tl.constexpr, BOUNDS: tl.constexpr = True, DB: tl.constexpr = True):
    """One loop step of _bwd_run (STEP = 4 rows, 8 from W = 6 on, 1 in the quick twin; below, STEP = 4): g of rows
    t+H .. t+H+3 (``xs``: x rows t .. t+H+3, ``dys``: dy rows t+H .. t+H+3), their dweight/dbias
    terms (rows inside the leaf only), and dx of rows t .. t+3 from g[t .. t+H+3] (``gs``, ``ds``,
    ``es``: g, segment and segment end of the carried rows t .. t+H-1).

    Returns the accumulators and g, d, end of rows t .. t+H+3 (the caller carries rows t+4 ..).
    RECOMPUTE (FEW masked steps of STEP_BRANCH programs): (d, end) of the carried rows that dx
    reads come from the boundaries in ``seg`` instead (a masked step may follow an unmasked one,
    which has none). ``ids``: the segment indices of rows t .. t+H+3 in a many-segment program with
    per-token indices (HAS_CU == SEGMENT_IDS, not FEW): each row's (d, start, end) comes from its
    window of them, and (d, end) of the carried rows too (nothing is carried; the entries past
    t+H+3 that the windows of the last rows would need are never used: their dx is the next step's).
    """
    W: tl.constexpr = len(ws)
    H: tl.constexpr = W - 1
    IDS: tl.constexpr = MASKED and (not FEW) and HAS_CU == SEGMENT_IDS
    if IDS:
        segs = ids_windows(ids, STEP, H)
    else:
        segs = repeated(seg, STEP)
    for k in tl.static_range(STEP):
        win = xs[k:k + W]
        g, dk, sk, ek, win = bwd_g_rows(win, dys[k], row_offset(t, H + k), b, ws, cu_ptr, hist_ptr,
                                        cols, cmask, C, n_seg, seq_len, segs[k], HAS_CU, HAS_HIST, MASKED, FEW, ACT)
        accs, accb = _acc_row(accs, accb, g, win, i + (H + k) < SUB, DB)
        gs = gs + (g,)
        ds = ds + (dk,)
        es = es + (ek,)
    dxp = dx_base + i * sdx
    if MASKED and FEW and RECOMPUTE:
        rds = ()
        res = ()
        for k in tl.static_range(H):
            if k < STEP:
                dk, _, ek = segment_of_rows(cu_ptr, row_offset(t, k), seg, n_seg, seq_len, HAS_CU, True)
            else:
                dk = ds[k]
                ek = es[k]
            rds = rds + (dk,)
            res = res + (ek,)
        ds = rds + ds[H:]
        es = res + es[H:]
    for k in tl.static_range(STEP):
        gwin = gs[k:k + W]
        dxk = rows_ahead(dxp, k, sdx)
        if IDS:  # dx_rows compares the indices of rows t+k .. t+k+H itself
            iwin = ids[k:k + W]
            dx_rows(dxk, row_offset(t, k), gwin, ids[k], iwin, ws, fut_ptr, cols, cmask, sdx, S, C, n_seg,
                    HAS_FUT, MASKED, True, BOUNDS, ACT)
        else:
            dx_rows(dxk, row_offset(t, k), gwin, ds[k], es[k], ws, fut_ptr, cols, cmask, sdx, S, C, n_seg,
                    HAS_FUT, MASKED, False, BOUNDS)
    return accs, accb, gs, ds, es


@triton.jit
def _bwd_run(x_ptr, dy_ptr, dx_ptr, cu_ptr, hist_ptr, fut_ptr, p0, rows0, cols, cmask, sx, sdy, sdx, S, C,
             n_seg, seq_len, seg, b, ws,
             HAS_CU: tl.constexpr, HAS_HIST: tl.constexpr, HAS_FUT: tl.constexpr, MASKED: tl.constexpr, FEW: tl.constexpr,
             SUB: tl.constexpr, R: tl.constexpr, BC: tl.constexpr, STAGES: tl.constexpr,
             STEP_BRANCH: tl.constexpr, ACT: tl.constexpr, BOUNDS: tl.constexpr = True, DB: tl.constexpr = True,
             ROWS_PER_STEP: tl.constexpr = 0, HEAD_LOOP: tl.constexpr = False):
    """Walk R leaves from rows0 ([R]); returns the W + 1 [R, BC] accumulators (one row per leaf):
    the tuple of the W taps' and the bias's.

    Step i (rows t = rows0 + i .. t + 3; with STEP = 8 rows, from W = 6 on, read t + 7 and
    t+H+7 for t + 3 and t+H+3 below) loads x and dy of rows t+H..t+H+3, computes g of those
    rows and adds their dweight/dbias terms (rows inside the leaf only), then stores dx of rows
    t..t+3 from g[t..t+H+3]. Rows are added to the accumulators in row order (rows0, rows0 + 1, ...),
    the leaf's fixed order. A loaded row is used in its own step and the next ones only while it is
    among the H carried rows: that is what lets Triton software-pipeline the loop (loads via shared
    memory, ``STAGES`` deep); at W = 4 a row kept two steps (the dweight window reading x[t-3] of
    rows loaded two steps earlier) stopped it.
    STEP_BRANCH (a speed choice, same bits): in a FEW masked program, the steps away from every
    boundary run the unmasked body (faster on the H200 at C >= 512 without bias); at W = 5 + SiLU
    also the many-segment middle walk's steps whose rows all lie in one segment (IDS_BRANCH).
    ROWS_PER_STEP: the loop's rows per step when > 0 (the quick twin's 1: a smaller loop body to
    compile, the same bits, since every row takes the same FMAs in the same order whatever the
    step); 0: 4, or 8 from W = 6 on (below). HEAD_LOOP (the quick twin, a masked walk of many segments):
    the first H rows' g in a loop of one row a step too (``_bwd_head_loop``), not unrolled.
    BOUNDS: rows outside [0, S) read as zero and are not stored. Masked programs of many segments
    that touch no such row (rows p0 - H .. p_last + H inside) run without it: the checks and
    their predicates cost the short-document loop 12 of its 53 instructions per element (sm_90
    SASS, W = 4), and every value they would mask is in range there, so the bits are the same.
    """
    W: tl.constexpr = len(ws)
    H: tl.constexpr = W - 1
    # Rows per step: 4, or 8 when the H carried rows outnumber 4 (W >= 6): Triton software-pipelines
    # the loads only when each loaded row is used in its own step and the next alone.
    STEP: tl.constexpr = ROWS_PER_STEP if ROWS_PER_STEP > 0 else 4 + 4 * (H > 4)
    IDS: tl.constexpr = MASKED and (not FEW) and HAS_CU == SEGMENT_IDS
    # W = 5 + SiLU only: one H100, backward alone, C = 512, -1.1% (1-64 documents) and -3.8% (seed mix);
    # W = 7 without activation +2.5% and W = 8 + SiLU +9% on 1-64 documents (notes 3.7)
    IDS_BRANCH: tl.constexpr = IDS and STEP_BRANCH and (not BOUNDS) and H == 4 and ACT == 1
    if HEAD_LOOP:  # the quick twin: the head's H rows one per loop step (_bwd_head_loop)
        xs, ids, carried, accs, accb = _bwd_head_loop(
            x_ptr, dy_ptr, cu_ptr, hist_ptr, rows0, cols, cmask, sx, sdy, S, C, n_seg, seq_len, seg, b, ws,
            HAS_CU, HAS_HIST, MASKED and BOUNDS, BOUNDS, IDS, ACT, R, BC, DB)
    else:
        # x rows rows0 - H .. rows0 + H - 1, dy rows rows0 .. rows0 + H - 1
        xs = ()
        for j in tl.static_range(2 * H):
            xs = xs + (load_rows(x_ptr, row_offset(rows0, j - H), sx, cols, cmask, S, MASKED and BOUNDS),)
        dys = ()
        for j in tl.static_range(H):
            dys = dys + (load_rows(dy_ptr, row_offset(rows0, j), sdy, cols, cmask, S, MASKED and BOUNDS),)
        accs = ()
        for k in tl.static_range(W):
            accs = accs + (tl.zeros([R, BC], dtype=tl.float32),)
        accb = tl.zeros([R, BC], dtype=tl.float32)
        # Many segments with per-token indices: the indices of rows t..t+H-1 are carried from step to
        # step, those of rows t+H..t+H+3 loaded with x and dy (placeholders otherwise; nothing reads them).
        if IDS:
            pre_ids = ()
            for j in tl.static_range(2 * H):
                pre_ids = pre_ids + (load_ids(cu_ptr, row_offset(rows0, j - H), n_seg, seq_len, BOUNDS),)
            # the rows after rows0 + H - 1 are not needed here: (d, end) of rows t..t+H-1 are the step's
            segs = ids_windows(pre_ids, H, H)
            ids = pre_ids[H:]
        else:
            ids = ()
            segs = ()
            for j in tl.static_range(H):
                ids = ids + (rows0 * 0,)
                segs = segs + (seg,)
        # the carried rows t .. t+H-1: one (g, segment, segment end) triple per row, in row order (the
        # loop-carried values then come in the order of the width-4 code, which kept g0, d0, e0, g1, ...)
        carried = ()
        for k in tl.static_range(H):
            win = xs[k:k + W]
            g, dk, sk, ek, win = bwd_g_rows(win, dys[k], row_offset(rows0, k), b, ws, cu_ptr, hist_ptr,
                                            cols, cmask, C, n_seg, seq_len, segs[k], HAS_CU, HAS_HIST, MASKED, FEW, ACT)
            accs, accb = _acc_row(accs, accb, g, win, True, DB)
            carried = carried + ((g, dk, ek),)
        xs = xs[H:]
    x_base = row_ptrs(x_ptr, rows0, sx, cols)
    dy_base = row_ptrs(dy_ptr, rows0, sdy, cols)
    dx_base = row_ptrs(dx_ptr, rows0, sdx, cols)
    if MASKED and FEW and STEP_BRANCH:
        dirty = dirty_steps(seg, p0, S, R, SUB, H, STEP)
    for i in tl.range(0, SUB, STEP, num_stages=STAGES):
        t = rows0 + i
        xp = x_base + i * sx
        dyp = dy_base + i * sdy
        new_x = ()
        for k in tl.static_range(STEP):
            new_x = new_x + (load_at(xp + (H + k) * sx, row_offset(t, H + k), cmask, S, MASKED and BOUNDS),)
        new_dy = ()
        for k in tl.static_range(STEP):
            new_dy = new_dy + (load_at(dyp + (H + k) * sdy, row_offset(t, H + k), cmask, S, MASKED and BOUNDS),)
        new_ids = load_ids_rows(cu_ptr, t, n_seg, seq_len, ids[0], H, STEP, IDS, BOUNDS)
        all_ids = ids + new_ids
        all_x = xs + new_x
        gs, ds, es = _split_rows(carried)
        if (MASKED and FEW and STEP_BRANCH) or IDS_BRANCH:
            # Only the steps that read rows of two segments (or, with few segments, reach row S) take the
            # masked body; the others run the unmasked one, which computes the same bits there. Few
            # segments: the program's boundaries mark those steps (dirty); many, with per-token indices
            # (IDS_BRANCH): the indices of rows t and t+H+STEP-1 differ in a leaf (they never decrease).
            if FEW:
                clean = ((dirty >> (i // STEP)) & 1) == 0
            else:
                clean = tl.max(all_ids[H + STEP - 1] - all_ids[0], axis=0) == 0
            if clean:
                accs, accb, all_g, all_d, all_e = _bwd_step(
                    all_x, new_dy, gs, ds, es, accs, accb, t, i, dx_base, b, ws, cu_ptr, hist_ptr, fut_ptr,
                    cols, cmask, sdx, S, C, n_seg, seq_len, seg, all_ids, HAS_CU, HAS_HIST, HAS_FUT, False, False, SUB,
                    FEW, ACT, STEP, BOUNDS, DB)
            else:
                accs, accb, all_g, all_d, all_e = _bwd_step(
                    all_x, new_dy, gs, ds, es, accs, accb, t, i, dx_base, b, ws, cu_ptr, hist_ptr, fut_ptr,
                    cols, cmask, sdx, S, C, n_seg, seq_len, seg, all_ids, HAS_CU, HAS_HIST, HAS_FUT, True, FEW, SUB,
                    FEW, ACT, STEP, BOUNDS, DB)
        else:
            accs, accb, all_g, all_d, all_e = _bwd_step(
                all_x, new_dy, gs, ds, es, accs, accb, t, i, dx_base, b, ws, cu_ptr, hist_ptr, fut_ptr,
                cols, cmask, sdx, S, C, n_seg, seq_len, seg, all_ids, HAS_CU, HAS_HIST, HAS_FUT, MASKED, FEW, SUB,
                False, ACT, STEP, BOUNDS, DB)
        xs = all_x[STEP:]
        ids = all_ids[STEP:]
        if not (FEW and STEP_BRANCH) and not IDS:
            carried = _join_rows(all_g[STEP:], all_d[STEP:], all_e[STEP:])
        else:  # those recompute (d, end) of their rows: nothing of theirs to carry
            carried = _join_rows(all_g[STEP:], ds, es)
    return accs, accb


@triton.jit
def _bwd_head_loop(x_ptr, dy_ptr, cu_ptr, hist_ptr, rows0, cols, cmask, sx, sdy, S, C, n_seg, seq_len, seg, b, ws,
                   HAS_CU: tl.constexpr, HAS_HIST: tl.constexpr, ROWMASK: tl.constexpr, BOUNDS: tl.constexpr,
                   IDS: tl.constexpr, ACT: tl.constexpr, R: tl.constexpr, BC: tl.constexpr, DB: tl.constexpr):
    """_bwd_run's head for a masked walk of many segments (the quick twin), one row a loop step: g of
    rows rows0 .. rows0 + H - 1 added to fresh accumulators in row order, as the unrolled head adds them.

    Returns (xs, ids, carried, accs, accb) as the unrolled head leaves them: x rows rows0 .. rows0 + H - 1,
    their segment indices (IDS; placeholders otherwise), their (g, segment, end) triples, and the
    accumulators. Each row's g comes from the same x window and dy row through the same helper, so the
    bits are the unrolled head's; with IDS a row's window of indices holds the rows up to itself (the
    unrolled head's also held later rows of the head, which g never reads: history_flags looks back).
    Row rows0 is taken before the loop: its triple, H times, starts the carried tuple (the segment
    and end have the dtypes of cu_seqlens' path, which only a computed row tells).
    """
    W: tl.constexpr = len(ws)
    H: tl.constexpr = W - 1
    xs = ()
    ids = ()
    for j in tl.static_range(H):
        xs = xs + (load_rows(x_ptr, row_offset(rows0, j - H), sx, cols, cmask, S, ROWMASK),)
        if IDS:
            ids = ids + (load_ids(cu_ptr, row_offset(rows0, j - H), n_seg, seq_len, BOUNDS),)
        else:
            ids = ids + (rows0 * 0,)
    accs = ()
    for k in tl.static_range(W):
        accs = accs + (tl.zeros([R, BC], dtype=tl.float32),)
    accb = tl.zeros([R, BC], dtype=tl.float32)
    xs, ids, triple, accs, accb = _bwd_head_row(x_ptr, dy_ptr, cu_ptr, hist_ptr, rows0, xs, ids, accs, accb, cols,
                                                cmask, sx, sdy, S, C, n_seg, seq_len, seg, b, ws, HAS_CU, HAS_HIST,
                                                ROWMASK, BOUNDS, IDS, ACT, DB)
    carried = ()
    for j in tl.static_range(H):
        carried = carried + (triple,)
    for j in tl.range(1, H):
        xs, ids, triple, accs, accb = _bwd_head_row(x_ptr, dy_ptr, cu_ptr, hist_ptr, rows0 + j, xs, ids, accs, accb,
                                                    cols, cmask, sx, sdy, S, C, n_seg, seq_len, seg, b, ws, HAS_CU,
                                                    HAS_HIST, ROWMASK, BOUNDS, IDS, ACT, DB)
        carried = carried[1:] + (triple,)
    return xs, ids, carried, accs, accb


@triton.jit
def _bwd_head_row(x_ptr, dy_ptr, cu_ptr, hist_ptr, t, xs, ids, accs, accb, cols, cmask, sx, sdy, S, C, n_seg,
                  seq_len, seg, b, ws, HAS_CU: tl.constexpr, HAS_HIST: tl.constexpr, ROWMASK: tl.constexpr,
                  BOUNDS: tl.constexpr, IDS: tl.constexpr, ACT: tl.constexpr, DB: tl.constexpr):
    """One row t of _bwd_head_loop: its g from x rows t - H .. t (``xs``: the H before it) and dy[t], added
    to the accumulators; returns the window and indices moved on by one row, its (g, segment, end)
    triple and the accumulators."""
    win = xs + (load_rows(x_ptr, t, sx, cols, cmask, S, ROWMASK),)
    dy = load_rows(dy_ptr, t, sdy, cols, cmask, S, ROWMASK)
    if IDS:
        all_ids = ids + (load_ids(cu_ptr, t, n_seg, seq_len, BOUNDS),)
        seg_t = ids_windows(all_ids, 1, len(ws) - 1)[0]
    else:
        all_ids = ids + (t * 0,)
        seg_t = seg
    g, dk, sk, ek, used = bwd_g_rows(win, dy, t, b, ws, cu_ptr, hist_ptr, cols, cmask, C, n_seg, seq_len, seg_t,
                                     HAS_CU, HAS_HIST, True, False, ACT)
    accs, accb = _acc_row(accs, accb, g, used, True, DB)
    return win[1:], all_ids[1:], (g, dk, ek), accs, accb


@triton.jit
def _split_rows(carried):
    """(gs, ds, es): the g, segment and segment-end tuples of the carried (g, d, end) triples."""
    gs = ()
    ds = ()
    es = ()
    for k in tl.static_range(len(carried)):
        gs = gs + (carried[k][0],)
        ds = ds + (carried[k][1],)
        es = es + (carried[k][2],)
    return gs, ds, es


@triton.jit
def _join_rows(gs, ds, es):
    """The (g, d, end) triples of the rows of gs, ds, es (the inverse of _split_rows)."""
    out = ()
    for k in tl.static_range(len(gs)):
        out = out + ((gs[k], ds[k], es[k]),)
    return out


@triton.jit(do_not_specialize=["S", "C8", "n_seg", "seq_len"])
def cake_conv_bwd_kernel(x_ptr, dy_ptr, dx_ptr, w_ptr, b_ptr, cu_ptr, hist_ptr, fut_ptr, ws_ptr,
                         S, C8, n_seg, seq_len,
                         SX8: tl.constexpr, SDY8: tl.constexpr, SDX8: tl.constexpr,
                         HAS_BIAS: tl.constexpr, HAS_CU: tl.constexpr, HAS_HIST: tl.constexpr, HAS_FUT: tl.constexpr,
                         R: tl.constexpr, LOGR: tl.constexpr, SUB: tl.constexpr, BC: tl.constexpr,
                         STAGES: tl.constexpr, STEP_BRANCH: tl.constexpr, W: tl.constexpr, ACT: tl.constexpr):
    """dx rows and the dweight/dbias partial of R adjacent leaves (rows [p0, p0 + R * SUB)).

    Grid: (cdiv(S, R * SUB) * cdiv(C, BC),), channel blocks fastest. SX8, SDY8, SDX8: row
    strides / 8, compile-time constants (a loop step's rows are one base address plus immediate
    offsets). Writes ws[pid_s, k, c] (k = 0..W-1 taps, W = bias), the level-LOGR node of the
    pairwise leaf tree. ``hist`` [N, H, C] (HAS_HIST) and ``fut`` [N, H, C]
    FP32 (HAS_FUT) hold the x rows before and the g rows after each segment (KCP). Without HAS_FUT
    the last rows of a segment get dx without the look-ahead terms: KCP then rewrites them with
    cake_conv_bwd_dx_rows_kernel once fut has arrived (the exchange overlaps this kernel).
    """
    H: tl.constexpr = W - 1
    if not INTERPRET:
        # the group kernel that follows may launch once every program has started (it waits for
        # this kernel's results before reading any: programmatic dependent launch)
        gdc_launch_dependents()
    C, pid_s, cols, cmask, b, ws, p0, p_last, rows0 = program_rows(w_ptr, b_ptr, C8, HAS_BIAS, R, SUB, BC, W)
    sx: tl.constexpr = SX8 * 8
    sdy: tl.constexpr = SDY8 * 8
    sdx: tl.constexpr = SDX8 * 8
    # Taps reach H rows back, the g look-ahead H rows forward.
    n_lo, masked = window_has_boundary(cu_ptr, n_seg, p0 - H, p_last + H, seq_len, HAS_CU)
    if masked:
        d_lo, d_hi, seg = program_segments(cu_ptr, n_seg, n_lo, p_last + H, seq_len, HAS_CU)
        # W >= 6 with per-token indices: a program of three or more segments takes the many-segment
        # walk (every walk gives the same bits). The few-segment walk's loop at W = 8 (C = 512 pick,
        # sm_90 SASS) is 2,123 instructions with 154 spills; the many-segment middle walk's 1,194, none.
        FEW_LIMIT: tl.constexpr = FEW_SEGMENTS - 2 * (H > 4) * (HAS_CU == SEGMENT_IDS)
        if d_hi - d_lo < FEW_LIMIT:
            acc, accb = _bwd_run(
                x_ptr, dy_ptr, dx_ptr, cu_ptr, hist_ptr, fut_ptr, p0, rows0, cols, cmask, sx, sdy, sdx, S, C,
                n_seg, seq_len, seg, b, ws, HAS_CU, HAS_HIST, HAS_FUT, True, True, SUB, R, BC, STAGES, STEP_BRANCH,
                ACT, DB=HAS_BIAS)
        elif (p0 - H < 0) | (p_last + H >= S):  # reads rows outside [0, S): the first or last row block
            # Not software-pipelined (1 stage): a fourth pipelined loop made the kernel's shared memory
            # twice that of one loop's buffers (Triton 3.6's allocator placed two loops' apart).
            acc, accb = _bwd_run(
                x_ptr, dy_ptr, dx_ptr, cu_ptr, hist_ptr, fut_ptr, p0, rows0, cols, cmask, sx, sdy, sdx, S, C,
                n_seg, seq_len, seg, b, ws, HAS_CU, HAS_HIST, HAS_FUT, True, False, SUB, R, BC, 1, STEP_BRANCH,
                ACT, True, DB=HAS_BIAS)
        else:  # many segments away from both ends (short documents): no row bounds to check
            acc, accb = _bwd_run(
                x_ptr, dy_ptr, dx_ptr, cu_ptr, hist_ptr, fut_ptr, p0, rows0, cols, cmask, sx, sdy, sdx, S, C,
                n_seg, seq_len, seg, b, ws, HAS_CU, HAS_HIST, HAS_FUT, True, False, SUB, R, BC, STAGES, STEP_BRANCH,
                ACT, False, DB=HAS_BIAS)
    else:
        no_seg = (n_lo, n_lo, 0, 0, 0, 0, 0, 0)  # unused: no row needs its segment
        acc, accb = _bwd_run(
            x_ptr, dy_ptr, dx_ptr, cu_ptr, hist_ptr, fut_ptr, p0, rows0, cols, cmask, sx, sdy, sdx, S, C,
            n_seg, seq_len, no_seg, b, ws, HAS_CU, HAS_HIST, HAS_FUT, False, False, SUB, R, BC, STAGES, STEP_BRANCH,
            ACT, DB=HAS_BIAS)
    # (the taps' accumulators are named so that they sort before accb: an if's results are ordered by
    # name, and this order is the width-4 code's, acc0..acc3 then accb)
    store_node(ws_ptr, pid_s, acc, accb, cols, cmask, C, R, BC, LOGR, W)


@triton.jit(do_not_specialize=["S", "C8", "n_seg", "seq_len", "sx8", "sdy8", "sdx8"])
def cake_conv_bwd_quick_kernel(x_ptr, dy_ptr, dx_ptr, w_ptr, b_ptr, cu_ptr, hist_ptr, fut_ptr, ws_ptr,
                               S, C8, n_seg, seq_len, sx8, sdy8, sdx8,
                               HAS_BIAS: tl.constexpr, HAS_CU: tl.constexpr, HAS_HIST: tl.constexpr,
                               HAS_FUT: tl.constexpr, R: tl.constexpr, LOGR: tl.constexpr, SUB: tl.constexpr,
                               BC: tl.constexpr, W: tl.constexpr, ACT: tl.constexpr):
    """The backward's quick twin: ``cake_conv_bwd_kernel``'s dx and partials, bit for bit, from a kernel
    that compiles several times faster and serves every C and row stride (what a first training
    step runs while the full kernels compile, compile_ahead.py).

    Every program takes the one walk that is right for any program, the masked walk of many segments
    with row bounds, in one stage and without the step branch (every walk computes the same bits
    for the programs it is taken for), one row a step. One row walk in the IR instead of four, and
    its loop body one row instead of four (eight from W = 6 on): Triton's layout pass grows faster
    than the IR's size (sm_90, this kernel at W = 4: 2.3 s to compile with 4-row steps, 1.1 s with
    1-row steps; W = 8: 23.1 s and 3.8 s). The row strides are integer arguments (sx8, sdy8, sdx8: strides
    / 8) and the launch configuration is one for every C (launch.py), so the compiled kernel depends
    on the dtypes, the flags, W and the activation only. The partials' tree level LOGR is part of the
    summation order's bottom levels, which R never changes (module docstring). It runs slower.
    """
    H: tl.constexpr = W - 1
    if not INTERPRET:
        gdc_launch_dependents()
    C, pid_s, cols, cmask, b, ws, p0, p_last, rows0 = program_rows(w_ptr, b_ptr, C8, HAS_BIAS, R, SUB, BC, W)
    n_lo, _ = window_has_boundary(cu_ptr, n_seg, p0 - H, p_last + H, seq_len, HAS_CU)
    _, _, seg = program_segments(cu_ptr, n_seg, n_lo, p_last + H, seq_len, HAS_CU)
    acc, accb = _bwd_run(
        x_ptr, dy_ptr, dx_ptr, cu_ptr, hist_ptr, fut_ptr, p0, rows0, cols, cmask, sx8 * 8, sdy8 * 8, sdx8 * 8, S, C,
        n_seg, seq_len, seg, b, ws, HAS_CU, HAS_HIST, HAS_FUT, True, False, SUB, R, BC, 1, False, ACT, True,
        DB=HAS_BIAS, ROWS_PER_STEP=1, HEAD_LOOP=True)
    store_node(ws_ptr, pid_s, acc, accb, cols, cmask, C, R, BC, LOGR, W)


@triton.jit
def store_node(ws_ptr, pid_s, acc, accb, cols, cmask, C, R: tl.constexpr, BC: tl.constexpr, LOGR: tl.constexpr,
               W: tl.constexpr):
    """Write the program's node of the pairwise leaf tree: ws[pid_s, k, c] = the level-LOGR sum of its R
    leaves' accumulators (k < W: the taps', k = W: the bias's)."""
    base = ws_ptr + pid_s.to(tl.int64) * (W + 1) * C + cols
    for k in tl.static_range(W):
        tl.store(base + k * C, pairwise_sum_rows(acc[k], R, BC, LOGR), mask=cmask)
    tl.store(base + W * C, pairwise_sum_rows(accb, R, BC, LOGR), mask=cmask)


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
                                   W: tl.constexpr, ACT: tl.constexpr,
                                   M: tl.constexpr, LOGM: tl.constexpr, EPI_BC: tl.constexpr):
    """``cake_conv_bwd_kernel`` (called here, inlined) for one group of the dweight tree (S <= TREE_LEAVES * BWD_SUB rows),
    which then also writes dweight and dbias: one launch for the whole backward.

    Every program writes its node as the main kernel does, then takes a ticket of its channel
    block: ``ticket[pid_c]``, an int32 counter that is 0 when the launch starts. The program that
    draws the last ticket (n_nodes - 1) is the only one left, and every node of its channel block
    is written; it adds them as the group kernel adds a group,

        dw[c, k] = pairwise tree over nodes i = 0..M-1 of ws[i, k, c]   (missing nodes read as 0;
        db[c]    = the same with k = W)                                  M = TREE_LEAVES / R),

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
                         SX8, SDY8, SDX8, HAS_BIAS, HAS_CU, HAS_HIST, HAS_FUT, R, LOGR, SUB, BC, STAGES, STEP_BRANCH,
                         W, ACT)
    add_one_group(ws_ptr, dw_ptr, db_ptr, ticket_ptr, S, C8, HAS_BIAS, R, SUB, BC, W, M, LOGM, EPI_BC)


@triton.jit(do_not_specialize=["S", "C8", "n_seg", "seq_len", "sx8", "sdy8", "sdx8"])
def cake_conv_bwd_one_group_quick_kernel(x_ptr, dy_ptr, dx_ptr, w_ptr, b_ptr, cu_ptr, hist_ptr, fut_ptr, ws_ptr,
                                         dw_ptr, db_ptr, ticket_ptr,
                                         S, C8, n_seg, seq_len, sx8, sdy8, sdx8,
                                         HAS_BIAS: tl.constexpr, HAS_CU: tl.constexpr, HAS_HIST: tl.constexpr,
                                         HAS_FUT: tl.constexpr, R: tl.constexpr, LOGR: tl.constexpr,
                                         SUB: tl.constexpr, BC: tl.constexpr, W: tl.constexpr, ACT: tl.constexpr,
                                         M: tl.constexpr, LOGM: tl.constexpr, EPI_BC: tl.constexpr):
    """The one-group kernel's quick twin: ``cake_conv_bwd_quick_kernel`` (called here, inlined), then
    the same sum of the group by the last program of each channel block (``add_one_group``): dx,
    dw and db bit for bit as ``cake_conv_bwd_one_group_kernel`` writes them."""
    cake_conv_bwd_quick_kernel(x_ptr, dy_ptr, dx_ptr, w_ptr, b_ptr, cu_ptr, hist_ptr, fut_ptr, ws_ptr, S, C8, n_seg,
                               seq_len, sx8, sdy8, sdx8, HAS_BIAS, HAS_CU, HAS_HIST, HAS_FUT, R, LOGR, SUB, BC, W, ACT)
    add_one_group(ws_ptr, dw_ptr, db_ptr, ticket_ptr, S, C8, HAS_BIAS, R, SUB, BC, W, M, LOGM, EPI_BC, TAPS_LOOP=True)


@triton.jit
def add_one_group(ws_ptr, dw_ptr, db_ptr, ticket_ptr, S, C8, HAS_BIAS: tl.constexpr, R: tl.constexpr,
                  SUB: tl.constexpr, BC: tl.constexpr, W: tl.constexpr, M: tl.constexpr, LOGM: tl.constexpr,
                  EPI_BC: tl.constexpr, TAPS_LOOP: tl.constexpr = False):
    """The one-group kernels' end (after the program wrote its node): the program that draws the last
    ticket of its channel block adds the block's M nodes and writes dw and db
    (``cake_conv_bwd_one_group_kernel``'s docstring). TAPS_LOOP (the quick twin): the taps one per loop
    step instead of unrolled (a smaller IR to compile; each tap's sum is its own, so the same bits)."""
    C = C8 * 8
    n_cblk = tl.cdiv(C, BC)
    pid_c = tl.program_id(0) % n_cblk
    n_nodes = tl.cdiv(S, R * SUB)
    if is_last_ticket(ticket_ptr, pid_c, n_nodes):
        nodes = tl.arange(0, M)
        node_off = nodes.to(tl.int64)[:, None] * (W + 1) * C
        nmask = (nodes < n_nodes)[:, None]
        for j in tl.static_range(BC // EPI_BC):
            cols = pid_c * BC + j * EPI_BC + tl.arange(0, EPI_BC)
            cm = cols < C
            if TAPS_LOOP:
                for k in tl.range(0, W):
                    _add_tap(ws_ptr, dw_ptr, node_off, nmask, cols, cm, C, k, W, M, EPI_BC, LOGM)
            else:
                for k in tl.static_range(W):
                    _add_tap(ws_ptr, dw_ptr, node_off, nmask, cols, cm, C, k, W, M, EPI_BC, LOGM)
            if HAS_BIAS:
                v = tl.load(ws_ptr + node_off + W * C + cols[None, :], mask=nmask & cm[None, :], other=0.0,
                            cache_modifier=".cg")
                tl.store(db_ptr + cols, pairwise_sum_rows(v, M, EPI_BC, LOGM).to(db_ptr.dtype.element_ty), mask=cm)
        reset_ticket(ticket_ptr, pid_c)


@triton.jit
def _add_tap(ws_ptr, dw_ptr, node_off, nmask, cols, cm, C, k, W: tl.constexpr, M: tl.constexpr, EPI_BC: tl.constexpr,
             LOGM: tl.constexpr):
    """dw[cols, k] = the pairwise tree over the M nodes of tap k (add_one_group)."""
    v = tl.load(ws_ptr + node_off + k * C + cols[None, :], mask=nmask & cm[None, :], other=0.0, cache_modifier=".cg")
    tl.store(dw_ptr + cols * W + k, pairwise_sum_rows(v, M, EPI_BC, LOGM).to(dw_ptr.dtype.element_ty), mask=cm)


@triton.jit(do_not_specialize=["n_nodes", "n_leaves", "n_groups", "C"])
def cake_conv_bwd_group_kernel(ws_ptr, dw_ptr, db_ptr, ticket_ptr, n_nodes, n_leaves, n_groups, C,
                               HAS_BIAS: tl.constexpr, M: tl.constexpr, LOGM: tl.constexpr, BLK: tl.constexpr,
                               GB: tl.constexpr, LOGGB: tl.constexpr, W: tl.constexpr):
    """Steps 2 and 3 of the order (module docstring), two or more groups, one launch after the main kernel.

    Columns j < (W + 1) C of the partials: j = k * C + c, tap k of channel c (k = W: the bias). Program
    (g, pj) adds group g in the columns j of block pj (BLK of them),

        gs[g, j] = pairwise tree over i = 0..M-1 of ws[g * M + i, j]   (missing nodes read as 0;
                                                                        M = TREE_LEAVES / R),

    into the group sums (ws + n_leaves * 5 C), then takes a ticket of its column block:
    ``ticket[pj]``, an int32 counter that is 0 when the launch starts. The program drawing the last
    one (n_groups - 1) is the only one of its column block left, with every group sum of its
    columns written; it adds them as the documented order does,

        total[j] = 0 + T(block 0) + T(block 1) + ...   T: pairwise tree over GB groups (missing: 0)
        dw[c, k] = total[j] (k < W),   db[c] = total[j] (k = W, HAS_BIAS)

    in dw's / db's dtype, and sets its counter back to 0 for the next launch on the stream (the
    counters: launch.py, ``TicketCounters``). The ticket decides which program adds, never the order
    of the additions. Ordering: ``is_last_ticket`` (the last program's ``.cg`` loads see every
    group sum).

    Launched as a programmatic dependent of the main kernel (its launch overlaps the main kernel's
    last programs): it waits for the main kernel's results (``gdc_wait``) before reading anything.
    Grid: (G, cdiv((W + 1) C, BLK)).
    """
    if not INTERPRET:
        gdc_wait()
    g = tl.program_id(0)
    pj = tl.program_id(1)
    C5 = (W + 1) * C
    cols = pj * BLK + tl.arange(0, BLK)
    cm = cols < C5
    nodes = g * M + tl.arange(0, M)
    offs = nodes.to(tl.int64)[:, None] * C5 + cols[None, :]
    v = tl.load(ws_ptr + offs, mask=(nodes < n_nodes)[:, None] & cm[None, :], other=0.0)
    gsum = pairwise_sum_rows(v, M, BLK, LOGM)
    gs_ptr = ws_ptr + tl.cast(C, tl.int64) * (W + 1) * n_leaves  # (tl.cast: either may be a compile-time 1)
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
        tl.store(dw_ptr + c * W + k, total.to(dw_ptr.dtype.element_ty), mask=cm & (k < W))
        if HAS_BIAS:
            tl.store(db_ptr + c, total.to(db_ptr.dtype.element_ty), mask=cm & (k == W))
        reset_ticket(ticket_ptr, pj)


@triton.jit(do_not_specialize=["n_rows", "S", "C8", "n_seg"])
def cake_conv_bwd_head_kernel(x_ptr, dy_ptr, w_ptr, b_ptr, cu_ptr, hist_ptr, rows_ptr, g_ptr,
                              n_rows, S, C8, n_seg,
                              SX8: tl.constexpr, SDY8: tl.constexpr, SG: tl.constexpr,
                              HAS_BIAS: tl.constexpr, RB: tl.constexpr, BC: tl.constexpr,
                              W: tl.constexpr, ACT: tl.constexpr):
    """g[i, c] = dy[t] * act'(pre[t]) in FP32 for the listed local rows t = rows[i] (KCP).

    The rows whose g another fragment's dx needs (its look-ahead across a rank boundary). The same
    helpers and FMA sequence as the main backward kernel, so the bits are those it computes for
    the same rows. Grid: (cdiv(n_rows, RB), cdiv(C, BC)); ``cu`` are the local segment
    boundaries, ``hist`` [N, W - 1, C] the x rows before each segment.
    """
    C, cols, cmask, b, ws, i, imask, t = row_list_setup(w_ptr, b_ptr, rows_ptr, n_rows, S, C8, HAS_BIAS, RB, BC, W)
    sx: tl.constexpr = SX8 * 8
    sdy: tl.constexpr = SDY8 * 8
    win = load_window(x_ptr, t, sx, cols, cmask, S, 1 - W, W)
    dy = load_rows(dy_ptr, t, sdy, cols, cmask, S, True)
    seg = segment_window(cu_ptr, n_seg, 0, n_seg - 1, S, True)
    g, d, start, end, _ = bwd_g_rows(win, dy, t, b, ws, cu_ptr, hist_ptr, cols, cmask, C, n_seg, S, seg,
                                     True, True, True, False, ACT)
    offs = i.to(tl.int64)[:, None] * SG + cols[None, :]
    tl.store(g_ptr + offs, g, mask=imask[:, None] & cmask[None, :])


@triton.jit(do_not_specialize=["n_rows", "S", "C8", "n_seg"])
def cake_conv_bwd_dx_rows_kernel(x_ptr, dy_ptr, dx_ptr, w_ptr, b_ptr, cu_ptr, hist_ptr, fut_ptr, rows_ptr,
                                 n_rows, S, C8, n_seg,
                                 SX8: tl.constexpr, SDY8: tl.constexpr, SDX8: tl.constexpr,
                                 HAS_BIAS: tl.constexpr, RB: tl.constexpr, BC: tl.constexpr,
                                 W: tl.constexpr, ACT: tl.constexpr):
    """dx of the listed local rows t = rows[i] with the look-ahead halo ``fut`` [N, W - 1, C] (KCP).

    The last rows of each segment whose document goes on elsewhere: g[t..t+H] recomputed with the
    main kernel's helpers (same bits), rows past the segment taken from fut, and the same FMA
    sequence for dx. Grid: (cdiv(n_rows, RB), cdiv(C, BC)).
    """
    H: tl.constexpr = W - 1
    C, cols, cmask, b, ws, i, imask, t = row_list_setup(w_ptr, b_ptr, rows_ptr, n_rows, S, C8, HAS_BIAS, RB, BC, W)
    sx: tl.constexpr = SX8 * 8
    sdy: tl.constexpr = SDY8 * 8
    sdx: tl.constexpr = SDX8 * 8
    xs = load_window(x_ptr, t, sx, cols, cmask, S, 0 - H, 2 * H + 1)  # rows t - H .. t + H
    dys = load_window(dy_ptr, t, sdy, cols, cmask, S, 0, W)  # rows t .. t + H
    seg = segment_window(cu_ptr, n_seg, 0, n_seg - 1, S, True)
    gs = ()
    for k in tl.static_range(W):
        win = xs[k:k + W]
        g, dk, sk, ek, _ = bwd_g_rows(win, dys[k], row_offset(t, k), b, ws, cu_ptr, hist_ptr, cols, cmask,
                                      C, n_seg, S, seg, True, True, True, False, ACT)
        gs = gs + (g,)
        if k == 0:
            d0 = dk
            e0 = ek
    dx_rows(row_ptrs(dx_ptr, t, sdx, cols), t, gs, d0, e0, ws, fut_ptr, cols, cmask, sdx, S, C, n_seg, True, True)
