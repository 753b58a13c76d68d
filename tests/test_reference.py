"""Tier 1: the pure-PyTorch reference backend against the float64 oracle, on the CPU (W = 4 + SiLU;
tests/test_widths.py covers the other widths and no activation, and the float64 gradcheck)."""

import pytest
import torch

from cakeconv import cake_causal_conv1d_det, cake_causal_conv1d_det_train_backward, cake_causal_conv1d_det_train_forward
from cakeconv.cake_causal_conv1d_det_train_backend.reference import tree_sum_rows
from cakeconv.oracle import causal_conv1d_silu_oracle, causal_conv1d_silu_oracle_backward

from tests.helpers import TOLERANCES, make_inputs, one_thread, random_cu_seqlens, rel_err  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")

# Grid rationale: S = 1..3 are documents shorter than the taps; 97 and 1000 are odd lengths with
# many random documents (empty and 1-3 token ones included); C = 8 is the smallest legal C,
# C = 40 is not a power of two.
CASES = [(1, 8), (3, 16), (97, 40), (1000, 24)]


@pytest.mark.parametrize("S,C", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bias", [True, False])
def test_reference_matches_oracle(S, C, dtype, bias):
    gen = torch.Generator().manual_seed(S * 7 + C)
    cu = random_cu_seqlens(S, gen)
    x, w, b, dy = make_inputs(S, C, dtype=dtype, bias=bias, seed=S + C)
    y = cake_causal_conv1d_det_train_forward(x, w, b, cu, backend="reference")
    assert y.dtype == dtype and y.shape == x.shape
    assert rel_err(y, causal_conv1d_silu_oracle(x, w, b, cu)) < TOLERANCES[dtype]
    dx, dw, db = cake_causal_conv1d_det_train_backward(dy, x, w, b, cu, backend="reference")
    dxo, dwo, dbo = causal_conv1d_silu_oracle_backward(dy, x, w, b, cu)
    assert rel_err(dx, dxo) < TOLERANCES[dtype]
    assert rel_err(dw, dwo) < 2e-5  # FP32 sums of S products
    assert dw.dtype == torch.float32
    if bias:
        assert rel_err(db, dbo) < 2e-5
    else:
        assert db is None


def test_reference_bf16_taps_and_dweight_dtype():
    S, C = 200, 16
    cu = torch.tensor([0, 50, 51, 200], dtype=torch.int32)
    x, w, b, dy = make_inputs(S, C, wdtype=torch.bfloat16, seed=3)
    dx, dw, db = cake_causal_conv1d_det_train_backward(dy, x, w, b, cu, dweight_dtype=torch.bfloat16, backend="reference")
    assert dw.dtype == torch.bfloat16 and db.dtype == torch.bfloat16
    _, dwo, dbo = causal_conv1d_silu_oracle_backward(dy, x, w, b, cu)
    assert rel_err(dw, dwo) < 8e-3 and rel_err(db, dbo) < 8e-3


def test_autograd_op_reference_matches_oracle():
    S, C = 300, 16
    cu = torch.tensor([0, 2, 3, 150, 300], dtype=torch.int32)
    x, w, b, dy = make_inputs(S, C, dtype=torch.float32, seed=5)
    xg, wg, bg = (t.clone().requires_grad_(True) for t in (x, w, b))
    y = cake_causal_conv1d_det(xg, wg, bg, cu_seqlens=cu)
    y.backward(dy)
    dxo, dwo, dbo = causal_conv1d_silu_oracle_backward(dy, x, w, b, cu)
    assert rel_err(xg.grad, dxo) < 2e-5 and rel_err(wg.grad, dwo) < 2e-5 and rel_err(bg.grad, dbo) < 2e-5
    assert wg.grad.dtype == torch.float32


def test_tree_sum_fixed_order():
    v = torch.randn(37, 5, dtype=torch.float32)
    pad = torch.cat([v, torch.zeros(27, 5)], 0)
    expect = pad
    while expect.shape[0] > 1:
        expect = expect[: expect.shape[0] // 2] + expect[expect.shape[0] // 2:]
    assert torch.equal(tree_sum_rows(v), expect[0])
    assert torch.allclose(tree_sum_rows(v), v.double().sum(0).float(), atol=1e-5)
