"""Single-rank deterministic packed depthwise causal conv1d of W taps (2 <= W <= 8) + SiLU or no
activation (public module).

See ``cake_causal_conv1d_det`` for the math and shapes; the programs live in
``cakeconv.cake_causal_conv1d_det_train_backend``.
"""

from .cake_causal_conv1d_det_train_backend import (
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
