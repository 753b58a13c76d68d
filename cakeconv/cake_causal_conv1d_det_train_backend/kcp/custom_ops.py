"""The KCP ops as torch custom ops (``torch.library``, namespace ``cakeconv``).

Shape legend: n tensors of one layer, S local rows, C_i channels of tensor i, D local segments,
H = 3 halo rows.

Two ops, thin wrappers of the KCP programs in kcp.py (so their bits are those programs'):

- ``torch.ops.cakeconv.cake_causal_conv1d_det_kcp_forward(xs, weights, biases, has_bias,
  context_id, num_segments, handle_id, key, backend) -> ys + hists``: the forward halo exchange
  and kernels; returns the n outputs ``ys[i]`` (xs[i]'s shape and dtype) followed by the n
  received history rows ``hists[i]`` [D, H, C_i] (xs' dtype), which the backward needs (SPEC 5:
  the backward saves these rows and never repeats the forward exchange).
- ``torch.ops.cakeconv.cake_causal_conv1d_det_kcp_backward(dys, xs, weights, biases, has_bias,
  hists, context_id, backend) -> dxs + dweights + dbiases``: the future (g) exchange and kernels;
  dweight and dbias are this rank's FP32 partial sums.

The forward op carries registered autograd (``setup_context`` / ``backward`` below; the backward
calls the backward op; the hists outputs are marked non-differentiable), so ``torch.compile`` sees
one opaque, differentiable op: no graph break, and the compiled y and gradients are bitwise the
eager ones. Eager calls take the same path: the public ``cake_causal_conv1d_det_kcp`` /
``cake_causal_conv1d_det_multi_kcp`` call the forward op directly, and the autograd Functions of
kcp.py call the same ops through the same ``save_state`` / ``gradients`` helpers (they compile too).
No eager-only fallback is needed: the recompute-handle logic works the same through the op.

How the context and the handle reach the op: a custom op takes tensors, ints, strs (...), not a
``KcpContext`` or a ``RecomputeHandleDetKcp``. Each of them gets a process-local int ``op_id`` at
construction (``kcp_context.ObjectRegistry``: a per-process counter, a weak map id -> object); the
op takes the ints and its real implementation looks the objects up. ``handle_id`` is -1 for no
handle. ``num_segments`` is the context's D, passed so the fake implementation can shape the hists
outputs without the registry (under torch.compile the ids and D may be dynamic ints); the real
implementation checks it against the context.

The recompute-handle rules (kcp.py ``forward_with_handle``) run in the real implementation, when
the op runs, eager or compiled: "inside a backward" is the autograd engine's current graph task on
the calling thread, the same whether the op is called eagerly, from a compiled forward, or from a
compiled backward. So a handle works with ``torch.utils.checkpoint`` around compiled code (the
recompute re-runs the compiled forward inside the backward) and with a non-reentrant checkpoint
inside compiled code (AOTAutograd's partitioner recomputes the checkpointed op in the compiled
backward: without a handle it exchanges again, with one it reads the stored rows).

Choices:

- A missing bias: a custom op cannot take a list of optional tensors with a gradient per entry, so
  a missing bias is passed as a zero-size ``[0]`` FP32 placeholder with ``has_bias[i] = False``
  (the flag, not the shape, says which: a zero-size bias from the caller is still rejected, at
  run time, like any bad shape), and the backward op returns a ``[0]`` dbias for it, which the
  autograd formula maps back to a None gradient.
- Validation happens in the real implementations (kcp.py ``_check_kcp``, before any exchange), in
  eager and at run time of a compiled graph, so a bad input raises the same ValueError/TypeError
  either way. The fake implementations only derive output metadata from the inputs' own shapes
  and ``num_segments``, and never raise. Operands the schema cannot take (a non-tensor, a
  non-KcpContext ctx, a non-handle, a non-str backend, mismatched list lengths) are reported by
  ``op_arguments`` before the op is called, with the eager messages (while Dynamo traces, such a
  raise surfaces as Dynamo's ``Unsupported`` error quoting that message).
- The context must stay alive until the backward has run (the user's code holds it for the step
  anyway). In eager the autograd node holds it; in a compiled graph only the int travels, and a
  context dropped before the backward raises a RuntimeError naming the id.
- Under torch.compile every new context or handle is a new int: Dynamo recompiles once for the
  second value, then treats it as a dynamic int (automatic dynamic shapes), like D and S_local.
"""

