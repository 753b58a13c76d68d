"""Triton forward kernel: y = silu(conv(x)) for packed width-4 depthwise causal conv1d.

Shape legend: S packed tokens, C channels, N segments, R sub-runs per program, SUB rows per
sub-run, BC channels per program, H = 3 halo rows.

Design (a sliding window): a program owns R * SUB consecutive rows and BC channels, cut into R
sub-runs of SUB rows walked side by side, so each register tile [R, BC] holds one row of every
sub-run. Each step loads four new rows per sub-run (16-byte accesses, four loads in flight),
computes four outputs from the last seven rows kept in registers, and stores them; with
STAGES > 1 Triton software-pipelines the loop (the next steps' rows arrive in shared memory via
cp.async while this step computes). Every element
goes through the same FMA sequence whatever R, SUB, BC or warps are, so tuning never changes bits.
"""

import triton
import triton.language as tl

from .common import (
    conv_pre,
    load_taps,
    count_bounds_le,
    window_has_boundary,
    halo_tap,
    load_rows,
    load_window,
    row_list_setup,
    FEW_SEGMENTS,
    SEGMENT_IDS,
    history_flags,
    load_ids,
    load_ids4,
    segment_window,
    sigmoid_f32,
    step_windows,
    store_at,
    load_at,
    row_ptrs,
)


@triton.jit
def _fwd_taps(a3, a2, a1, t, cu_ptr, hist_ptr, cols, cmask, C, n_seg, seq_len, seg,
              HAS_CU: tl.constexpr, HAS_HIST: tl.constexpr, FEW: tl.constexpr):
    """Mask the three history taps of rows t: zero (or halo row) before the segment's start."""
    d, pos, in3, in2, in1, _end = history_flags(cu_ptr, t, seg, n_seg, seq_len, HAS_CU, HAS_HIST, FEW)
    a3 = halo_tap(a3, in3, pos, d, hist_ptr, cols, cmask, C, n_seg, HAS_HIST)
    a2 = halo_tap(a2, in2, pos + 1, d, hist_ptr, cols, cmask, C, n_seg, HAS_HIST)
    a1 = halo_tap(a1, in1, pos + 2, d, hist_ptr, cols, cmask, C, n_seg, HAS_HIST)
    return a3, a2, a1


@triton.jit
def _fwd_row(yp, t, a3, a2, a1, a0, b, w0, w1, w2, w3, cu_ptr, hist_ptr, cols, cmask, S, C,
             n_seg, seq_len, seg,
             HAS_CU: tl.constexpr, HAS_HIST: tl.constexpr, MASKED: tl.constexpr, FEW: tl.constexpr,
             BOUNDS: tl.constexpr = True):
    """y[t] = silu(pre[t]) for one row of every sub-run (rows outside [0, S) not stored if BOUNDS)."""
    if MASKED:
        a3, a2, a1 = _fwd_taps(a3, a2, a1, t, cu_ptr, hist_ptr, cols, cmask, C, n_seg, seq_len,
                               seg, HAS_CU, HAS_HIST, FEW)
    pre = conv_pre(b, w0, w1, w2, w3, a3, a2, a1, a0)
    store_at(yp, t, pre * sigmoid_f32(pre), cmask, S, MASKED and BOUNDS)


@triton.jit
def _fwd_step(yp, t, xm3, xm2, xm1, xa, xb, xc, xd, b, w0, w1, w2, w3, cu_ptr, hist_ptr, cols, cmask, sy,
              S, C, n_seg, seq_len, seg, ids,
              HAS_CU: tl.constexpr, HAS_HIST: tl.constexpr, MASKED: tl.constexpr, FEW: tl.constexpr,
              BOUNDS: tl.constexpr):
    """Outputs of rows t .. t + 3 from the seven rows t - 3 .. t + 3.

    ``ids``: the segment indices of rows t - 3 .. t + 3 in a many-segment program with per-token
    indices (HAS_CU == SEGMENT_IDS, not FEW); each row then gets its own window of them (the
    forward reads only the rows before: the entries past t + 3 are never used).
    """
    if MASKED and (not FEW) and HAS_CU == SEGMENT_IDS:
        im3, im2, im1, ia, ib, ic, i_d = ids
        seg0, seg1, seg2, seg3 = step_windows(im3, im2, im1, ia, ib, ic, i_d)
    else:
        seg0 = seg
        seg1 = seg
        seg2 = seg
        seg3 = seg
    _fwd_row(yp, t, xm3, xm2, xm1, xa, b, w0, w1, w2, w3, cu_ptr, hist_ptr, cols, cmask,
             S, C, n_seg, seq_len, seg0, HAS_CU, HAS_HIST, MASKED, FEW, BOUNDS)
    _fwd_row(yp + sy, t + 1, xm2, xm1, xa, xb, b, w0, w1, w2, w3, cu_ptr, hist_ptr, cols, cmask,
             S, C, n_seg, seq_len, seg1, HAS_CU, HAS_HIST, MASKED, FEW, BOUNDS)
    _fwd_row(yp + 2 * sy, t + 2, xm1, xa, xb, xc, b, w0, w1, w2, w3, cu_ptr, hist_ptr, cols, cmask,
             S, C, n_seg, seq_len, seg2, HAS_CU, HAS_HIST, MASKED, FEW, BOUNDS)
    _fwd_row(yp + 3 * sy, t + 3, xa, xb, xc, xd, b, w0, w1, w2, w3, cu_ptr, hist_ptr, cols, cmask,
             S, C, n_seg, seq_len, seg3, HAS_CU, HAS_HIST, MASKED, FEW, BOUNDS)


