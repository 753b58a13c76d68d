"""cakeconv: deterministic packed depthwise causal conv1d + SiLU for training.

Width W = weight.shape[1] from 2 to 8 (4 in the seed models), activation "silu" (default) or None.

Public modules:

- ``cakeconv.cake_causal_conv1d_det_train``      single rank (GPU via Triton, CPU via PyTorch)
- ``cakeconv.cake_causal_conv1d_det_train_kcp``  context parallel (halo exchange across ranks)
- ``cakeconv.short_conv``                        ``CakeShortConv``, the nn.Module (single rank or KCP)
- ``cakeconv.oracle``                            float64 oracle (tests, demo, benchmarks)
- ``cakeconv.warmup``                            compile a run's kernels ahead (``python -m cakeconv warmup``)
- ``cakeconv.integrations``                      drop-ins for flash-linear-attention, Dao's API, mamba_ssm, transformers

Every public name of those modules is re-exported here.
"""

from .cake_causal_conv1d_det_train import (
    CakeCausalConv1dDetFunction,
    cake_causal_conv1d_det,
    cake_causal_conv1d_det_train_backward,
    cake_causal_conv1d_det_train_backward_workspace_bytes,
    cake_causal_conv1d_det_train_forward,
    cake_causal_conv1d_det_train_forward_workspace_bytes,
    is_cake_causal_conv1d_det_train_supported,
)

from .cake_causal_conv1d_det_train_kcp import (
    KcpContext,
    RecomputeHandleDetKcp,
    build_kcp_context,
    cake_causal_conv1d_det_kcp,
    cake_causal_conv1d_det_multi_kcp,
)

from .short_conv import CakeShortConv

__version__ = "0.1.0"

__all__ = [
    "CakeCausalConv1dDetFunction",
    "cake_causal_conv1d_det",
    "cake_causal_conv1d_det_train_forward",
    "cake_causal_conv1d_det_train_backward",
    "cake_causal_conv1d_det_train_forward_workspace_bytes",
    "cake_causal_conv1d_det_train_backward_workspace_bytes",
    "is_cake_causal_conv1d_det_train_supported",
    "build_kcp_context",
    "KcpContext",
    "cake_causal_conv1d_det_kcp",
    "cake_causal_conv1d_det_multi_kcp",
    "RecomputeHandleDetKcp",
    "CakeShortConv",
]