from __future__ import annotations

from typing import List

import torch
from torch import Tensor

# kcp imports this module too (a cycle): only kcp's attributes at call time are used here.
from . import ops as _kcp
from .context import CONTEXTS, KcpContext

__all__ = [
    "NO_HANDLE",
    "backward",
    "backward_op",
    "forward_op",
    "gradients",
    "kcp_forward",
    "op_arguments",
    "save_state",
    "setup_context",
]

H = 3
NO_HANDLE = -1


def _optional_biases(biases, has_bias):
    return [b if hb else None for b, hb in zip(biases, has_bias)]


@torch.library.custom_op("cakeconv::cake_causal_conv1d_det_kcp_forward", mutates_args=())
def forward_op(xs: List[Tensor], weights: List[Tensor], biases: List[Tensor], has_bias: List[bool],
               context_id: int, num_segments: int, handle_id: int, key: str, backend: str) -> List[Tensor]:
    """ys + hists: the KCP forward of n tensors with ONE halo exchange (see the module docstring)."""
    kctx = CONTEXTS.lookup(context_id)
    if num_segments != kctx.num_segments:
        raise ValueError(f"num_segments = {num_segments} but the KcpContext (op_id {context_id}) has "
                         f"D = {kctx.num_segments} local segments")
    handle = None if handle_id == NO_HANDLE else _kcp.HANDLES.lookup(handle_id)
    ys, hists = _kcp.forward_with_handle(list(xs), list(weights), _optional_biases(biases, has_bias),
                                         kctx, backend, handle, key)
    return [*ys, *hists]


@forward_op.register_fake
def _forward_fake(xs, weights, biases, has_bias, context_id, num_segments, handle_id, key, backend):
    # ys: xs' shapes and dtype, contiguous; hists: [D, H, C_i] contiguous, xs' dtype.
    return ([x.new_empty(x.shape) for x in xs]
            + [x.new_empty((num_segments, H, x.shape[-1])) for x in xs])


@torch.library.custom_op("cakeconv::cake_causal_conv1d_det_kcp_backward", mutates_args=())
def backward_op(dys: List[Tensor], xs: List[Tensor], weights: List[Tensor], biases: List[Tensor],
                has_bias: List[bool], hists: List[Tensor], context_id: int, backend: str) -> List[Tensor]:
    """dxs + dweights + dbiases (FP32 partial sums; a [0] dbias where the bias is missing)."""
    kctx = CONTEXTS.lookup(context_id)
    dxs, dws, dbs = _kcp.cake_causal_conv1d_det_multi_backward_kcp(
        list(dys), list(xs), list(weights), kctx, _optional_biases(biases, has_bias), hists=list(hists),
        backend=backend)
    dbs = [w.new_empty((0,), dtype=torch.float32) if db is None else db for db, w in zip(dbs, weights)]
    return [*dxs, *dws, *dbs]


@backward_op.register_fake
def _backward_fake(dys, xs, weights, biases, has_bias, hists, context_id, backend):
    return ([x.new_empty(x.shape) for x in xs]
            + [w.new_empty(w.shape, dtype=torch.float32) for w in weights]
            + [b.new_empty(b.shape, dtype=torch.float32) for b in biases])


# ------------------------------------------------------------------------------ calling the op