@triton.jit
def _fwd_run(x_ptr, y_ptr, cu_ptr, hist_ptr, rows0, cols, cmask, sx, sy, S, C, n_seg, seq_len,
             seg, b, w0, w1, w2, w3,
             HAS_CU: tl.constexpr, HAS_HIST: tl.constexpr, MASKED: tl.constexpr, FEW: tl.constexpr, SUB: tl.constexpr,
             STAGES: tl.constexpr, BOUNDS: tl.constexpr = True):
    """Walk the R sub-runs starting at rows0 ([R]) for SUB rows, four rows per step.

    STAGES > 1 lets Triton software-pipeline the loop: the loads of the next STAGES - 1 steps go to
    shared memory (cp.async) while this step computes, holding no registers while in flight.
    BOUNDS (masked programs near either end of the rows): rows outside [0, S) read as zero and
    are not stored; without it every row the program touches lies inside, and nothing is checked.
    """
    xm3 = load_rows(x_ptr, rows0 - 3, sx, cols, cmask, S, MASKED and BOUNDS)
    xm2 = load_rows(x_ptr, rows0 - 2, sx, cols, cmask, S, MASKED and BOUNDS)
    xm1 = load_rows(x_ptr, rows0 - 1, sx, cols, cmask, S, MASKED and BOUNDS)
    x_base = row_ptrs(x_ptr, rows0, sx, cols)
    y_base = row_ptrs(y_ptr, rows0, sy, cols)
    # Many segments with per-token indices: the indices of the rows, loaded and carried as x is
    # (placeholders otherwise; nothing reads them).
    IDS: tl.constexpr = MASKED and (not FEW) and HAS_CU == SEGMENT_IDS
    if IDS:
        im3 = load_ids(cu_ptr, rows0 - 3, n_seg, seq_len, BOUNDS)
        im2 = load_ids(cu_ptr, rows0 - 2, n_seg, seq_len, BOUNDS)
        im1 = load_ids(cu_ptr, rows0 - 1, n_seg, seq_len, BOUNDS)
    else:
        im3 = rows0 * 0
        im2 = rows0 * 0
        im1 = rows0 * 0
    for i in tl.range(0, SUB, 4, num_stages=STAGES):
        t = rows0 + i
        xp = x_base + i * sx
        xa = load_at(xp, t, cmask, S, MASKED and BOUNDS)
        xb = load_at(xp + sx, t + 1, cmask, S, MASKED and BOUNDS)
        xc = load_at(xp + 2 * sx, t + 2, cmask, S, MASKED and BOUNDS)
        xd = load_at(xp + 3 * sx, t + 3, cmask, S, MASKED and BOUNDS)
        ia, ib, ic, i_d = load_ids4(cu_ptr, t, n_seg, seq_len, im3, 0, IDS, BOUNDS)
        _fwd_step(y_base + i * sy, t, xm3, xm2, xm1, xa, xb, xc, xd, b, w0, w1, w2, w3, cu_ptr, hist_ptr, cols,
                  cmask, sy, S, C, n_seg, seq_len, seg, (im3, im2, im1, ia, ib, ic, i_d),
                  HAS_CU, HAS_HIST, MASKED, FEW, BOUNDS)
        xm3 = xb
        xm2 = xc
        xm1 = xd
        im3 = ib
        im2 = ic
        im1 = i_d


