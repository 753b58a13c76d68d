"""Context-parallel (KCP) deterministic packed causal conv1d + SiLU (public module).

A packed batch is split across the ranks of a process group (``build_kcp_context``: layouts
``contiguous``, ``zigzag``, ``zigzag_per_document`` or an explicit fragment table); each rank runs
the conv on its rows, reading the history rows of fragments that continue a document from the
ranks that hold them (a halo exchange over torch.distributed). Each rank's y and dx are bitwise
the single-rank ``cake_causal_conv1d_det`` of the whole batch on its tokens.

Both ops call the torch custom op ``torch.ops.cakeconv.cake_causal_conv1d_det_kcp_forward``
(registered autograd: ``..._kcp_backward``), in eager and under ``torch.compile(fullgraph=True)``,
which traces them without a graph break; the context and the recompute handle reach the op as
their process-local ``op_id`` ints (cake_causal_conv1d_det_train_backend/kcp_custom_ops.py).
"""

from __future__ import annotations

from .cake_causal_conv1d_det_train_backend.kcp import custom_ops as kcp_custom_ops
from .cake_causal_conv1d_det_train_backend.kcp.ops import (
    KEY_MULTI,
    KEY_SINGLE,
    CakeCausalConv1dDetFunctionKcp,  # noqa: F401  (the Functions behind the ops, SPEC 3)
    CakeCausalConv1dDetMultiFunctionKcp,  # noqa: F401
    RecomputeHandleDetKcp,
)
from .cake_causal_conv1d_det_train_backend.kcp.context import KcpContext, build_kcp_context

__all__ = [
    "build_kcp_context",
    "KcpContext",
    "cake_causal_conv1d_det_kcp",
    "cake_causal_conv1d_det_multi_kcp",
    "RecomputeHandleDetKcp",
]


def cake_causal_conv1d_det_kcp(x_local, weight, ctx, *, bias=None, recompute_handle=None, backend="auto"):
    """Autograd-enabled KCP causal conv1d + SiLU of this rank's fragments.

    For token t of document d (global ``cu_seqlens`` of the context), in FP32:
    ``y[t] = silu(bias + sum_{k=0..3} weight[:, k] * x[t - 3 + k])``, rows before the document's
    start read as zero. Rows of the document that another rank (or another fragment of this rank)
    holds come through the halo exchange, so the result is bitwise the single-rank op of the whole
    batch restricted to this rank's rows.

    Args:
        x_local: [S_local, C] or [1, S_local, C] (bf16, fp16 or fp32), this rank's rows in the
            context's local order (``ctx.shard(x_global)``); C a multiple of 8.
        weight: FP32 [C, 4] taps (other dtypes raise TypeError).
        ctx: the ``KcpContext`` of this batch (``build_kcp_context``).
        bias: optional FP32 [C].
        recompute_handle: optional ``RecomputeHandleDetKcp``; under torch.utils.checkpoint the
            recompute then reuses the forward's history rows instead of exchanging again. All ranks
            pass a handle for the same call or none.
        backend: "auto", "triton" or "reference".

    Returns:
        y of x_local's shape and dtype. Backward: dx of this rank's rows (bitwise the single-rank
        dx), and dweight/dbias as this rank's PARTIAL sums (FP32): the training framework reduces
        them over the data- and context-parallel group as it does for every parameter.

    Eager and ``torch.compile(fullgraph=True)`` run the same custom op (no graph break, bitwise the
    same y and gradients), also with a recompute handle under ``torch.utils.checkpoint`` inside or
    around the compiled code: the handle rules are applied when the op runs. Keep ``ctx`` alive
    until the backward has run (a compiled graph refers to it by its ``op_id`` only). The exchange
    is a collective: every rank must make the same KCP calls in the same order, so compile the same
    model code on every rank.
    """
    return kcp_custom_ops.kcp_forward([x_local], [weight], [bias], ctx, recompute_handle,
                                      KEY_SINGLE, backend)[0]


def cake_causal_conv1d_det_multi_kcp(xs, weights, ctx, *, biases=None, recompute_handle=None, backend="auto"):
    """Several tensors of one layer (e.g. q, k, v, each with its own C and taps) in one call.

    One halo exchange in the forward and one in the backward serve all tensors (their boundary
    rows travel concatenated along channels). Every output and gradient is bitwise the one of
    ``cake_causal_conv1d_det_kcp`` on that tensor alone. Arguments as there, as lists (one dtype for
    all xs); ``biases`` is None or a list with None entries allowed.

    Returns:
        tuple of outputs, one per tensor.
    """
    xs = list(xs)
    weights = list(weights)
    biases = list(biases) if biases is not None else [None] * len(xs)
    if len(weights) != len(xs) or len(biases) != len(xs):
        raise ValueError(f"got {len(xs)} tensors, {len(weights)} weights and {len(biases)} biases; give one of each per tensor")
    return tuple(kcp_custom_ops.kcp_forward(xs, weights, biases, ctx, recompute_handle,
                                            KEY_MULTI, backend))
