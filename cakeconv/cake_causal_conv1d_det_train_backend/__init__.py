"""cakeconv's programs: kernels, launchers, validation, the single-rank op and the KCP ops, for
any width W in 2..8 with a SiLU or no activation.

Layout of this package (the public modules ``cakeconv.cake_causal_conv1d_det_train`` and
``cakeconv.cake_causal_conv1d_det_train_kcp`` only re-export from here):

- ``constants.py``   the default width (4) and its halo rows (3), the widths (2..8) and
                     activations ("silu", None) computed, the interpreter switch: defined once
- ``kernels/``       Triton: ``common`` (helpers), ``forward``, ``backward``, ``halo`` (KCP row
                     gather), ``tuning`` (launch configurations, never bits), ``launch`` (host
                     launchers on a compiled-kernel cache keyed by the caller)
- ``reference.py``   pure-PyTorch FP32 backend (any device)
- ``checks.py``      input validation
- ``conv.py``        the single-rank op, one ladder: launch -> custom ops into given buffers ->
                     entry points -> ``CakeCausalConv1dDetFunction`` -> ``cake_causal_conv1d_det``
- ``kcp/``           context parallel: ``plan`` (layouts, fragments, per-rank tables; host),
                     ``exchange`` (point-to-point halo messages), ``context`` (``KcpContext``),
                     ``ops`` (programs, the autograd Functions, custom ops, recompute handle)
"""

from . import kcp  # noqa: F401  (the .kcp submodule of the API)
from .conv import (
    CakeCausalConv1dDetFunction,
    cake_causal_conv1d_det,
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
