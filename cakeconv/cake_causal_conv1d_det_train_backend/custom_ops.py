"""The single-rank op as torch custom ops (``torch.library``, namespace ``cakeconv``).

Shape legend: S packed tokens, C channels, W = 4 taps.

Two ops, both thin wrappers of the entry points in ops.py (so their bits are those entry points'):

- ``torch.ops.cakeconv.cake_causal_conv1d_det_forward(x, weight, bias?, cu_seqlens?, backend) -> y``
- ``torch.ops.cakeconv.cake_causal_conv1d_det_backward(dy, x, weight, bias?, cu_seqlens?, backend)
  -> (dx, dweight, dbias)``

The forward op carries registered autograd (``setup_context`` / ``backward`` below; the backward
calls the backward op), so ``torch.compile`` sees one opaque, differentiable op: no graph break,
and the compiled y and gradients are bitwise the eager ones. ``CakeCausalConv1dDetFunction``
(function.py) is an autograd.Function built from the very same ``setup_context`` and ``backward``.

Choices:

- dbias when bias is None: a custom op cannot return None (nor ``Tensor?``), so the backward op
  then returns a zero-size ``[0]`` tensor of the weight's dtype, and the autograd formula maps it
  back to a None gradient.
- dweight and dbias come back in the parameter's own dtype, each rounded ONCE from the FP32 sums:
  when weight and bias dtypes differ, the sums are taken in FP32 and each cast to its dtype (no
  bf16-then-fp32 double rounding of dbias).
- Validation: the real implementations validate (``checks.check_problem``, the ``cu_seqlens`` values
  on the host, skipped while a CUDA graph is captured) before any launch, in eager and at run time
  of a compiled graph, so a bad input raises the same ValueError/TypeError naming the offending value
  either way. The fake (meta) implementations only derive output metadata from the inputs' own
  shapes (y like x; dweight like weight; dbias like bias) and never raise: a raise while Dynamo
  traces would surface as a ``TorchRuntimeError`` and, with dynamic shapes, name a symbol (``s27``)
  instead of the offending value. Operands the schema cannot take (a list for x, a non-str
  backend) are reported by the public wrapper, before the op is called, with the same messages.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .ops import cake_causal_conv1d_det_train_backward, cake_causal_conv1d_det_train_forward

__all__ = ["forward_op", "backward_op", "setup_context", "backward"]


@torch.library.custom_op("cakeconv::cake_causal_conv1d_det_forward", mutates_args=())
def forward_op(x: Tensor, weight: Tensor, bias: Optional[Tensor], cu_seqlens: Optional[Tensor],
               backend: str) -> Tensor:
    """y = silu(causal_conv1d(x)) per document; see ``cake_causal_conv1d_det``."""
    return cake_causal_conv1d_det_train_forward(x, weight, bias, cu_seqlens, backend=backend)


@forward_op.register_fake
def _forward_fake(x, weight, bias, cu_seqlens, backend):
    # y: x's shape and dtype, contiguous (the real op allocates it with torch.empty(x.shape)).
    return x.new_empty(x.shape)


def _grad_dtype(weight: Tensor, bias: Optional[Tensor]) -> torch.dtype:
    """dweight_dtype for the backward entry point: the weight's dtype unless the bias differs."""
    if bias is None or bias.dtype == weight.dtype:
        return weight.dtype
    return torch.float32


@torch.library.custom_op("cakeconv::cake_causal_conv1d_det_backward", mutates_args=())
def backward_op(dy: Tensor, x: Tensor, weight: Tensor, bias: Optional[Tensor], cu_seqlens: Optional[Tensor],
                backend: str) -> tuple[Tensor, Tensor, Tensor]:
    """(dx, dweight, dbias): dweight/dbias in the weight's/bias's dtype; dbias is [0] without bias."""
    dx, dw, db = cake_causal_conv1d_det_train_backward(
        dy, x, weight, bias, cu_seqlens, dweight_dtype=_grad_dtype(weight, bias), backend=backend)
    if dw.dtype != weight.dtype:
        dw = dw.to(weight.dtype)
    if db is None:
        db = weight.new_empty((0,))
    elif db.dtype != bias.dtype:
        db = db.to(bias.dtype)
    return dx, dw, db


@backward_op.register_fake
def _backward_fake(dy, x, weight, bias, cu_seqlens, backend):
    db = bias.new_empty(bias.shape) if bias is not None else weight.new_empty((0,))
    return x.new_empty(x.shape), weight.new_empty(weight.shape), db


def setup_context(ctx, inputs, output):
    """Save x, the taps, the bias and cu_seqlens (nothing of size S * C besides x)."""
    x, weight, bias, cu_seqlens, backend = inputs
    ctx.save_for_backward(x, weight, bias, cu_seqlens)
    ctx.backend = backend


def backward(ctx, dy):
    """Gradients of (x, weight, bias, cu_seqlens, backend); the pre-activation is recomputed from x."""
    x, weight, bias, cu_seqlens = ctx.saved_tensors
    dx, dw, db = backward_op(dy, x, weight, bias, cu_seqlens, ctx.backend)
    return dx, dw, (db if bias is not None else None), None, None


torch.library.register_autograd(forward_op, backward, setup_context=setup_context)
