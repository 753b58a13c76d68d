"""KCP programs (context parallel): plan, exchange, context and ops."""
from .ops import (  # noqa: F401
    CakeCausalConv1dDetFunctionKcp,
    CakeCausalConv1dDetMultiFunctionKcp,
    RecomputeHandleDetKcp,
    cake_causal_conv1d_det_backward_kcp,
    cake_causal_conv1d_det_forward_kcp,
    cake_causal_conv1d_det_multi_backward_kcp,
    cake_causal_conv1d_det_multi_forward_kcp,
)
from .ops import __all__  # noqa: F401
