"""Context parallel (KCP): the batch's fragments on the ranks of a process group.

- ``plan.py``      layouts, fragment tables and each rank's tables (host, once per batch and conv width)
- ``exchange.py``  the point-to-point halo messages
- ``context.py``   ``KcpContext`` / ``build_kcp_context`` (the plan on the device, the group)
- ``ops.py``       the programs, the autograd Functions, the custom ops, the recompute handle
"""

from .ops import (  # noqa: F401
    CakeCausalConv1dDetFunctionKcp,
    CakeCausalConv1dDetMultiFunctionKcp,
    RecomputeHandleDetKcp,
    cake_causal_conv1d_det_backward_kcp,
    cake_causal_conv1d_det_forward_kcp,
    cake_causal_conv1d_det_multi_backward_kcp,
    cake_causal_conv1d_det_multi_forward_kcp,
)

from .ops import __all__  # noqa: F401  (the names above, listed once in ops.py)
