"""Pure-PyTorch FP32 reference backend: the same math as the Triton kernels, on any device.

Shape legend: S packed tokens, C channels, W taps (2 <= W <= 8), H = W - 1 halo rows,
N documents.

Every element is computed in FP32 with one fixed sequence of elementwise operations, so the result
does not depend on the device's thread count, on the tensor's length or on a row's position in it:

    pre = b;  pre += w0 * x[t-H];  pre += w1 * x[t-H+1];  ...;  pre += w_{W-1} * x[t]
    activation "silu":  s = 1 / (1 + exp(-pre));  y = pre * s;  g = dy * (s * (1 + pre * (1 - s)))
    activation None:    y = pre;                                g = dy
    (y rounded once to x.dtype)
    dx  = w_{W-1} * g[t];  dx += w_{W-2} * g[t+1];  ...;  dx += w0 * g[t+H]
    dw[c, k] = tree_sum_t(g[t, c] * x[t-H+k, c]),   db[c] = tree_sum_t(g[t, c])

For W = 4 with SiLU this is the seed's sequence, operation for operation (the same bits).

Rows of another document (or outside the tensor) read as zero, except where the caller passes
halo rows: ``hist_NHC[d, j]`` is the x row H - j rows before segment d's first row and
``fut_NHC[d, j]`` the FP32 g row j + 1 rows after segment d's last row (context parallelism).
``tree_sum_t`` is a pairwise sum over a zero-padded power-of-two length (halves added
elementwise), a fixed order that no thread count or tensor layout can change. ``torch.sigmoid``
is not used: on the CPU it rounds the tail of a vector differently from its body.

The activation is "silu" or None and W = w_CW.shape[1] is in [2, 8]: the callers validated both
(``checks.check_problem``); these functions assert it.
"""

from __future__ import annotations

import torch

from .constants import ACTIVATIONS, MAX_WIDTH, MIN_WIDTH

__all__ = ["reference_forward", "reference_backward", "reference_g_dw", "reference_dx", "row_positions",
           "tree_sum_rows"]


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


def _halo_rows(w_CW: torch.Tensor) -> int:
    """H = W - 1 of the taps w_CW [C, W] (W checked by the callers' validation)."""
    W = w_CW.shape[1]
    assert MIN_WIDTH <= W <= MAX_WIDTH, W
    return W - 1


def _shifted_taps(x_SC, d_S, pos_S, hist_NHC, H):
    """x rows t-H, ..., t-1 as seen by row t (zero or halo row where they leave the segment)."""
    S, C = x_SC.shape
    xp = torch.cat([x_SC.new_zeros(H, C), x_SC], 0)
    taps = []
    for k in range(H, 0, -1):
        shifted = xp[H - k:H - k + S]
        inside = (pos_S >= k).unsqueeze(1)
        if hist_NHC is None:
            taps.append(torch.where(inside, shifted, torch.zeros_like(shifted)))
        else:
            j = (pos_S - k + H).clamp(0, H - 1)
            from_hist = hist_NHC.to(x_SC.dtype)[d_S, j]
            taps.append(torch.where(inside, shifted, from_hist))
    return taps  # [x(t-H), ..., x(t-1)]


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
    """(x, w in the compute dtype, d(t), pos(t), the H history taps, pre) of every row."""
    H = _halo_rows(w_CW)
    ct = _compute_dtype(x_SC)
    x32 = x_SC.to(ct)
    w32 = w_CW.to(ct)
    b32 = None if b_C is None else b_C.to(ct)
    d_S, pos_S = row_positions(x_SC.shape[0], cu_seqlens, seq_len, x_SC.device)
    taps = _shifted_taps(x32, d_S, pos_S, hist_NHC, H)
    return x32, w32, d_S, pos_S, taps, _pre(x32, w32, b32, taps)


