"""The autograd Function behind ``cake_causal_conv1d_det`` (single rank).

Shape legend: S packed tokens, C channels, W = 4 taps, N documents, B batch rows, T row length.
"""

from __future__ import annotations

import torch

from .ops import cake_causal_conv1d_det_train_backward, cake_causal_conv1d_det_train_forward


class CakeCausalConv1dDetFunction(torch.autograd.Function):
    """Packed width-4 depthwise causal conv1d + SiLU with a deterministic backward.

    ========  ===========================  =========================================
    operand   shape                        dtype
    ========  ===========================  =========================================
    x         [S, C] | [1, S, C] | [B,T,C]  bf16 / fp16 / fp32
    weight    [C, 4]                       fp32 / bf16 (w[:, 3] multiplies token t)
    bias      [C] or None                  fp32 / bf16 / fp16
    cu        [N + 1] or None              int32 / int64, on x's device
    y         x's shape                    x's dtype
    ========  ===========================  =========================================

    Forward, per document [cu[d], cu[d+1]) with rows before cu[d] read as zero, in FP32:
        pre[t] = b + sum_k w[:, k] * x[t - 3 + k],   y[t] = pre[t] * sigmoid(pre[t])
    Backward (pre recomputed from the saved x; nothing else of size S * C is saved):
        g[t]  = dy[t] * silu'(pre[t])
        dx[t] = sum_k w[:, k] * g[t + 3 - k]              (g of the same document only)
        dw    = sum_t g[t] * x[t - 3 + k],  db = sum_t g[t]   (FP32, one fixed order)
    dweight and dbias are returned in the weight's and the bias's dtype.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, cu_seqlens, backend):
        y = cake_causal_conv1d_det_train_forward(x, weight, bias, cu_seqlens, backend=backend)
        ctx.save_for_backward(x, weight, bias, cu_seqlens)
        ctx.backend = backend
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, bias, cu_seqlens = ctx.saved_tensors
        dx, dw, db = cake_causal_conv1d_det_train_backward(
            dy, x, weight, bias, cu_seqlens, dweight_dtype=weight.dtype, backend=ctx.backend)
        if db is not None and db.dtype != bias.dtype:
            db = db.to(bias.dtype)
        return dx, dw, db, None, None


def cake_causal_conv1d_det(x, weight, bias=None, *, cu_seqlens=None, backend="auto"):
    """Autograd-enabled packed width-4 depthwise causal conv1d + SiLU, bitwise deterministic.

    For token t of document [cu[d], cu[d+1]) (rows before cu[d] read as zero):
    ``y[t] = silu(bias + sum_{k=0..3} weight[:, k] * x[t - 3 + k])``, computed in FP32 and rounded
    once to x's dtype; the same as torch's ``conv1d(groups=C)`` with 3 rows of left zero padding
    per document, then SiLU.

    Args:
        x: [S, C] or [1, S, C] packed tokens (with ``cu_seqlens``), or [B, T, C] (B documents of
            T tokens; ``cu_seqlens`` must then be None). bf16, fp16 or fp32; C a multiple of 8.
        weight: [C, 4] fp32 or bf16 taps.
        bias: optional [C].
        cu_seqlens: int32/int64 [N + 1] on x's device, cu[0] = 0 <= ... <= cu[N] = S; empty
            documents allowed. None: one document per batch row.
        backend: "auto" (Triton on CUDA, reference on CPU), "triton" or "reference".

    Returns:
        y with x's shape and dtype. y, dx, dweight and dbias are bitwise identical on every call
        with the same inputs, device and library version.
    """
    return CakeCausalConv1dDetFunction.apply(x, weight, bias, cu_seqlens, backend)
