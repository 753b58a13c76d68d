"""Pure-PyTorch FP32 reference backend: the same math as the Triton kernels, on any device.

Shape legend: S packed tokens, C channels, W = 4 taps, N documents, H = 3 halo rows.

Every element is computed in FP32 with one fixed sequence of elementwise operations, so the result
does not depend on the device's thread count, on the tensor's length or on a row's position in it:

    pre = b;  pre += w0 * x[t-3];  pre += w1 * x[t-2];  pre += w2 * x[t-1];  pre += w3 * x[t]
    s   = 1 / (1 + exp(-pre));     y = pre * s                           (rounded once to x.dtype)
    g   = dy * (s * (1 + pre * (1 - s)))
    dx  = w3 * g[t];  dx += w2 * g[t+1];  dx += w1 * g[t+2];  dx += w0 * g[t+3]
    dw[c, k] = tree_sum_t(g[t, c] * x[t-3+k, c]),   db[c] = tree_sum_t(g[t, c])

Rows of another document (or outside the tensor) read as zero, except where the caller passes
halo rows: ``hist_NHC[d, j]`` is the x row 3 - j rows before segment d's first row and
``fut_NHC[d, j]`` the FP32 g row j rows after segment d's last row (context parallelism).
``tree_sum_t`` is a pairwise sum over a zero-padded power-of-two length (halves added
elementwise), a fixed order that no thread count or tensor layout can change. ``torch.sigmoid``
is not used: on the CPU it rounds the tail of a vector differently from its body.
"""

from __future__ import annotations

import torch

__all__ = ["reference_forward", "reference_backward", "row_positions", "tree_sum_rows"]