def reference_forward(x_SC, w_CW, b_C, cu_seqlens, seq_len=None, out_SC=None, hist_NHC=None, activation="silu"):
    """y[S, C] in x's dtype: y = act(b + sum_{k<W} w[:, k] * x[t - H + k]) with act SiLU or the
    identity (activation None); see the module docstring for the arithmetic.

    w_CW: [C, W] taps (w[:, W - 1] multiplies the current token); hist_NHC: optional [N, H, C]
    rows before each segment (KCP). Writes into out_SC [S, C] when given and returns it.
    """
    assert activation in ACTIVATIONS, activation
    x32, w32, d_S, pos_S, taps, pre = _prologue(x_SC, w_CW, b_C, cu_seqlens, seq_len, hist_NHC)
    y = (pre * _sigmoid(pre) if activation == "silu" else pre).to(x_SC.dtype)
    if out_SC is None:
        return y
    out_SC.copy_(y)
    return out_SC


def reference_backward(dy_SC, x_SC, w_CW, b_C, cu_seqlens, seq_len=None, hist_NHC=None, fut_NHC=None,
                       activation="silu"):
    """(dx[S, C] FP32, dw[C, W] FP32, db[C] FP32, g[S, C] FP32) of ``reference_forward``.

    g = dy * silu'(pre) (activation "silu") or dy (None); dx[t] = sum_k w[:, k] g[t + H - k] (same
    segment, else ``fut_NHC``'s rows or zero); dw[:, k] = sum_t g[t] x[t - H + k]; db = sum_t g[t].
    """
    g, dw, db, w32, d_S = reference_g_dw(dy_SC, x_SC, w_CW, b_C, cu_seqlens, seq_len, hist_NHC, activation)
    return reference_dx(g, w32, d_S, cu_seqlens, seq_len, fut_NHC), dw, db, g


def reference_g_dw(dy_SC, x_SC, w_CW, b_C, cu_seqlens, seq_len=None, hist_NHC=None, activation="silu"):
    """The parts of the backward that need no look-ahead halo: (g [S, C], dw [C, W], db [C], w in the
    compute dtype, segment of each row). g = dy * silu'(pre) for "silu", g = dy for None. KCP
    computes them once, sends rows of g, then calls ``reference_dx``."""
    assert activation in ACTIVATIONS, activation
    x32, w32, d_S, pos_S, taps, pre = _prologue(x_SC, w_CW, b_C, cu_seqlens, seq_len, hist_NHC)
    if activation == "silu":
        s = _sigmoid(pre)
        g = dy_SC.to(x32.dtype) * (s * (1.0 + pre * (1.0 - s)))
    else:
        g = dy_SC.to(x32.dtype)
    dw = torch.stack([tree_sum_rows(g * xk) for xk in taps + [x32]], 1)
    db = tree_sum_rows(g)
    return g, dw, db, w32, d_S


def reference_dx(g_SC, w32_CW, d_S, cu_seqlens, seq_len=None, fut_NHC=None):
    """dx[t] = sum_{k=0..H} w[:, H - k] g[t + k] with W = w32_CW.shape[1], H = W - 1, added in the
    order k = 0, 1, ..., H: g of rows t+1..t+H of the same segment, else the halo ``fut_NHC``
    [N, H, C] (fut[d, j] = g row j + 1 rows after segment d's last row) or zero."""
    H = _halo_rows(w32_CW)
    S, C = g_SC.shape
    device = g_SC.device
    if cu_seqlens is None:
        T = seq_len if seq_len else max(S, 1)
        seg_end_S = (d_S + 1) * T
    else:
        cu = cu_seqlens.to(device=device, dtype=torch.int64)
        seg_end_S = cu[d_S + 1] if S > 0 else d_S
    t_S = torch.arange(S, device=device, dtype=torch.int64)
    gp = torch.cat([g_SC, g_SC.new_zeros(H, C)], 0)
    dx = w32_CW[:, H] * g_SC
    for k in range(1, H + 1):
        ahead = gp[k:k + S]
        inside = (t_S + k < seg_end_S).unsqueeze(1)
        if fut_NHC is None:
            gk = torch.where(inside, ahead, torch.zeros_like(ahead))
        else:
            j = (t_S + k - seg_end_S).clamp(0, H - 1)
            gk = torch.where(inside, ahead, fut_NHC.to(g_SC.dtype)[d_S, j])
        dx = dx + w32_CW[:, H - k] * gk
    return dx
