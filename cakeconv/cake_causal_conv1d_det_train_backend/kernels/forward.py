"""Triton forward kernel: y = act(conv(x)) for the packed depthwise causal conv1d of width W.

Shape legend: S packed tokens, C channels, N segments, R sub-runs per program, SUB rows per
sub-run, BC channels per program, W taps (2..8, compile-time), H = W - 1 halo rows; ACT = 1:
y = silu(pre), ACT = 0: y = pre.

Design (a sliding window): a program owns R * SUB consecutive rows and BC channels, cut into R
sub-runs of SUB rows walked side by side, so each register tile [R, BC] holds one row of every
sub-run. Each step loads STEP new rows per sub-run (16-byte accesses, STEP loads in flight; STEP =
4, or 8 from W = 6 on), computes STEP outputs from the last H + STEP rows kept in registers (a
tuple of tiles), and stores them; with STAGES > 1 Triton software-pipelines the loop (the next steps' rows arrive in shared
memory via cp.async while this step computes). Every element goes through the same FMA sequence
whatever R, SUB, BC or warps are, so tuning never changes bits.
"""

import triton
import triton.language as tl

from .common import (
    conv_pre,
    window_has_boundary,
    halo_window,
    load_rows,
    load_window,
    row_list_setup,
    FEW_SEGMENTS,
    SEGMENT_IDS,
    history_flags,
    load_ids,
    load_ids_rows,
    segment_window,
    act_out,
    program_rows,
    program_segments,
    rows_ahead,
    ids_windows,
    repeated,
    row_offset,
    store_at,
    load_at,
    row_ptrs,
)


@triton.jit
def _fwd_row(yp, t, win, b, ws, cu_ptr, hist_ptr, cols, cmask, S, C, n_seg, seq_len, seg,
             HAS_CU: tl.constexpr, HAS_HIST: tl.constexpr, MASKED: tl.constexpr, FEW: tl.constexpr,
             ACT: tl.constexpr, BOUNDS: tl.constexpr = True):
    """y[t] = act(pre[t]) for one row of every sub-run, from its window ``win`` (x rows t - H .. t;
    rows outside [0, S) not stored if BOUNDS)."""
    H: tl.constexpr = len(ws) - 1
    if MASKED:
        d, pos, ins, _end = history_flags(cu_ptr, t, seg, n_seg, seq_len, HAS_CU, HAS_HIST, FEW, H)
        win = halo_window(win, ins, pos, d, hist_ptr, cols, cmask, C, n_seg, HAS_HIST, H)
    pre = conv_pre(b, ws, win)
    store_at(yp, t, act_out(pre, ACT), cmask, S, MASKED and BOUNDS)


@triton.jit
def _fwd_step(yp, t, rows, b, ws, cu_ptr, hist_ptr, cols, cmask, sy, S, C, n_seg, seq_len, seg, ids,
              HAS_CU: tl.constexpr, HAS_HIST: tl.constexpr, MASKED: tl.constexpr, FEW: tl.constexpr,
              BOUNDS: tl.constexpr, ACT: tl.constexpr, STEP: tl.constexpr):
    """Outputs of rows t .. t + STEP - 1 from the H + STEP rows t - H .. t + STEP - 1 (``rows``, a
    tuple).

    ``ids``: the segment indices of those rows in a many-segment program with per-token
    indices (HAS_CU == SEGMENT_IDS, not FEW); each row then gets its own window of them (the
    forward reads only the rows before: the entries past the last row are never used).
    """
    W: tl.constexpr = len(ws)
    H: tl.constexpr = W - 1
    if MASKED and (not FEW) and HAS_CU == SEGMENT_IDS:
        segs = ids_windows(ids, STEP, H)
    else:
        segs = repeated(seg, STEP)
    for k in tl.static_range(STEP):
        win = rows[k:k + W]
        yk = rows_ahead(yp, k, sy)
        _fwd_row(yk, row_offset(t, k), win, b, ws, cu_ptr, hist_ptr, cols, cmask, S, C, n_seg, seq_len, segs[k],
                 HAS_CU, HAS_HIST, MASKED, FEW, ACT, BOUNDS)


