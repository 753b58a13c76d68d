"""cakeconv's programs: kernels, launchers, validation and the autograd Functions.

Layout of this package (the public modules ``cakeconv.cake_causal_conv1d_det_train`` and
``cakeconv.cake_causal_conv1d_det_train_kcp`` only re-export from here):

- ``reference.py``       pure-PyTorch FP32 backend (any device)
- ``triton_common.py``   Triton helpers (segment search, loads, the FMA sequence, pairwise sums)
- ``triton_forward.py``  forward kernel
- ``triton_backward.py`` backward kernel, group-sum and finalize kernels (fixed-order dweight)
- ``triton_launch.py``   host launchers
- ``tuning.py``          launch configurations (never change bits)
- ``checks.py``          input validation
- ``ops.py``             forward/backward entry points with caller-provided buffers
- ``custom_ops.py``      the torch.library custom ops (fake impls, autograd) for torch.compile
- ``function.py``        ``CakeCausalConv1dDetFunction`` and ``cake_causal_conv1d_det``
- ``kcp_plan.py``        KCP layouts, fragment tables and per-rank halo plans (host)
- ``kcp_exchange.py``    the halo exchange (point-to-point, gloo and NCCL)
- ``kcp_context.py``     ``KcpContext`` / ``build_kcp_context``
- ``kcp.py``             KCP programs, Functions and the recompute handle
- ``kcp_custom_ops.py``  the KCP ops as torch.library custom ops (torch.compile)
"""

from . import kcp  # noqa: F401  (the .kcp submodule of SPEC section 3)
from .function import CakeCausalConv1dDetFunction, cake_causal_conv1d_det
from .ops import (
    cake_causal_conv1d_det_train_backward,
    cake_causal_conv1d_det_train_backward_workspace_bytes,
    cake_causal_conv1d_det_train_forward,
    cake_causal_conv1d_det_train_forward_workspace_bytes,
    is_cake_causal_conv1d_det_train_supported,
)

__all__ = [
    "CakeCausalConv1dDetFunction",
    "cake_causal_conv1d_det",
    "cake_causal_conv1d_det_train_forward",
    "cake_causal_conv1d_det_train_backward",
    "cake_causal_conv1d_det_train_forward_workspace_bytes",
    "cake_causal_conv1d_det_train_backward_workspace_bytes",
    "is_cake_causal_conv1d_det_train_supported",
]
