"""Tier 1: every width 2 <= W <= 8, with activation "silu" and None (SPEC 1b), on the reference backend.

For W in {2, 3, 4, 5, 7, 8} x activation in {"silu", None} (W = 4 + SiLU is the seed's case):
- the float64 oracle per element: bf16 y and dx are the oracle rounded once (tests/helpers.py
  ``check_rounded_once``: bitwise where FP32 arithmetic cannot straddle a rounding boundary, never
  more than 1 ulp off), FP32 y / dx / dweight / dbias within 2e-5 of the oracle's scale;
- bitwise repeats; [B, T, C] bitwise the packed result, [1, S, C] bitwise [S, C];
- empty documents (in every packed case, also documents shorter than W - 1 rows) and S = 0;
- gradcheck in float64 of the reference's analytic backward for a few (W, activation);
- bad widths (1, 9) and activations ("relu", "swish", 1) raise ValueError naming the value before
  anything is computed, and leave nothing half-built;
- workspace sizes per W, and the workspace views of dweight [C, W] / dbias;
- ``CakeShortConv(kernel_size=W, activation=None)``.
``torch.compile(fullgraph=True)`` with W = 3 and no activation is a case of tests/test_compile.py.

Shape legend: S packed tokens, C channels, W taps, B batch rows, T row length.
"""

import pytest
import torch

from cakeconv import (
    CakeShortConv,
    cake_causal_conv1d_det,
    cake_causal_conv1d_det_train_backward,
    cake_causal_conv1d_det_train_backward_workspace_bytes,
    cake_causal_conv1d_det_train_forward,
    cake_causal_conv1d_det_train_forward_workspace_bytes,
)
from cakeconv.cake_causal_conv1d_det_train_backend import conv
from cakeconv.cake_causal_conv1d_det_train_backend.kernels.launch import backward_workspace_floats, leaf_tree
from cakeconv.cake_causal_conv1d_det_train_backend.reference import reference_backward, reference_forward
from cakeconv.oracle import causal_conv1d_oracle, causal_conv1d_oracle_backward
from tests.helpers import one_thread  # noqa: F401  (a fixture)
from tests.helpers import check_rounded_once, error_bounds, make_inputs, random_cu_seqlens, rel_err

pytestmark = pytest.mark.usefixtures("one_thread")

WIDTHS = (2, 3, 4, 5, 7, 8)
GRID = [(W, act) for W in WIDTHS for act in ("silu", None)]
GRID_IDS = [f"W{W}_{act}" for W, act in GRID]
C = 16


def _seed(W, activation):
    return 10 * W + (activation is None)


# ------------------------------------------------------------------------------ the oracle

@pytest.mark.parametrize("W,activation", GRID, ids=GRID_IDS)
def test_matches_the_oracle_per_element_and_repeats_bitwise(W, activation):
    S = 600
    seed = _seed(W, activation)
    cu = random_cu_seqlens(S, torch.Generator().manual_seed(seed))  # empty and 1-3 token documents
    x, w, b, dy = make_inputs(S, C, dtype=torch.bfloat16, seed=seed, width=W)
    err_y, err_dx = error_bounds(x, w, b, dy, cu, activation)

    y = cake_causal_conv1d_det_train_forward(x, w, b, cu, activation=activation)
    check_rounded_once(y, causal_conv1d_oracle(x, w, b, cu, activation=activation), err_y, torch.bfloat16, "y")
    dx, dw, db = cake_causal_conv1d_det_train_backward(dy, x, w, b, cu, activation=activation)
    dx_o, dw_o, db_o = causal_conv1d_oracle_backward(dy, x, w, b, cu, activation=activation)
    check_rounded_once(dx, dx_o, err_dx, torch.bfloat16, "dx")
    assert dw.shape == (C, W) and dw.dtype == torch.float32
    assert rel_err(dw, dw_o) < 2e-5 and rel_err(db, db_o) < 2e-5

    again = (cake_causal_conv1d_det_train_forward(x, w, b, cu, activation=activation),
             *cake_causal_conv1d_det_train_backward(dy, x, w, b, cu, activation=activation))
    for got, first in zip(again, (y, dx, dw, db)):
        assert torch.equal(got, first)

    x32, dy32 = x.float(), dy.float()
    y32 = cake_causal_conv1d_det_train_forward(x32, w, b, cu, activation=activation)
    assert rel_err(y32, causal_conv1d_oracle(x32, w, b, cu, activation=activation)) < 2e-5
    grads32 = cake_causal_conv1d_det_train_backward(dy32, x32, w, b, cu, activation=activation)
    for got, want in zip(grads32, causal_conv1d_oracle_backward(dy32, x32, w, b, cu, activation=activation)):
        assert rel_err(got, want) < 2e-5


