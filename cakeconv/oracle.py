"""Float64 oracle of the packed causal conv1d + SiLU (or no activation), for any width W in 2..8
(tests, demo and benchmarks import it).

Shape legend: S packed tokens, C channels, W taps, H = W - 1, N documents.

The oracle is the op's definition (``cake_causal_conv1d_det``), computed the slowest and plainest way: one
``torch.nn.functional.conv1d(groups=C)`` per document with H = W - 1 rows of left zero padding,
then SiLU (activation "silu") or nothing (activation None), all in float64 on the CPU; the backward
is torch autograd of the same graph.

With many documents (more than ``PER_DOCUMENT_LIMIT``) one conv1d per document costs minutes
(50,021 one-token documents at C = 1,160: 504 s on a 2-core CPU), so the oracle computes the same
definition in one pass instead: tap k of row t is x[t - H + k] where that row is in t's document and
zero otherwise, pre = b + sum_k w[:, k] * tap_k. ``tests/test_oracle.py`` checks that the two
forms agree.

``causal_conv1d_oracle`` / ``causal_conv1d_oracle_backward`` take ``activation``;
``causal_conv1d_silu_oracle`` / ``causal_conv1d_silu_oracle_backward`` are the same functions
(their default activation is SiLU).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["causal_conv1d_oracle", "causal_conv1d_oracle_backward", "causal_conv1d_silu_oracle",
           "causal_conv1d_silu_oracle_backward", "packed_view"]


def packed_view(x: torch.Tensor, cu_seqlens: torch.Tensor | None) -> tuple[torch.Tensor, list[int]]:
    """Return (x_SC, boundaries) for x of shape [S, C], [1, S, C] or [B, T, C].

    With ``cu_seqlens`` None, a [B, T, C] (or [S, C]) input is B (or 1) equal-length documents.
    """
    if x.dim() == 3:
        B, T, C = x.shape
        if cu_seqlens is None:
            return x.reshape(B * T, C), [b * T for b in range(B + 1)]
        return x.reshape(B * T, C), [int(v) for v in cu_seqlens.tolist()]
    S = x.shape[0]
    if cu_seqlens is None:
        return x, [0, S]
    return x, [int(v) for v in cu_seqlens.tolist()]


PER_DOCUMENT_LIMIT = 256


def _activate(pre, activation):
    if activation == "silu":
        return F.silu(pre)
    if activation is None:
        return pre
    raise ValueError(f"activation must be 'silu' or None, got {activation!r}")


def _oracle_graph(x_SC, w_CW, b_C, bounds, activation):
    if len(bounds) - 1 > PER_DOCUMENT_LIMIT:
        return _oracle_graph_one_pass(x_SC, w_CW, b_C, bounds, activation)
    return _oracle_graph_per_document(x_SC, w_CW, b_C, bounds, activation)


def _oracle_graph_one_pass(x_SC, w_CW, b_C, bounds, activation):
    """The definition without a loop over documents: masked taps, then the activation."""
    S, C = x_SC.shape
    H = w_CW.shape[1] - 1
    bounds_N1 = torch.tensor(bounds, dtype=torch.int64)
    t_S = torch.arange(S, dtype=torch.int64)
    start_S = bounds_N1[torch.searchsorted(bounds_N1, t_S, right=True) - 1]
    xp_SC = torch.cat([x_SC.new_zeros(H, C), x_SC], 0)
    pre_SC = x_SC.new_zeros(S, C) if b_C is None else b_C.expand(S, C)
    for k in range(H + 1):
        back = H - k
        inside_S1 = (t_S - back >= start_S).unsqueeze(1)
        pre_SC = pre_SC + w_CW[:, k] * (xp_SC[k:k + S] * inside_S1)
    return _activate(pre_SC, activation)


def _oracle_graph_per_document(x_SC, w_CW, b_C, bounds, activation):
    C = x_SC.shape[1]
    H = w_CW.shape[1] - 1
    pieces = []
    for d in range(len(bounds) - 1):
        x_LC = x_SC[bounds[d]:bounds[d + 1]]
        if x_LC.shape[0] == 0:
            continue
        x_1CL = F.pad(x_LC.t().unsqueeze(0), (H, 0))
        pre_1CL = F.conv1d(x_1CL, w_CW.unsqueeze(1), b_C, groups=C)
        pieces.append(_activate(pre_1CL[0].t(), activation))
    if not pieces:
        return x_SC.new_zeros(0, C)
    return torch.cat(pieces, 0)


def causal_conv1d_oracle(x, weight, bias=None, cu_seqlens=None, activation="silu") -> torch.Tensor:
    """y = act(b + sum_{k<W} w[:, k] * x[t - (W - 1) + k]) per document, in float64 on the CPU.

    weight: [C, W] taps (any W >= 1; w[:, W - 1] multiplies the current token). act: SiLU
    (activation "silu") or the identity (activation None). Returns a float64 CPU tensor of x's
    shape.
    """
    x_SC, bounds = packed_view(x, cu_seqlens)
    x_SC = x_SC.detach().double().cpu()
    w_CW = weight.detach().double().cpu()
    b_C = None if bias is None else bias.detach().double().cpu()
    return _oracle_graph(x_SC, w_CW, b_C, bounds, activation).reshape(x.shape)


def causal_conv1d_oracle_backward(dy, x, weight, bias=None, cu_seqlens=None, activation="silu"):
    """(dx, dweight [C, W], dbias) of the oracle in float64 (dbias None when bias is None)."""
    x_SC, bounds = packed_view(x, cu_seqlens)
    x_SC = x_SC.detach().double().cpu().requires_grad_(True)
    w_CW = weight.detach().double().cpu().requires_grad_(True)
    b_C = None if bias is None else bias.detach().double().cpu().requires_grad_(True)
    y_SC = _oracle_graph(x_SC, w_CW, b_C, bounds, activation)
    dy_SC = dy.detach().double().cpu().reshape(y_SC.shape)
    inputs = [x_SC, w_CW] + ([b_C] if b_C is not None else [])
    if y_SC.numel() == 0:
        grads = [torch.zeros_like(t) for t in inputs]
    else:
        grads = torch.autograd.grad(y_SC, inputs, dy_SC, allow_unused=True)
        grads = [torch.zeros_like(t) if g is None else g for t, g in zip(inputs, grads)]
    dx = grads[0].reshape(x.shape)
    db = grads[2] if b_C is not None else None
    return dx, grads[1], db


causal_conv1d_silu_oracle = causal_conv1d_oracle
causal_conv1d_silu_oracle_backward = causal_conv1d_oracle_backward