@triton.jit
def _fwd_run(x_ptr, y_ptr, cu_ptr, hist_ptr, rows0, cols, cmask, sx, sy, S, C, n_seg, seq_len,
             seg, b, ws,
             HAS_CU: tl.constexpr, HAS_HIST: tl.constexpr, MASKED: tl.constexpr, FEW: tl.constexpr, SUB: tl.constexpr,
             STAGES: tl.constexpr, ACT: tl.constexpr, BOUNDS: tl.constexpr = True, ROWS_PER_STEP: tl.constexpr = 0):
    """Walk the R sub-runs starting at rows0 ([R]) for SUB rows, STEP rows per step.

    STAGES > 1 lets Triton software-pipeline the loop: the loads of the next STAGES - 1 steps go to
    shared memory (cp.async) while this step computes, holding no registers while in flight.
    BOUNDS (masked programs near either end of the rows): rows outside [0, S) read as zero and
    are not stored; without it every row the program touches lies inside, and nothing is checked.
    The H rows before the step's are carried from step to step (a tuple of tiles). Triton pipelines
    the loads only when a loaded row lives in its own step and the next one alone, so a step takes
    at least H rows: STEP = 4 up to W = 5, 8 above. ROWS_PER_STEP > 0 sets STEP instead (the quick
    twin's 1: a smaller loop body to compile, the same bits).
    """
    H: tl.constexpr = len(ws) - 1
    STEP: tl.constexpr = ROWS_PER_STEP if ROWS_PER_STEP > 0 else 4 + 4 * (H > 4)
    hist = ()
    for j in tl.static_range(H):
        hist = hist + (load_rows(x_ptr, rows0 - (H - j), sx, cols, cmask, S, MASKED and BOUNDS),)
    x_base = row_ptrs(x_ptr, rows0, sx, cols)
    y_base = row_ptrs(y_ptr, rows0, sy, cols)
    # Many segments with per-token indices: the indices of the rows, loaded and carried as x is
    # (placeholders otherwise; nothing reads them).
    IDS: tl.constexpr = MASKED and (not FEW) and HAS_CU == SEGMENT_IDS
    hist_ids = ()
    for j in tl.static_range(H):
        if IDS:
            hist_ids = hist_ids + (load_ids(cu_ptr, rows0 - (H - j), n_seg, seq_len, BOUNDS),)
        else:
            hist_ids = hist_ids + (rows0 * 0,)
    for i in tl.range(0, SUB, STEP, num_stages=STAGES):
        t = rows0 + i
        xp = x_base + i * sx
        new_x = ()
        for k in tl.static_range(STEP):
            new_x = new_x + (load_at(rows_ahead(xp, k, sx), row_offset(t, k), cmask, S, MASKED and BOUNDS),)
        new_ids = load_ids_rows(cu_ptr, t, n_seg, seq_len, hist_ids[0], 0, STEP, IDS, BOUNDS)
        rows = hist + new_x
        ids = hist_ids + new_ids
        _fwd_step(y_base + i * sy, t, rows, b, ws, cu_ptr, hist_ptr, cols, cmask, sy, S, C, n_seg, seq_len, seg, ids,
                  HAS_CU, HAS_HIST, MASKED, FEW, BOUNDS, ACT, STEP)
        hist = rows[STEP:]
        hist_ids = ids[STEP:]


@triton.jit(do_not_specialize=["S", "C8", "n_seg", "seq_len"])
def cake_conv_fwd_kernel(x_ptr, y_ptr, w_ptr, b_ptr, cu_ptr, hist_ptr,
                         S, C8, n_seg, seq_len,
                         SX8: tl.constexpr, SY8: tl.constexpr,
                         HAS_BIAS: tl.constexpr, HAS_CU: tl.constexpr, HAS_HIST: tl.constexpr,
                         R: tl.constexpr, SUB: tl.constexpr, BC: tl.constexpr, STAGES: tl.constexpr,
                         W: tl.constexpr, ACT: tl.constexpr):
    """y[t, c] = act(b[c] + sum_{k<W} w[c, k] * x[t - (W - 1) + k, c]), rows of other segments read
    as 0; act = silu (ACT = 1) or the identity (ACT = 0).

    Grid: (cdiv(S, R * SUB) * cdiv(C, BC),), channel blocks fastest. C8 = C / 8 and SX8, SY8 =
    row strides / 8 (so the compiler knows every row starts 16-byte aligned); the strides are
    compile-time constants, so the rows of a loop step are one base address plus immediate
    offsets. ``hist`` [N, H, C] (HAS_HIST, KCP; H = W - 1) holds the x rows before each segment's
    first row, zero where its document has none.
    """
    H: tl.constexpr = W - 1
    C, pid_s, cols, cmask, b, ws, p0, p_last, rows0 = program_rows(w_ptr, b_ptr, C8, HAS_BIAS, R, SUB, BC, W)
    sx: tl.constexpr = SX8 * 8
    sy: tl.constexpr = SY8 * 8
    # Rows read: p0 - H .. p_last. The cu[0] = 0 and cu[N] = S boundaries make
    # the first and the last programs take the masked path.
    n_lo, masked = window_has_boundary(cu_ptr, n_seg, p0 - H, p_last, seq_len, HAS_CU)
    if masked:
        d_lo, d_hi, seg = program_segments(cu_ptr, n_seg, n_lo, p_last, seq_len, HAS_CU)
        if d_hi - d_lo < FEW_SEGMENTS:
            _fwd_run(x_ptr, y_ptr, cu_ptr, hist_ptr, rows0, cols, cmask, sx, sy, S, C, n_seg, seq_len,
                     seg, b, ws, HAS_CU, HAS_HIST, True, True, SUB, STAGES, ACT)
        elif (p0 - H < 0) | (p_last >= S):  # reads rows outside [0, S)
            _fwd_run(x_ptr, y_ptr, cu_ptr, hist_ptr, rows0, cols, cmask, sx, sy, S, C, n_seg, seq_len,
                     seg, b, ws, HAS_CU, HAS_HIST, True, False, SUB, STAGES, ACT, True)
        else:  # many segments away from both ends (short documents): no row bounds to check
            _fwd_run(x_ptr, y_ptr, cu_ptr, hist_ptr, rows0, cols, cmask, sx, sy, S, C, n_seg, seq_len,
                     seg, b, ws, HAS_CU, HAS_HIST, True, False, SUB, STAGES, ACT, False)
    else:
        # No boundary in (p0 - H, p_last]: every tap is inside, every row inside [0, S).
        no_seg = (n_lo, n_lo, 0, 0, 0, 0, 0, 0)  # unused: no row needs its segment
        _fwd_run(x_ptr, y_ptr, cu_ptr, hist_ptr, rows0, cols, cmask, sx, sy, S, C, n_seg, seq_len,
                 no_seg, b, ws, HAS_CU, HAS_HIST, False, False, SUB, STAGES, ACT)