def row_positions(S: int, cu_seqlens: torch.Tensor | None, seq_len: int | None, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row t: (segment index d(t), position t - start(d(t))), int64 [S] each."""
    t_S = torch.arange(S, device=device, dtype=torch.int64)
    if cu_seqlens is None:
        T = seq_len if seq_len else max(S, 1)
        d_S = torch.div(t_S, T, rounding_mode="floor")
        return d_S, t_S - d_S * T
    cu = cu_seqlens.to(device=device, dtype=torch.int64)
    d_S = torch.searchsorted(cu, t_S, right=True) - 1
    return d_S, t_S - cu[d_S]


def tree_sum_rows(v_SX: torch.Tensor) -> torch.Tensor:
    """Sum over dim 0 in a fixed pairwise order: pad to a power of two, add halves elementwise."""
    n = v_SX.shape[0]
    if n == 0:
        return v_SX.new_zeros(v_SX.shape[1:])
    p = 1 << (n - 1).bit_length()
    if p != n:
        v_SX = torch.cat([v_SX, v_SX.new_zeros((p - n,) + tuple(v_SX.shape[1:]))], 0)
    while v_SX.shape[0] > 1:
        h = v_SX.shape[0] // 2
        v_SX = v_SX[:h] + v_SX[h:]
    return v_SX[0]


def _shifted_taps(x_SC, d_S, pos_S, hist_NHC):
    """x rows t-3, t-2, t-1 as seen by row t (zero or halo row where they leave the segment)."""
    S, C = x_SC.shape
    pad = x_SC.new_zeros(3, C)
    xp = torch.cat([pad, x_SC], 0)
    taps = []
    for k in (3, 2, 1):
        shifted = xp[3 - k:3 - k + S]
        inside = (pos_S >= k).unsqueeze(1)
        if hist_NHC is None:
            taps.append(torch.where(inside, shifted, torch.zeros_like(shifted)))
        else:
            j = (pos_S - k + 3).clamp(0, 2)
            from_hist = hist_NHC.to(x_SC.dtype)[d_S, j]
            taps.append(torch.where(inside, shifted, from_hist))
    return taps  # [x(t-3), x(t-2), x(t-1)]


def _pre(x_SC, w_CW, b_C, taps):
    pre = b_C.unsqueeze(0).expand_as(x_SC).clone() if b_C is not None else torch.zeros_like(x_SC)
    for k, xk in enumerate(taps + [x_SC]):
        pre = pre + w_CW[:, k] * xk
    return pre


def _sigmoid(p):
    return torch.reciprocal(1.0 + torch.exp(-p))


def _compute_dtype(x_SC):
    """FP32, or float64 for float64 input (only the tests' gradcheck passes float64)."""
    return torch.float64 if x_SC.dtype == torch.float64 else torch.float32


def _prologue(x_SC, w_CW, b_C, cu_seqlens, seq_len, hist_NHC):
    """(x, w in the compute dtype, d(t), pos(t), the three history taps, pre) of every row."""
    ct = _compute_dtype(x_SC)
    x32 = x_SC.to(ct)
    w32 = w_CW.to(ct)
    b32 = None if b_C is None else b_C.to(ct)
    d_S, pos_S = row_positions(x_SC.shape[0], cu_seqlens, seq_len, x_SC.device)
    taps = _shifted_taps(x32, d_S, pos_S, hist_NHC)
    return x32, w32, d_S, pos_S, taps, _pre(x32, w32, b32, taps)


def reference_forward(x_SC, w_CW, b_C, cu_seqlens, seq_len=None, out_SC=None, hist_NHC=None):
    """y[S, C] in x's dtype (see the module docstring for the arithmetic)."""
    x32, w32, d_S, pos_S, taps, pre = _prologue(x_SC, w_CW, b_C, cu_seqlens, seq_len, hist_NHC)
    y = (pre * _sigmoid(pre)).to(x_SC.dtype)
    if out_SC is None:
        return y
    out_SC.copy_(y)
    return out_SC


def reference_backward(dy_SC, x_SC, w_CW, b_C, cu_seqlens, seq_len=None, hist_NHC=None, fut_NHC=None):
    """(dx[S, C] FP32, dw[C, 4] FP32, db[C] FP32, g[S, C] FP32)."""
    g, dw, db, w32, d_S = reference_g_dw(dy_SC, x_SC, w_CW, b_C, cu_seqlens, seq_len, hist_NHC)
    return reference_dx(g, w32, d_S, cu_seqlens, seq_len, fut_NHC), dw, db, g


def reference_g_dw(dy_SC, x_SC, w_CW, b_C, cu_seqlens, seq_len=None, hist_NHC=None):
    """The parts of the backward that need no look-ahead halo: (g, dw, db, w in the compute dtype,
    segment of each row). KCP computes them once, sends rows of g, then calls ``reference_dx``."""
    x32, w32, d_S, pos_S, taps, pre = _prologue(x_SC, w_CW, b_C, cu_seqlens, seq_len, hist_NHC)
    s = _sigmoid(pre)
    g = dy_SC.to(x32.dtype) * (s * (1.0 + pre * (1.0 - s)))
    dw = torch.stack([tree_sum_rows(g * xk) for xk in taps + [x32]], 1)
    db = tree_sum_rows(g)
    return g, dw, db, w32, d_S


def reference_dx(g_SC, w32_CW, d_S, cu_seqlens, seq_len=None, fut_NHC=None):
    """dx[t] = sum_k w[3 - k] g[t + k]: g of rows t+1..t+3 of the same segment, else the halo (or zero)."""
    S, C = g_SC.shape
    device = g_SC.device
    if cu_seqlens is None:
        T = seq_len if seq_len else max(S, 1)
        seg_end_S = (d_S + 1) * T
    else:
        cu = cu_seqlens.to(device=device, dtype=torch.int64)
        seg_end_S = cu[d_S + 1] if S > 0 else d_S
    t_S = torch.arange(S, device=device, dtype=torch.int64)
    gp = torch.cat([g_SC, g_SC.new_zeros(3, C)], 0)
    dx = w32_CW[:, 3] * g_SC
    for k in (1, 2, 3):
        ahead = gp[k:k + S]
        inside = (t_S + k < seg_end_S).unsqueeze(1)
        if fut_NHC is None:
            gk = torch.where(inside, ahead, torch.zeros_like(ahead))
        else:
            j = (t_S + k - seg_end_S).clamp(0, 2)
            gk = torch.where(inside, ahead, fut_NHC.to(g_SC.dtype)[d_S, j])
        dx = dx + w32_CW[:, 3 - k] * gk
    return dx
