"""Context-parallel (KCP) deterministic packed causal conv1d (+ SiLU) of width 2..8 (public module).

A packed batch is split across the ranks of a process group (``build_kcp_context``: layouts
``contiguous``, ``zigzag``, ``zigzag_per_document`` or an explicit fragment table); each rank runs
the conv on its rows, reading the W - 1 history rows of fragments that continue a document from the
fragments and ranks that hold them (a halo exchange over torch.distributed). Each rank's y and dx
are bitwise the single-rank ``cake_causal_conv1d_det`` of the whole batch on its tokens (same width
W = ``weight.shape[1]`` and ``activation``: "silu" or None); dweight and dbias are the rank's
partial sums, reduced by the training framework like every gradient.

The programs live in ``cakeconv.cake_causal_conv1d_det_train_backend.kcp``.
"""

from .cake_causal_conv1d_det_train_backend.kcp.context import KcpContext, build_kcp_context
from .cake_causal_conv1d_det_train_backend.kcp.ops import (
    RecomputeHandleDetKcp,
    cake_causal_conv1d_det_kcp,
    cake_causal_conv1d_det_multi_kcp,
)

__all__ = [
    "build_kcp_context",
    "KcpContext",
    "cake_causal_conv1d_det_kcp",
    "cake_causal_conv1d_det_multi_kcp",
    "RecomputeHandleDetKcp",
]
