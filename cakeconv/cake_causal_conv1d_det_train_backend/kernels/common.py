"""Triton helpers shared by the forward and backward kernels (no launches here).

Shape legend: R sub-runs handled side by side by one program, BC channels of its channel block,
S packed tokens, C channels, N segments (documents, or document pieces under KCP), W taps
(2 <= W <= 8, a compile-time constant of every conv kernel), H = W - 1 halo rows.

Windows of rows are Triton tuples of [R, BC] tiles, built and indexed with compile-time indices:
``win[k]`` is the x row t - H + k of rows t (k = 0..W-1; ``win[H]`` is row t itself), ``ws[k]``
the tap that multiplies it. For W = 4 every helper traces to the same operations, in the same
order, as the width-4 code it generalizes (tools/ptx_fingerprint.py compares the PTX).

A program's rows are R sub-runs of consecutive tokens; each register tile is [R, BC] and holds one
row of every sub-run. Segment boundaries come from ``cu`` (``HAS_CU``) or, for [B, T, C] input,
from the uniform length ``seq_len`` (boundaries d * T). A program whose rows (and the rows its
taps reach) contain no boundary takes the unmasked path; otherwise it places each row t in its
segment d(t): by comparing t with the boundaries it loaded once when the program touches at most
FEW_SEGMENTS segments (nearly always; the backward at W >= 6 with indices: 2), else by comparing
the per-token segment indices of neighbouring rows (built once per cu_seqlens, segment_ids.py) or,
without those, a binary search restricted to its segments. Rows outside [0, S) read as zero and are
never stored. The forward checks that only in masked programs at either end of the rows (``BOUNDS``;
every other program's rows are inside [0, S)); the backward checks it in every masked program.
"""

import triton
import triton.language as tl

from ..constants import INTERPRET as _INTERPRET

# The CPU interpreter has no PTX: there the sigmoid takes the exact formula. On the GPU it takes
# the hardware approximations.
INTERPRET: tl.constexpr = tl.constexpr(_INTERPRET)
NEG_LOG2E: tl.constexpr = tl.constexpr(-1.4426950408889634)