@triton.jit(do_not_specialize=["S", "C8", "n_seg", "seq_len"])
def cake_conv_fwd_kernel(x_ptr, y_ptr, w_ptr, b_ptr, cu_ptr, hist_ptr,
                         S, C8, n_seg, seq_len,
                         SX8: tl.constexpr, SY8: tl.constexpr,
                         HAS_BIAS: tl.constexpr, HAS_CU: tl.constexpr, HAS_HIST: tl.constexpr,
                         R: tl.constexpr, SUB: tl.constexpr, BC: tl.constexpr, STAGES: tl.constexpr):
    """y[t, c] = silu(b[c] + sum_k w[c, k] * x[t - 3 + k, c]), rows of other segments read as 0.

    Grid: (cdiv(S, R * SUB) * cdiv(C, BC),), channel blocks fastest. C8 = C / 8 and SX8, SY8 =
    row strides / 8 (so the compiler knows every row starts 16-byte aligned); the strides are
    compile-time constants, so the rows of a loop step are one base address plus immediate
    offsets. ``hist`` [N, 3, C] (HAS_HIST, KCP) holds
    the x rows before each segment's first row, zero where its document has none.
    """
    C = C8 * 8
    # 1-D grid, channel blocks fastest: the programs of one row block run side by side and
    # read whole rows together.
    n_cblk = tl.cdiv(C, BC)
    pid_s = tl.program_id(0) // n_cblk
    pid_c = tl.program_id(0) % n_cblk
    sx: tl.constexpr = SX8 * 8
    sy: tl.constexpr = SY8 * 8
    cols = pid_c * BC + tl.arange(0, BC)
    cmask = cols < C
    b, w0, w1, w2, w3 = load_taps(w_ptr, b_ptr, cols, cmask, HAS_BIAS, BC)
    p0 = pid_s * (R * SUB)
    p_last = p0 + R * SUB - 1
    rows0 = p0 + tl.arange(0, R) * SUB
    # Rows read: p0 - 3 .. p_last. The cu[0] = 0 and cu[N] = S boundaries make
    # the first and the last programs take the masked path.
    n_lo, masked = window_has_boundary(cu_ptr, n_seg, p0 - 3, p_last, seq_len, HAS_CU)
    if masked:
        d_lo = tl.maximum(n_lo - 1, 0)
        d_hi = count_bounds_le(cu_ptr, n_seg, p_last, seq_len, HAS_CU) - 1
        seg = segment_window(cu_ptr, n_seg, d_lo, d_hi, seq_len, HAS_CU)
        if d_hi - d_lo < FEW_SEGMENTS:
            _fwd_run(x_ptr, y_ptr, cu_ptr, hist_ptr, rows0, cols, cmask, sx, sy, S, C, n_seg, seq_len,
                     seg, b, w0, w1, w2, w3, HAS_CU, HAS_HIST, True, True, SUB, STAGES)
        elif (p0 - 3 < 0) | (p_last >= S):  # reads rows outside [0, S)
            _fwd_run(x_ptr, y_ptr, cu_ptr, hist_ptr, rows0, cols, cmask, sx, sy, S, C, n_seg, seq_len,
                     seg, b, w0, w1, w2, w3, HAS_CU, HAS_HIST, True, False, SUB, STAGES, True)
        else:  # many segments away from both ends (short documents): no row bounds to check
            _fwd_run(x_ptr, y_ptr, cu_ptr, hist_ptr, rows0, cols, cmask, sx, sy, S, C, n_seg, seq_len,
                     seg, b, w0, w1, w2, w3, HAS_CU, HAS_HIST, True, False, SUB, STAGES, False)
    else:
        # No boundary in (p0 - 3, p_last]: every tap is inside, every row inside [0, S).
        no_seg = (n_lo, n_lo, 0, 0, 0, 0, 0, 0)  # unused: no row needs its segment
        _fwd_run(x_ptr, y_ptr, cu_ptr, hist_ptr, rows0, cols, cmask, sx, sy, S, C, n_seg, seq_len,
                 no_seg, b, w0, w1, w2, w3, HAS_CU, HAS_HIST, False, False, SUB, STAGES)


@triton.jit(do_not_specialize=["n_rows", "S", "C8", "n_seg"])
def cake_conv_fwd_rows_kernel(x_ptr, y_ptr, w_ptr, b_ptr, cu_ptr, hist_ptr, rows_ptr,
                              n_rows, S, C8, n_seg,
                              SX8: tl.constexpr, SY8: tl.constexpr,
                              HAS_BIAS: tl.constexpr, RB: tl.constexpr, BC: tl.constexpr):
    """y of the listed local rows t = rows[i], reading the history halo ``hist`` (KCP).

    The first rows of each segment whose document started elsewhere: the main kernel, launched
    while the exchange was in flight, wrote them as if the document started there; this rewrites
    them with the same helpers and FMA sequence (same bits as a single-rank run).
    Grid: (cdiv(n_rows, RB), cdiv(C, BC)).
    """
    C, cols, cmask, b, w0, w1, w2, w3, i, imask, t = row_list_setup(w_ptr, b_ptr, rows_ptr, n_rows, S, C8,
                                                                    HAS_BIAS, RB, BC)
    sx: tl.constexpr = SX8 * 8
    sy: tl.constexpr = SY8 * 8
    a3, a2, a1, a0 = load_window(x_ptr, t, sx, cols, cmask, S)
    _fwd_row(row_ptrs(y_ptr, t, sy, cols), t, a3, a2, a1, a0, b, w0, w1, w2, w3, cu_ptr, hist_ptr, cols, cmask, S, C,
             n_seg, S, segment_window(cu_ptr, n_seg, 0, n_seg - 1, S, True), True, True, True, False)
