"""Tier 1: a bad ``dy`` with a good ``x`` is refused by the backward entry point, naming ``dy``.

``cake_causal_conv1d_det_train_backward(dy, x, ...)`` validates x, the taps, the bias and
cu_seqlens; these tests keep all of them valid and break only dy, so the only check that can fire
is dy's own (SPEC section 6: ValueError/TypeError with the offending value in the message, before
any kernel launch):

    dtype    int32, int64, bool, float64 (x is bf16 / fp32)          -> TypeError naming dy
    device   dy on the meta device (and on CUDA when x is on the CPU) -> ValueError naming dy
    shape    one row more or less, other channels, [1, S, C] for an [S, C] x, [S * C] -> ValueError
    type     a list of floats, None                                  -> TypeError naming dy

Each call is checked to fail through the check (the message names dy and the offending dtype,
device or shape), not through some later error of the computation; and the same dy with the right
dtype / device / shape works (the control). The KCP backward has no public entry point of its own
(autograd reaches it): nothing to test there.

Shape legend: S packed tokens, C channels.
"""

import pytest
import torch

from cakeconv import cake_causal_conv1d_det_train_backward
from tests.helpers import make_inputs

S, C = 37, 16


@pytest.fixture(params=[torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def good(request):
    x, w, b, dy = make_inputs(S, C, dtype=request.param, seed=5)
    cu = torch.tensor([0, 1, 20, 20, S], dtype=torch.int32)
    dx, dw, db = cake_causal_conv1d_det_train_backward(dy, x, w, b, cu, backend="reference")  # the control
    assert dx.shape == x.shape and dw.shape == (C, 4) and db.shape == (C,)
    return x, w, b, dy, cu


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool, torch.float64])
def test_dy_wrong_dtype_raises_type_error(good, dtype):
    x, w, b, dy, cu = good
    bad = dy.to(dtype)
    with pytest.raises(TypeError, match=r"dy") as info:
        cake_causal_conv1d_det_train_backward(bad, x, w, b, cu, backend="reference")
    assert str(dtype) in str(info.value), info.value


def test_dy_on_another_device_raises_value_error(good):
    x, w, b, dy, cu = good
    devices = ["meta"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        bad = dy.to(device)
        with pytest.raises(ValueError, match=r"dy") as info:
            cake_causal_conv1d_det_train_backward(bad, x, w, b, cu, backend="reference")
        assert device in str(info.value), info.value


@pytest.mark.parametrize("shape", [(S + 1, C), (S - 1, C), (S, C + 8), (S, C // 2), (1, S, C), (S * C,)],
                         ids=["more_rows", "fewer_rows", "more_channels", "fewer_channels", "1SC", "flat"])
def test_dy_wrong_shape_raises_value_error(good, shape):
    x, w, b, dy, cu = good
    n = 1
    for d in shape:
        n *= d
    bad = torch.randn(n).to(dy.dtype).view(shape)
    with pytest.raises(ValueError, match=r"dy") as info:
        cake_causal_conv1d_det_train_backward(bad, x, w, b, cu, backend="reference")
    assert str(tuple(shape)) in str(info.value), info.value


@pytest.mark.parametrize("bad", [None, "list"], ids=["none", "list"])
def test_dy_not_a_tensor_raises_type_error(good, bad):
    x, w, b, dy, cu = good
    value = dy.float().tolist() if bad == "list" else None
    with pytest.raises(TypeError, match=r"dy"):
        cake_causal_conv1d_det_train_backward(value, x, w, b, cu, backend="reference")


def test_dy_checks_come_before_the_buffers_are_touched(good):
    """A refused dy leaves a caller's dx buffer as it was (the check runs before any launch)."""
    x, w, b, dy, cu = good
    dx = torch.full_like(x, 7.0)
    with pytest.raises(ValueError, match=r"dy"):
        cake_causal_conv1d_det_train_backward(dy[:-1], x, w, b, cu, dx=dx, backend="reference")
    assert bool((dx == 7.0).all())