@triton.jit
def count_bounds_le(cu_ptr, n_seg, t, seq_len, HAS_CU: tl.constexpr, K: tl.constexpr = 64):
    """Number of boundaries cu[d] (d = 0..N) that are <= t, for a scalar t (0 when t < 0).

    K-ary search: each round loads K evenly spaced candidates at once, so N up to 2**18 needs
    at most three rounds of dependent loads. With per-token segment indices (HAS_CU ==
    SEGMENT_IDS) one load: ids[t] = max{d : cu[d] <= t} is that count minus one for 0 <= t < S,
    and load_ids gives -1 before row 0 and N at or past S (= cu[N]), so ids + 1 is the count
    everywhere.
    """
    if HAS_CU == SEGMENT_IDS:
        res = load_ids(cu_ptr, t, n_seg, seq_len) + 1
    elif HAS_CU:
        lo = 0 * t  # invariant: cu[lo] <= t (cu[0] = 0); answer - 1 lies in [lo, lo + span]
        span = n_seg + 0 * t
        while span > 0:
            step = (span + K - 1) // K
            offs = (tl.arange(0, K) + 1) * step
            valid = offs <= span
            v = tl.load(cu_ptr + lo + offs, mask=valid, other=0)
            c = tl.sum(((v <= t) & valid).to(tl.int32), axis=0)
            lo = lo + c * step
            span = tl.minimum(step - 1, span - c * step)
        res = lo + 1
    else:
        res = tl.minimum(t // seq_len, n_seg) + 1
    return tl.where(t < 0, 0, res)


@triton.jit
def window_has_boundary(cu_ptr, n_seg, lo, hi, seq_len, HAS_CU: tl.constexpr):
    """(n_lo, flag): n_lo = #boundaries <= lo, flag = some boundary cu[d] lies in (lo, hi].

    One K-ary search and one load: the first boundary after lo is cu[n_lo]. With per-token
    segment indices, two independent loads: a boundary lies in (lo, hi] when fewer lie at or
    before lo than at or before hi.
    """
    n_lo = count_bounds_le(cu_ptr, n_seg, lo, seq_len, HAS_CU)
    if HAS_CU == SEGMENT_IDS:
        flag = n_lo != count_bounds_le(cu_ptr, n_seg, hi, seq_len, HAS_CU)
    elif HAS_CU:
        nxt = tl.load(cu_ptr + tl.minimum(n_lo, n_seg))
        flag = (n_lo <= n_seg) & (nxt <= hi)
    else:
        flag = n_lo != count_bounds_le(cu_ptr, n_seg, hi, seq_len, HAS_CU)
    return n_lo, flag


@triton.jit
def search_iters(span):
    """ceil(log2(span + 1)): binary-search rounds that shrink span + 1 candidates to one.

    ``span`` may be a compile-time constant (e.g. built from a literal): the loop variables are
    made tensors first, so the loop compiles either way.
    """
    s = span + tl.zeros((), tl.int32)
    n = tl.zeros((), tl.int32)
    while s > 0:
        s = s >> 1
        n += 1
    return n


@triton.jit
def segment_window(cu_ptr, n_seg, d_lo, d_hi, seq_len, HAS_CU: tl.constexpr):
    """``seg``: what segment_of_rows needs to place the rows of a program that touches segments
    d_lo..d_hi, as the tuple (d_lo, d_hi, n_iter, c0, c1, c2, c3, c4), where c_j = cu[d_lo + j]
    (INT_MAX past cu[N]) are loaded once here, for programs of at most FEW_SEGMENTS segments
    (without cu, equal segments of seq_len rows: c_j = (d_lo + j) * seq_len)."""
    n_iter = search_iters(d_hi - d_lo)
    if HAS_CU:
        c0 = tl.load(cu_ptr + d_lo, mask=d_lo <= n_seg, other=2147483647)
        c1 = tl.load(cu_ptr + d_lo + 1, mask=d_lo + 1 <= n_seg, other=2147483647)
        c2 = tl.load(cu_ptr + d_lo + 2, mask=d_lo + 2 <= n_seg, other=2147483647)
        c3 = tl.load(cu_ptr + d_lo + 3, mask=d_lo + 3 <= n_seg, other=2147483647)
        c4 = tl.load(cu_ptr + d_lo + 4, mask=d_lo + 4 <= n_seg, other=2147483647)
    else:
        c0 = _uniform_boundary(d_lo, n_seg, seq_len)
        c1 = _uniform_boundary(d_lo + 1, n_seg, seq_len)
        c2 = _uniform_boundary(d_lo + 2, n_seg, seq_len)
        c3 = _uniform_boundary(d_lo + 3, n_seg, seq_len)
        c4 = _uniform_boundary(d_lo + 4, n_seg, seq_len)
    return (d_lo, d_hi, n_iter, c0, c1, c2, c3, c4)


@triton.jit
def _uniform_boundary(j, n_seg, seq_len):
    """cu[j] = j * seq_len of equal segments (INT_MAX past cu[N]), without int32 overflow."""
    return tl.where(j <= n_seg, tl.minimum(j, n_seg) * seq_len, 2147483647)


FEW_SEGMENTS = tl.constexpr(4)  # programs touching at most this many segments place rows without loads
# HAS_CU takes three values: False (equal segments of seq_len rows), True (cu: rows of programs
# touching more than FEW_SEGMENTS segments are placed by a binary search over cu), SEGMENT_IDS (cu
# followed by one segment index per token: the loops load each row's index once, and a row's
# segment, start and end come from comparing it with its neighbours' indices).
SEGMENT_IDS = tl.constexpr(2)


@triton.jit
def _step_segment(t, j, d_lo, d_hi, cj, cj1, d, start, end):
    """Move rows t at or past boundary cj = cu[d_lo + j] (j <= d_hi - d_lo) into segment d_lo + j."""
    hit = (t >= cj) & (d_lo + j <= d_hi)
    return tl.where(hit, d_lo + j, d), tl.where(hit, cj, start), tl.where(hit, cj1, end)


@triton.jit
def load_ids(cu_ptr, t, n_seg, seq_len, BOUNDS: tl.constexpr = True):
    """Segment index of rows t ([R] int32) from the [cu (N + 1) | ids (S)] buffer
    (kernels/segment_ids.py): ids[t] for 0 <= t < S (seq_len = S), N at or past S, -1 before row 0.
    Never decreasing along the rows, as the ids themselves. Without BOUNDS every row t is known
    to lie in [0, S) (a program away from both ends): a plain load."""
    if BOUNDS:
        v = tl.load(cu_ptr + (n_seg + 1) + t, mask=(t >= 0) & (t < seq_len), other=n_seg)
        return tl.where(t < 0, -1, v)
    else:
        return tl.load(cu_ptr + (n_seg + 1) + t)


@triton.jit
def load_ids4(cu_ptr, t, n_seg, seq_len, fallback, K: tl.constexpr, IDS: tl.constexpr, BOUNDS: tl.constexpr = True):
    """load_ids of rows t + K .. t + K + 3 when IDS, else ``fallback`` four times (a loop step of a
    program without indices, which never reads them)."""
    if IDS:
        i_a = load_ids(cu_ptr, t + K, n_seg, seq_len, BOUNDS)
        i_b = load_ids(cu_ptr, t + (K + 1), n_seg, seq_len, BOUNDS)
        i_c = load_ids(cu_ptr, t + (K + 2), n_seg, seq_len, BOUNDS)
        i_d = load_ids(cu_ptr, t + (K + 3), n_seg, seq_len, BOUNDS)
    else:
        i_a = fallback
        i_b = fallback
        i_c = fallback
        i_d = fallback
    return i_a, i_b, i_c, i_d


@triton.jit
def load_ids_rows(cu_ptr, t, n_seg, seq_len, fallback, K: tl.constexpr, N: tl.constexpr, IDS: tl.constexpr,
                  BOUNDS: tl.constexpr = True):
    """load_ids of the N rows t + K .. t + K + N - 1 when IDS, else ``fallback`` N times (a loop step's
    rows): four at a time (load_ids4) when N is a multiple of 4, else one at a time (the quick twins'
    one-row steps)."""
    out = ()
    if N % 4 == 0:
        for k in tl.static_range(0, N, 4):
            out = out + load_ids4(cu_ptr, t, n_seg, seq_len, fallback, K + k, IDS, BOUNDS)
    else:
        for k in tl.static_range(N):
            if IDS:
                out = out + (load_ids(cu_ptr, row_offset(t, K + k), n_seg, seq_len, BOUNDS),)
            else:
                out = out + (fallback,)
    return out


@triton.jit
def ids_windows(ids, N_OUT: tl.constexpr, H: tl.constexpr):
    """N_OUT ``seg`` windows that history_flags takes with HAS_CU == SEGMENT_IDS in a many-segment
    program, from ``ids``: the segment indices (load_ids) of L consecutive rows r .. r + L - 1.

    Window k holds the indices of rows r + k .. r + k + 2H, the rows around its centre row
    r + k + H (entries past r + L - 1 repeat the last one: a loop step never reads those rows'
    ends), then a 0 (the window has segment_window's tuple length for W = 4).
    """
    L: tl.constexpr = len(ids)
    out = ()
    for k in tl.static_range(N_OUT):
        win = ()
        for m in tl.static_range(2 * H + 1):
            if k + m < L:
                win = win + (ids[k + m],)
            else:
                win = win + (ids[L - 1],)
        out = out + (win + (0,),)
    return out


@triton.jit
def segment_of_rows(cu_ptr, t, seg, n_seg, seq_len, HAS_CU: tl.constexpr, FEW: tl.constexpr):
    """(d, start, end) of the segment holding each row t ([R] int32), searched in seg's d_lo..d_hi.

    FEW (the program touches at most FEW_SEGMENTS segments): compares with the boundaries c_j that
    segment_window loaded, no loads here; else a binary search over cu. Rows at or past S are
    placed in the last segment searched (d_hi); nothing of theirs is stored, and halo_tap reads
    no halo row for them outside the halo buffers. Many-segment programs with per-token indices
    never come here (history_flags and dx_rows compare the indices themselves).
    """
    tl.static_assert(HAS_CU != SEGMENT_IDS or FEW, "per-token indices: use history_flags")
    d_lo, d_hi, n_iter, c0, c1, c2, c3, c4 = seg
    if HAS_CU:
        if FEW:
            d = tl.zeros_like(t) + d_lo
            start = tl.zeros_like(t) + c0
            end = tl.zeros_like(t) + c1
            d, start, end = _step_segment(t, 1, d_lo, d_hi, c1, c2, d, start, end)
            d, start, end = _step_segment(t, 2, d_lo, d_hi, c2, c3, d, start, end)
            d, start, end = _step_segment(t, 3, d_lo, d_hi, c3, c4, d, start, end)
        else:
            lo = tl.zeros_like(t) + d_lo
            hi = tl.zeros_like(t) + d_hi
            it = 0 * n_iter
            while it < n_iter:  # a while loop: the CPU interpreter cannot range() over a tensor
                mid = (lo + hi + 1) // 2
                ok = tl.load(cu_ptr + mid) <= t
                lo = tl.where(ok, mid, lo)
                hi = tl.where(ok, hi, mid - 1)
                it += 1
            start = tl.load(cu_ptr + lo)
            end = tl.load(cu_ptr + lo + 1, mask=lo < n_seg, other=2147483647)
            d = lo
    else:
        d = tl.minimum(t // seq_len, n_seg)
        start = d * seq_len
        end = start + seq_len
    return d, start, end


@triton.jit
def history_flags(cu_ptr, t, seg, n_seg, seq_len, HAS_CU: tl.constexpr, HAS_HALO: tl.constexpr,
                  FEW: tl.constexpr, H: tl.constexpr):
    """(d, pos, ins, end) of rows t: their segment d, pos = t - start (clamped to H with per-token
    indices; only read where a flag fails), ``ins`` the tuple of H flags ins[j] = (row t - H + j
    is in t's segment), j = 0..H-1 (window order), and the segment's end (clamped to t + H + 1
    with per-token indices).

    With per-token indices in a many-segment program (HAS_CU == SEGMENT_IDS, not FEW; ``seg`` from
    ids_windows) the flags are the index comparisons themselves: no count, no second comparison,
    and pos only for a halo (HAS_HALO). The indices never decrease along the rows, so the rows
    that share t's index are the nearest ones and ins[0] => ins[1] => ..., as pos >= H - j would
    give: the same values as the search, so the same bits. Else from segment_of_rows:
    ins[j] = pos >= H - j.
    """
    if HAS_CU == SEGMENT_IDS and (not FEW):
        i_0 = seg[H]
        ins = ()
        for j in tl.static_range(H):
            ins = ins + (seg[j] == i_0,)
        if HAS_HALO:
            pos = ins[H - 1].to(tl.int32)
            for k in tl.static_range(2, H + 1):
                pos = pos + ins[H - k].to(tl.int32)
        else:
            pos = t * 0  # halo_tap reads no halo without one
        d = i_0
        end = t + 1
        for k in tl.static_range(1, H + 1):
            end = end + (seg[H + k] == i_0).to(tl.int32)
    else:
        d, start, end = segment_of_rows(cu_ptr, t, seg, n_seg, seq_len, HAS_CU, FEW)
        pos = t - start
        ins = ()
        for j in tl.static_range(H):
            ins = ins + (pos >= H - j,)
    return d, pos, ins, end


@triton.jit
def load_rows(ptr, t, stride, cols, cmask, S, ROWMASK: tl.constexpr):
    """FP32 tile [R, BC] of rows t (int32 [R]); rows outside [0, S) read as zero if ROWMASK."""
    offs = t.to(tl.int64)[:, None] * stride + cols[None, :]
    if ROWMASK:
        m = ((t >= 0) & (t < S))[:, None] & cmask[None, :]
    else:
        m = cmask[None, :]
    return tl.load(ptr + offs, mask=m, other=0.0).to(tl.float32)


@triton.jit
def row_ptrs(ptr, t, stride, cols):
    """Pointer tile [R, BC] of rows t (int32 [R]), channels cols: computed once per row run, then
    moved by scalar row offsets (one 64-bit add per access instead of a 64-bit multiply)."""
    return ptr + t.to(tl.int64)[:, None] * stride + cols[None, :]


@triton.jit
def to_f32(v):
    """v as FP32 (exact for bf16, fp16 and fp32).

    bf16 on the GPU: two elements packed in one 32-bit register become two FP32 values with one
    instruction each (shift the low half up, mask the high half), where the compiler's own
    conversion spends three per pair (PRMT, SHF, IMAD). Same bits either way.
    """
    if INTERPRET:
        return v.to(tl.float32)
    elif v.dtype == tl.bfloat16:
        return tl.inline_asm_elementwise("{ shl.b32 $0, $2, 16; and.b32 $1, $2, 0xffff0000; }", "=r,=r,r", [v],
                                         dtype=tl.float32, is_pure=True, pack=2)
    else:
        return v.to(tl.float32)


@triton.jit
def load_at(p, t, cmask, S, ROWMASK: tl.constexpr):
    """FP32 tile at pointers p [R, BC] of rows t; rows outside [0, S) read as zero if ROWMASK."""
    if ROWMASK:
        m = ((t >= 0) & (t < S))[:, None] & cmask[None, :]
    else:
        m = cmask[None, :]
    return to_f32(tl.load(p, mask=m, other=0.0))


@triton.jit
def store_at(p, t, v, cmask, S, ROWMASK: tl.constexpr):
    """Store tile v [R, BC] (cast to the pointers' dtype) at pointers p of rows t."""
    if ROWMASK:
        m = ((t >= 0) & (t < S))[:, None] & cmask[None, :]
    else:
        m = cmask[None, :]
    tl.store(p, v.to(p.dtype.element_ty), mask=m)


@triton.jit
def store_rows(ptr, t, v, stride, cols, cmask, S, ROWMASK: tl.constexpr):
    """Store tile v [R, BC] (cast to the pointer's dtype) into rows t."""
    offs = t.to(tl.int64)[:, None] * stride + cols[None, :]
    if ROWMASK:
        m = ((t >= 0) & (t < S))[:, None] & cmask[None, :]
    else:
        m = cmask[None, :]
    tl.store(ptr + offs, v.to(ptr.dtype.element_ty), mask=m)


@triton.jit
def halo_tap(a, inside, j, d, halo_ptr, cols, cmask, C, n_seg, HAS_HALO: tl.constexpr, H: tl.constexpr):
    """Tap value: ``a`` where the tapped row is inside the row's segment (``inside`` [R] bool).

    Outside it reads zero, or, when HAS_HALO (KCP), the halo row ``halo[d, j]`` ([N, H, C]
    buffer, zero rows where the segment's document has no such row). Only d in [0, N) and j in
    [0, H) are read: a row of its segment never asks for more, but rows at or past S (the padding
    lanes of a row-list program read as row S) are placed in the last segment and would.
    """
    if HAS_HALO:
        hrow = (d * H + j).to(tl.int64)
        hm = ((~inside) & (d >= 0) & (d < n_seg) & (j >= 0) & (j < H))[:, None] & cmask[None, :]
        h = tl.load(halo_ptr + hrow[:, None] * C + cols[None, :], mask=hm, other=0.0).to(tl.float32)
        return tl.where(inside[:, None], a, h)
    else:
        return tl.where(inside[:, None], a, 0.0)


@triton.jit
def halo_window(win, ins, pos, d, halo_ptr, cols, cmask, C, n_seg, HAS_HALO: tl.constexpr, H: tl.constexpr):
    """The window ``win`` (x rows t - H .. t of rows t) with its H history taps masked by
    ``ins`` (history_flags): win[j] where row t - H + j is in t's segment, else zero or, with
    HAS_HALO, the halo row halo[d, pos + j]. win[H] (row t) is returned as it is."""
    out = ()
    for j in tl.static_range(H):
        out = out + (halo_tap(win[j], ins[j], row_offset(pos, j), d, halo_ptr, cols, cmask, C, n_seg, HAS_HALO, H),)
    return out + (win[H],)


@triton.jit
def load_taps(w_ptr, b_ptr, cols, cmask, HAS_BIAS: tl.constexpr, BC: tl.constexpr, W: tl.constexpr):
    """(b, ws): FP32 [1, BC] rows of the bias (zero without one) and the tuple of the W taps
    (``ws[k]`` = w[:, k], which multiplies x[t - (W - 1) + k])."""
    ws = ()
    for k in tl.static_range(W):
        ws = ws + (tl.load(w_ptr + cols * W + k, mask=cmask, other=0.0).to(tl.float32)[None, :],)
    if HAS_BIAS:
        b = tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    else:
        b = tl.zeros([1, BC], dtype=tl.float32)
    return b, ws


@triton.jit
def row_list_setup(w_ptr, b_ptr, rows_ptr, n_rows, S, C8, HAS_BIAS: tl.constexpr, RB: tl.constexpr,
                   BC: tl.constexpr, W: tl.constexpr):
    """Start of a row-list program (KCP boundary rows; grid (cdiv(n_rows, RB), cdiv(C, BC))).

    Returns (C, cols, cmask, b, ws, i, imask, t): the channel block and its taps (load_taps), the
    program's RB list positions i and their local rows t (int32; positions past the list read as
    row S, so nothing of theirs is stored).
    """
    C = C8 * 8
    cols = tl.program_id(1) * BC + tl.arange(0, BC)
    cmask = cols < C
    b, ws = load_taps(w_ptr, b_ptr, cols, cmask, HAS_BIAS, BC, W)
    i = tl.program_id(0) * RB + tl.arange(0, RB)
    imask = i < n_rows
    t = tl.load(rows_ptr + i, mask=imask, other=S).to(tl.int32)
    return C, cols, cmask, b, ws, i, imask, t


@triton.jit
def load_window(ptr, t, stride, cols, cmask, S, LO: tl.constexpr, N: tl.constexpr):
    """The tuple of the FP32 rows t + LO .. t + LO + N - 1 of rows t ([R]), in row order; rows
    outside [0, S) read as zero. (LO = -H, N = W: the x window of rows t.)"""
    win = ()
    for k in tl.static_range(N):
        win = win + (load_rows(ptr, row_offset(t, LO + k), stride, cols, cmask, S, True),)
    return win


@triton.jit
def repeated(v, N: tl.constexpr):
    """The tuple (v, v, ..., v) of N entries."""
    out = ()
    for _ in tl.static_range(N):
        out = out + (v,)
    return out


@triton.jit
def rows_ahead(p, K: tl.constexpr, stride):
    """Pointers p moved K >= 0 rows of ``stride`` elements: p itself when K = 0. ``stride`` is a
    compile-time constant (the full kernels: an immediate offset, as ``row_offset``) or an integer
    argument (the quick kernels)."""
    if K == 0:
        return p
    else:
        return p + K * stride


@triton.jit
def program_rows(w_ptr, b_ptr, C8, HAS_BIAS: tl.constexpr, R: tl.constexpr, SUB: tl.constexpr, BC: tl.constexpr,
                 W: tl.constexpr):
    """What a program of the forward and backward kernels owns: (C, pid_s, cols, cmask, b, ws, p0,
    p_last, rows0). A 1-D grid, channel blocks fastest (the programs of one row block run side by
    side and read whole rows together); program (pid_s, pid_c) has the BC channels ``cols``
    (``cmask``: those < C, C = 8 C8), their taps (``load_taps``) and the R sub-runs of SUB rows from
    rows0 ([R]): rows p0 .. p_last."""
    C = C8 * 8
    n_cblk = tl.cdiv(C, BC)
    pid_s = tl.program_id(0) // n_cblk
    pid_c = tl.program_id(0) % n_cblk
    cols = pid_c * BC + tl.arange(0, BC)
    cmask = cols < C
    b, ws = load_taps(w_ptr, b_ptr, cols, cmask, HAS_BIAS, BC, W)
    p0 = pid_s * (R * SUB)
    p_last = p0 + R * SUB - 1
    rows0 = p0 + tl.arange(0, R) * SUB
    return C, pid_s, cols, cmask, b, ws, p0, p_last, rows0


@triton.jit
def program_segments(cu_ptr, n_seg, n_lo, hi, seq_len, HAS_CU: tl.constexpr):
    """(d_lo, d_hi, seg) of a masked program whose rows (and the rows they read) end at ``hi``:
    the segments it touches, d_lo .. d_hi (n_lo: boundaries at or before its first row read,
    ``window_has_boundary``), and their ``segment_window``."""
    d_lo = tl.maximum(n_lo - 1, 0)
    d_hi = count_bounds_le(cu_ptr, n_seg, hi, seq_len, HAS_CU) - 1
    return d_lo, d_hi, segment_window(cu_ptr, n_seg, d_lo, d_hi, seq_len, HAS_CU)


@triton.jit
def row_offset(t, K: tl.constexpr):
    """t + K for a compile-time K (rows t, or pointers moved by K elements): t itself when K = 0,
    t - |K| when K < 0 (what the width-4 code wrote, so that its PTX stays the same)."""
    if K < 0:
        return t - (0 - K)
    elif K == 0:
        return t
    else:
        return t + K


@triton.jit
def conv_pre(b, ws, win):
    """pre = b + ws[0] * win[0] + ws[1] * win[1] + ... + ws[W-1] * win[W-1] (win[k] = x[t - H + k]),
    as W FMAs in this order."""
    p = tl.fma(ws[0], win[0], b)
    for k in tl.static_range(1, len(ws)):
        p = tl.fma(ws[k], win[k], p)
    return p


@triton.jit
def act_out(p, ACT: tl.constexpr):
    """The activation of pre-activation p: silu(p) = p * sigmoid(p) (ACT = 1) or p itself (ACT = 0)."""
    if ACT:
        return p * sigmoid_f32(p)
    else:
        return p


@triton.jit
def act_grad(dy, p, ACT: tl.constexpr):
    """g = dy * act'(p): dy * s * (1 + p (1 - s)) with s = sigmoid(p) (ACT = 1), or dy (ACT = 0)."""
    if ACT:
        s = sigmoid_f32(p)
        return dy * (s * (1.0 + p * (1.0 - s)))
    else:
        return dy


@triton.jit
def sigmoid_f32(p):
    """1 / (1 + 2^(-p log2 e)) in FP32, one formula for every kernel (forward, backward, KCP rows).

    On the GPU: ``ex2.approx.ftz`` and ``rcp.approx.ftz`` (two MUFU instructions; relative error
    ~2^-22, far below bf16's 2^-8 and within the FP32 tolerances of the gradients), instead of
    ``exp`` with denormal handling and an IEEE divide: 14 instead of 25 instructions per element in
    the forward loop (counted in the SASS on the H200). Deterministic: the same instructions give the
    same bits on the same GPU. Under the CPU interpreter: the exact formula.
    """
    if INTERPRET:
        return 1.0 / (1.0 + tl.exp(-p))
    else:
        e = tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [p * NEG_LOG2E],
                                      dtype=tl.float32, is_pure=True, pack=1)
        return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [1.0 + e],
                                         dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def pairwise_sum_rows(v, M: tl.constexpr, N: tl.constexpr, LOGM: tl.constexpr):
    """Sum the M = 2**LOGM rows of v [M, N] as a pairwise tree ((r0 + r1) + (r2 + r3)) + ...

    The order is fixed by M alone (no layout or warp count enters), so the bits are too.
    """
    for lvl in tl.static_range(LOGM):
        v3 = tl.reshape(v, [M >> (lvl + 1), 2, N])
        a, b = tl.split(tl.permute(v3, (0, 2, 1)))
        v = a + b
    return tl.reshape(v, [N])