class _ReferenceFunction(torch.autograd.Function):
    """The reference forward with the reference's analytic backward, for gradcheck in float64."""

    @staticmethod
    def forward(ctx, x, w, b, cu, activation):
        ctx.save_for_backward(x, w, b, cu)
        ctx.activation = activation
        return reference_forward(x, w, b, cu, activation=activation)

    @staticmethod
    def backward(ctx, dy):
        x, w, b, cu = ctx.saved_tensors
        dx, dw, db, _ = reference_backward(dy, x, w, b, cu, activation=ctx.activation)
        return dx, dw, db, None, None


@pytest.mark.parametrize("W,activation", [(4, "silu"), (3, None), (8, "silu"), (2, None)],
                         ids=["W4_silu", "W3_None", "W8_silu", "W2_None"])
def test_gradcheck_reference_float64(W, activation):
    gen = torch.Generator().manual_seed(11)
    S, C8 = 23, 8
    cu = torch.tensor([0, 1, 4, 4, 12, 23], dtype=torch.int64)
    x = torch.randn(S, C8, generator=gen, dtype=torch.float64, requires_grad=True)
    w = torch.randn(C8, W, generator=gen, dtype=torch.float64, requires_grad=True)
    b = torch.randn(C8, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(_ReferenceFunction.apply, (x, w, b, cu, activation), eps=1e-6, atol=1e-7, rtol=1e-6)


# --------------------------------------------------------------------------- layouts, S = 0

@pytest.mark.parametrize("W,activation", GRID, ids=GRID_IDS)
def test_btc_equals_packed_bitwise_and_1sc_equals_sc(W, activation):
    B, T = 3, 37
    x, w, b, dy = make_inputs(B * T, C, dtype=torch.float32, seed=1, width=W)
    cu = torch.arange(0, B * T + 1, T, dtype=torch.int32)

    def fwd(x_, cu_=None):
        return cake_causal_conv1d_det_train_forward(x_, w, b, cu_, activation=activation)

    def bwd(dy_, x_, cu_=None):
        return cake_causal_conv1d_det_train_backward(dy_, x_, w, b, cu_, activation=activation)

    y_pack = fwd(x, cu)
    y_btc = fwd(x.view(B, T, C))
    assert y_btc.shape == (B, T, C) and torch.equal(y_btc.reshape(B * T, C), y_pack)
    y_1sc = fwd(x.view(1, B * T, C), cu)
    assert y_1sc.shape == (1, B * T, C) and torch.equal(y_1sc[0], y_pack)
    g_pack = bwd(dy, x, cu)
    g_btc = bwd(dy.view(B, T, C), x.view(B, T, C))
    g_1sc = bwd(dy.view(1, B * T, C), x.view(1, B * T, C), cu)
    assert torch.equal(g_btc[0].reshape(B * T, C), g_pack[0]) and torch.equal(g_1sc[0][0], g_pack[0])
    for g in (g_btc, g_1sc):
        assert torch.equal(g[1], g_pack[1]) and torch.equal(g[2], g_pack[2])


@pytest.mark.parametrize("W,activation", GRID, ids=GRID_IDS)
def test_empty_input(W, activation):
    x = torch.zeros(0, C, dtype=torch.bfloat16)
    w = torch.randn(C, W)
    b = torch.randn(C)
    cu = torch.tensor([0, 0], dtype=torch.int32)
    assert cake_causal_conv1d_det(x, w, b, cu_seqlens=cu, activation=activation).shape == (0, C)
    dx, dw, db = cake_causal_conv1d_det_train_backward(x, x, w, b, cu, activation=activation)
    assert dx.shape == (0, C) and torch.equal(dw, torch.zeros(C, W)) and torch.equal(db, torch.zeros(C))
    wg, bg = w.clone().requires_grad_(True), b.clone().requires_grad_(True)
    cake_causal_conv1d_det(x, wg, bg, cu_seqlens=cu, activation=activation).sum().backward()
    assert torch.equal(wg.grad, torch.zeros(C, W)) and torch.equal(bg.grad, torch.zeros(C))


# -------------------------------------------------------------------------------- bad values

BAD = [
    # (id, weight width, activation, text expected in the message)
    ("W1", 1, "silu", "W = 1"),
    ("W9", 9, None, "W = 9"),
    ("relu", 3, "relu", "'relu'"),
    ("swish", 4, "swish", "'swish'"),
    ("int", 5, 1, "got 1"),
]


@pytest.mark.parametrize("W,activation,text", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
@pytest.mark.parametrize("entry", ["forward", "backward", "autograd"])
def test_bad_width_or_activation_raises_before_any_computation(monkeypatch, entry, W, activation, text):
    x, w, b, dy = make_inputs(32, C, seed=0, width=W)
    cu = torch.tensor([0, 5, 32], dtype=torch.int32)

    def launched(*args, **kwargs):
        raise AssertionError("computed before validation")

    for name in ("reference_forward", "reference_backward", "triton_forward", "triton_backward"):
        monkeypatch.setattr(conv, name, launched)
    buffer = torch.full_like(x, 7.0)
    with pytest.raises(ValueError) as info:
        if entry == "forward":
            cake_causal_conv1d_det_train_forward(x, w, b, cu, out=buffer, activation=activation)
        elif entry == "backward":
            cake_causal_conv1d_det_train_backward(dy, x, w, b, cu, dx=buffer, activation=activation)
        else:
            cake_causal_conv1d_det(x, w.requires_grad_(True), b, cu_seqlens=cu, activation=activation)
    assert text in str(info.value), str(info.value)
    assert bool((buffer == 7.0).all())
    monkeypatch.undo()
    # nothing half-built: the next valid call works
    w_ok = make_inputs(32, C, seed=0, width=3)[1]
    assert cake_causal_conv1d_det_train_forward(x, w_ok, b, cu, out=buffer, activation=None) is buffer
    assert not bool((buffer == 7.0).all())


# ------------------------------------------------------------------------------- workspaces

def test_workspace_bytes_per_width():
    S = 1000
    for W in WIDTHS:
        n = cake_causal_conv1d_det_train_backward_workspace_bytes(S, C, width=W)
        assert n == 4 * backward_workspace_floats(S, C, W) + 4 * (W + 1) * C
        sub, leaves_per_group, _ = leaf_tree(W)  # 64-row leaves up to W = 4, 128-row ones from W = 5
        n_leaves = -(-S // sub)
        assert n == 4 * (W + 1) * C * (n_leaves + -(-n_leaves // leaves_per_group) + 1)  # leaves, groups, dw/db
        assert cake_causal_conv1d_det_train_forward_workspace_bytes(S, C, width=W) == 0
    assert (cake_causal_conv1d_det_train_backward_workspace_bytes(S, C)
            == cake_causal_conv1d_det_train_backward_workspace_bytes(S, C, width=4))  # the default
    for bad in (1, 9, 2.5, True, "4"):
        for fn in (cake_causal_conv1d_det_train_backward_workspace_bytes,
                   cake_causal_conv1d_det_train_forward_workspace_bytes):
            with pytest.raises(ValueError, match=f"width={bad!r}"):
                fn(S, C, width=bad)


@pytest.mark.parametrize("W,activation", [(2, "silu"), (4, "silu"), (8, None)], ids=["W2_silu", "W4_silu", "W8_None"])
@pytest.mark.parametrize("dweight_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["float32", "uint8_at_offset"])
def test_workspace_views_land_inside_the_given_workspace(kind, dweight_dtype, W, activation):
    """dweight [C, W] and dbias are views of the caller's workspace of
    ``..._backward_workspace_bytes(S, C, width=W)`` bytes: of a float32 workspace, and of a uint8
    one that is itself a slice at a byte offset of a larger buffer; their bytes do not overlap."""
    S = 64
    x, w, b, dy = make_inputs(S, C, seed=9, width=W)
    cu = torch.tensor([0, 10, 64], dtype=torch.int32)
    nbytes = cake_causal_conv1d_det_train_backward_workspace_bytes(S, C, width=W)
    if kind == "float32":
        ws = torch.empty(nbytes // 4, dtype=torch.float32)
    else:
        ws = torch.empty(nbytes + 64, dtype=torch.uint8)[32:32 + nbytes]
    _, dw, db = cake_causal_conv1d_det_train_backward(dy, x, w, b, cu, workspace=ws, dweight_dtype=dweight_dtype,
                                                      activation=activation)
    lo, hi = ws.data_ptr(), ws.data_ptr() + nbytes
    assert dw.shape == (C, W)
    for t in (dw, db):
        assert t.dtype == dweight_dtype and t.is_contiguous()
        assert lo <= t.data_ptr() and t.data_ptr() + t.numel() * t.element_size() <= hi
    assert dw.data_ptr() + dw.numel() * dw.element_size() <= db.data_ptr()
    ref = cake_causal_conv1d_det_train_backward(dy, x, w, b, cu, dweight_dtype=dweight_dtype, activation=activation)
    assert torch.equal(dw, ref[1]) and torch.equal(db, ref[2])
    if W < 8:  # too small a workspace for the width is refused
        with pytest.raises(ValueError, match="workspace has"):
            cake_causal_conv1d_det_train_backward(dy, *make_inputs(S, C, seed=9, width=8)[:3], cu, workspace=ws)


# ---------------------------------------------------------------------------- CakeShortConv

@pytest.mark.parametrize("W", WIDTHS)
def test_short_conv_kernel_size_without_activation(W):
    torch.manual_seed(W)
    module = CakeShortConv(C, bias=True, kernel_size=W, activation=None)
    assert module.weight.shape == (C, W) and module.kernel_size == W and module.activation is None
    assert module.extra_repr() == f"channels={C}, bias=True, kernel_size={W}, activation=None, dtype=torch.float32"
    assert module.weight.abs().max().item() <= 1 / W**0.5  # nn.Conv1d's bound, fan_in = W
    assert module.to_conv1d().padding == (W - 1,)
    gen = torch.Generator().manual_seed(W)
    cu = random_cu_seqlens(29, gen)
    x = torch.randn(29, C, generator=gen).to(torch.bfloat16)
    dy = torch.randn(29, C, generator=gen).to(torch.bfloat16)
    x_mod = x.clone().requires_grad_(True)
    y_mod = module(x_mod, cu_seqlens=cu)
    y_mod.backward(dy)
    w_fn, b_fn = (p.detach().clone().requires_grad_(True) for p in (module.weight, module.bias))
    x_fn = x.clone().requires_grad_(True)
    y_fn = cake_causal_conv1d_det(x_fn, w_fn, b_fn, cu_seqlens=cu, activation=None)
    y_fn.backward(dy)
    assert torch.equal(y_mod, y_fn) and torch.equal(x_mod.grad, x_fn.grad)
    assert torch.equal(module.weight.grad, w_fn.grad) and torch.equal(module.bias.grad, b_fn.grad)
    assert not torch.equal(y_fn, cake_causal_conv1d_det(x, w_fn.detach(), b_fn.detach(), cu_seqlens=cu))  # SiLU differs


@pytest.mark.parametrize("kwargs,text", [
    (dict(kernel_size=1), "kernel_size=1"), (dict(kernel_size=9), "kernel_size=9"),
    (dict(kernel_size=2.0), "kernel_size=2.0"), (dict(kernel_size=True), "kernel_size=True"),
    (dict(activation="relu"), "'relu'"), (dict(activation="swish"), "'swish'"),
], ids=["k1", "k9", "kfloat", "kbool", "relu", "swish"])
def test_short_conv_bad_kernel_size_or_activation(kwargs, text):
    with pytest.raises(ValueError) as info:
        CakeShortConv(C, **kwargs)
    assert text in str(info.value), str(info.value)
