"""Tier 4 (GPU, 2+ GPUs visible): operands on a GPU that is not the current device.

Triton launches on the current device; the op makes the operands' GPU current for its launches
(conv.py, ``_on_device``), on the plan's fast path and the general path alike. Run without xdist's
one-GPU-per-worker split, e.g. ``python -m pytest -m gpu tests/test_gpu_devices.py`` on the 2-GPU
machine.
"""

import pytest
import torch

from cakeconv import cake_causal_conv1d_det, cake_causal_conv1d_det_train_backward, cake_causal_conv1d_det_train_forward

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 visible GPUs")]


def _step(x, w, b, cu, dy):
    xr, wr, br = (t.detach().clone().requires_grad_(True) for t in (x, w, b))
    y = cake_causal_conv1d_det(xr, wr, br, cu_seqlens=cu)
    y.backward(dy)
    return y, xr.grad, wr.grad, br.grad


@pytest.mark.parametrize("contiguous_dy", [True, False])
def test_operands_on_a_gpu_that_is_not_current(contiguous_dy):
    """Operands on cuda:1 while cuda:0 is current: the bits of the same call made with cuda:1
    current, results on cuda:1, and the current device left as it was; twice (plan built, reused)."""
    S, C = 5000, 256
    dev = torch.device("cuda", 1)
    g = torch.Generator(device=dev).manual_seed(3)
    x = torch.randn(S, C, device=dev, generator=g).bfloat16()
    dy = torch.randn(S, C, device=dev, generator=g).bfloat16()
    if not contiguous_dy:
        dy = dy.t().contiguous().t()  # the general path: the op copies dy first
    w = torch.randn(C, 4, device=dev, generator=g)
    b = torch.randn(C, device=dev, generator=g)
    cu = torch.tensor([0, 3, 2000, 2001, S], dtype=torch.int32, device=dev)
    with torch.cuda.device(dev):
        want = _step(x, w, b, cu, dy)
        y_e = cake_causal_conv1d_det_train_forward(x, w, b, cu)
        g_e = cake_causal_conv1d_det_train_backward(dy, x, w, b, cu)
    torch.cuda.set_device(0)
    for _ in range(2):
        got = _step(x, w, b, cu, dy)
        assert torch.cuda.current_device() == 0
        for a, c in zip(got, want):
            assert a.device == dev and torch.equal(a, c)
        assert torch.equal(cake_causal_conv1d_det_train_forward(x, w, b, cu), y_e)
        for a, c in zip(cake_causal_conv1d_det_train_backward(dy, x, w, b, cu), g_e):
            assert a.device == dev and torch.equal(a, c)
    torch.cuda.synchronize(dev)