def op_arguments(xs, weights, biases, kctx, handle, key, backend) -> tuple:
    """The forward op's arguments for a KCP call; raises on operands its schema cannot take.

    biases: a list with None entries allowed (one per tensor). The messages are kcp.py's
    ``_check_kcp`` ones where it can name the operand.
    """
    if not isinstance(kctx, KcpContext):
        raise TypeError(f"ctx must be a KcpContext (from build_kcp_context), got {type(kctx).__name__}")
    if handle is not None and not isinstance(handle, _kcp.RecomputeHandleDetKcp):
        raise TypeError(f"recompute_handle must be a RecomputeHandleDetKcp or None, "
                        f"got {type(handle).__name__}")
    ok = (len(xs) > 0 and len(weights) == len(xs) and len(biases) == len(xs)
          and all(isinstance(t, Tensor) for t in (*xs, *weights))
          and all(b is None or isinstance(b, Tensor) for b in biases)
          and isinstance(backend, str))
    if not ok:
        # Not something the op's schema takes: raise the validation error that names it (eager;
        # under torch.compile Dynamo reports it as an Unsupported error quoting that message).
        _kcp._check_kcp(list(xs), list(weights), list(biases), kctx, backend)
        names = lambda ts: [type(t).__name__ for t in ts]  # noqa: E731
        raise TypeError(f"KCP conv got operands it cannot take: xs {names(xs)}, weights {names(weights)}, "
                        f"biases {names(biases)}, backend {type(backend).__name__}")
    placed = [w.new_empty((0,), dtype=torch.float32) if b is None else b for b, w in zip(biases, weights)]
    has_bias = [b is not None for b in biases]
    handle_id = NO_HANDLE if handle is None else handle.op_id
    return (list(xs), list(weights), placed, has_bias, kctx.op_id, kctx.num_segments, handle_id, key, backend)


def kcp_forward(xs, weights, biases, kctx, handle, key, backend) -> list:
    """ys of a KCP call through the forward op (autograd through its registered formula)."""
    out = forward_op(*op_arguments(xs, weights, biases, kctx, handle, key, backend))
    return out[:len(xs)]


# ------------------------------------------------------------------------------------ autograd

def save_state(ctx, op_args, hists, kctx=None) -> None:
    """Save what the backward needs: xs, taps, biases (placeholders included) and the hists.

    The autograd node also holds the KcpContext (``kctx``, or in eager the registry's object), so
    that it lives until the backward; a compiled graph holds only its id (the registry lookup is
    not traceable, and the id may be symbolic there).
    """
    xs, weights, biases, has_bias, context_id, _num_segments, _handle_id, _key, backend = op_args
    ctx.n = len(xs)
    ctx.context_id = context_id
    ctx.backend = backend
    ctx.has_bias = list(has_bias)
    if kctx is None and not torch.compiler.is_compiling() and isinstance(context_id, int):
        kctx = CONTEXTS.get(context_id)
    ctx.kcp_context = kctx
    ctx.save_for_backward(*xs, *weights, *biases, *hists)


def gradients(ctx, dys):
    """(dxs, dweights, dbiases) through the backward op; dbias None where the bias is missing."""
    n = ctx.n
    saved = ctx.saved_tensors
    xs, weights, biases, hists = saved[:n], saved[n:2 * n], saved[2 * n:3 * n], saved[3 * n:4 * n]
    dys = [torch.zeros_like(x) if dy is None else dy for dy, x in zip(dys, xs)]
    out = backward_op(dys, list(xs), list(weights), list(biases), ctx.has_bias, list(hists), ctx.context_id,
                      ctx.backend)
    dbs = [db if hb else None for db, hb in zip(out[2 * n:3 * n], ctx.has_bias)]
    return list(out[:n]), list(out[n:2 * n]), dbs


def setup_context(ctx, inputs, output):
    """The forward op's autograd state; the hists outputs carry no gradient."""
    n = len(inputs[0])
    hists = output[n:]
    ctx.mark_non_differentiable(*hists)
    save_state(ctx, inputs, hists)


def backward(ctx, grads):
    """Gradients of (xs, weights, biases, has_bias, context_id, num_segments, handle_id, key, backend)."""
    dxs, dws, dbs = gradients(ctx, grads[:ctx.n])
    return dxs, dws, dbs, None, None, None, None, None, None


torch.library.register_autograd(forward_op, backward, setup_context=setup_context)