@triton.jit(do_not_specialize=["S", "C8", "n_seg", "seq_len", "sx8", "sy8"])
def cake_conv_fwd_quick_kernel(x_ptr, y_ptr, w_ptr, b_ptr, cu_ptr, hist_ptr,
                               S, C8, n_seg, seq_len, sx8, sy8,
                               HAS_BIAS: tl.constexpr, HAS_CU: tl.constexpr, HAS_HIST: tl.constexpr,
                               R: tl.constexpr, SUB: tl.constexpr, BC: tl.constexpr,
                               W: tl.constexpr, ACT: tl.constexpr):
    """The forward's quick twin: ``cake_conv_fwd_kernel``'s y, bit for bit, from a kernel that compiles
    several times faster and serves every C and row stride (what a first training step runs while
    the full kernels compile, compile_ahead.py).

    Every program takes the one walk that is right for any program, the masked walk of many
    segments with row bounds, in one stage (each walk computes every element with the same FMAs: the
    full kernel's four walks differ in what they may skip, not in the arithmetic), one row a step (a
    smaller loop body to compile). The row strides
    are integer arguments (sx8, sy8: strides / 8) and the launch configuration is one for every C
    (launch.py), so the compiled kernel depends on the dtypes, the flags, W and the activation only.
    It runs slower than the full kernel.
    """
    H: tl.constexpr = W - 1
    C, pid_s, cols, cmask, b, ws, p0, p_last, rows0 = program_rows(w_ptr, b_ptr, C8, HAS_BIAS, R, SUB, BC, W)
    n_lo, _ = window_has_boundary(cu_ptr, n_seg, p0 - H, p_last, seq_len, HAS_CU)
    _, _, seg = program_segments(cu_ptr, n_seg, n_lo, p_last, seq_len, HAS_CU)
    _fwd_run(x_ptr, y_ptr, cu_ptr, hist_ptr, rows0, cols, cmask, sx8 * 8, sy8 * 8, S, C, n_seg, seq_len,
             seg, b, ws, HAS_CU, HAS_HIST, True, False, SUB, 1, ACT, True, ROWS_PER_STEP=1)


@triton.jit(do_not_specialize=["n_rows", "S", "C8", "n_seg"])
def cake_conv_fwd_rows_kernel(x_ptr, y_ptr, w_ptr, b_ptr, cu_ptr, hist_ptr, rows_ptr,
                              n_rows, S, C8, n_seg,
                              SX8: tl.constexpr, SY8: tl.constexpr,
                              HAS_BIAS: tl.constexpr, RB: tl.constexpr, BC: tl.constexpr,
                              W: tl.constexpr, ACT: tl.constexpr):
    """y of the listed local rows t = rows[i], reading the history halo ``hist`` [N, W - 1, C] (KCP).

    The first rows of each segment whose document started elsewhere: the main kernel, launched
    while the exchange was in flight, wrote them as if the document started there; this rewrites
    them with the same helpers and FMA sequence (same bits as a single-rank run).
    Grid: (cdiv(n_rows, RB), cdiv(C, BC)).
    """
    C, cols, cmask, b, ws, i, imask, t = row_list_setup(w_ptr, b_ptr, rows_ptr, n_rows, S, C8, HAS_BIAS, RB, BC, W)
    sx: tl.constexpr = SX8 * 8
    sy: tl.constexpr = SY8 * 8
    win = load_window(x_ptr, t, sx, cols, cmask, S, 1 - W, W)
    _fwd_row(row_ptrs(y_ptr, t, sy, cols), t, win, b, ws, cu_ptr, hist_ptr, cols, cmask, S, C,
             n_seg, S, segment_window(cu_ptr, n_seg, 0, n_seg - 1, S, True), True, True, True, False, ACT)
