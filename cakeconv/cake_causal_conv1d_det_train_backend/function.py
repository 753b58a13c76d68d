"""``cake_causal_conv1d_det`` and its autograd Function (single rank).

``cake_causal_conv1d_det`` calls the torch custom op ``cakeconv::cake_causal_conv1d_det_forward``
(custom_ops.py), whose registered autograd formula is ``CakeCausalConv1dDetFunction``'s
``setup_context`` / ``backward``; ``torch.compile(fullgraph=True)`` thus traces it without a break.

Shape legend: S packed tokens, C channels, W = 4 taps, N documents, B batch rows, T row length.
"""

from __future__ import annotations

import torch

from . import checks, custom_ops


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
    dweight and dbias are returned in the weight's and the bias's dtype, each rounded once from FP32.

    Autograd: ``setup_context`` and ``backward`` are the formula registered (torch.library) on the
    custom op ``torch.ops.cakeconv.cake_causal_conv1d_det_forward`` that ``cake_causal_conv1d_det``
    calls (custom_ops.py); forward and backward call that op and its backward op. The Function and
    the op therefore run the same code: ``CakeCausalConv1dDetFunction.apply(x, weight, bias,
    cu_seqlens, backend)`` gives bitwise the y and gradients of ``cake_causal_conv1d_det``.
    """

    @staticmethod
    def forward(x, weight, bias, cu_seqlens, backend):
        return custom_ops.forward_op(x, weight, bias, cu_seqlens, backend)

    setup_context = staticmethod(custom_ops.setup_context)
    backward = staticmethod(custom_ops.backward)


def _schema_types_ok(x, weight, bias, cu_seqlens, backend) -> bool:
    """True when the operands fit the custom op's schema (tensors, None where optional, a str)."""
    return (isinstance(x, torch.Tensor) and isinstance(weight, torch.Tensor)
            and (bias is None or isinstance(bias, torch.Tensor))
            and (cu_seqlens is None or isinstance(cu_seqlens, torch.Tensor))
            and isinstance(backend, str))


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
        with the same inputs, device and library version, in eager and under torch.compile (the
        op is the custom op ``torch.ops.cakeconv.cake_causal_conv1d_det_forward``, opaque to the
        compiler).

    Raises:
        TypeError, ValueError: bad operands (the message names the offending value), before any
            kernel launch; under torch.compile when the compiled graph runs.
    """
    if not _schema_types_ok(x, weight, bias, cu_seqlens, backend):
        # Not something the op's schema takes: raise the validation error that names it.
        checks.check_problem(x, weight, bias, cu_seqlens, backend)
        raise TypeError(f"cake_causal_conv1d_det got operands of types {type(x).__name__}, "
                        f"{type(weight).__name__}, {type(bias).__name__}, {type(cu_seqlens).__name__}, "
                        f"{type(backend).__name__}")
    return custom_ops.forward_op(x, weight, bias, cu_seqlens, backend)
