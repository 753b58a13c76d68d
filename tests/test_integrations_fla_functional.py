"""cakeconv.integrations.fla.causal_conv1d (FLA's functional op) and FLA's context parallelism.

Tiers (cheapest first):

1. CPU, no flash-linear-attention needed: the training path of ``causal_conv1d`` is bitwise
   ``cake_causal_conv1d_det`` (reference backend) at the taps' width and the call's activation
   (W = 4 with SiLU; W = 3 and 7 with FLA's default ``activation=None``), within FP32/BF16
   tolerance of the float64 oracle, with ``(y, None)`` returned as FLA does; every other call
   reaches FLA's function unchanged (a recording stand-in is put where the module looks FLA's
   function up); user errors; an FLA context without a group runs one rank on its local
   ``cu_seqlens`` (as FLA does).
2. gloo, 2 ranks: with an FLA context, the function and a swapped module give y and dx bitwise
   the single-rank op's on every rank, for both of FLA's layouts, with a residual, BF16 and FP32
   taps, at W = 4 with SiLU and at W = 3 and 7 without activation (halos of W - 1 rows); the
   all-reduced parameter gradients within tolerance of the single-rank ones; a second
   call with the same FLA context makes no collective. Where fla is importable, the ranks build
   their contexts with ``fla.ops.cp.build_cp_context``, swap FLA's real ``ShortConvolution`` and
   also run ``copy_for_backward()`` contexts; without fla, they get the fields of
   tests/kcp/test_kcp_fla_context.py's stand-in builder and a ShortConvolution-shaped base
   (``CakeShortConvolutionMixin`` in front of it). (tests/kcp/test_kcp_fla_context.py runs the
   derivation itself with 2-4 ranks either way.)

Shape legend: T global tokens, S local rows, D channels, N sequences.
"""

from __future__ import annotations

import sys
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

import cakeconv.integrations.fla as cfla
from cakeconv import cake_causal_conv1d_det
from cakeconv.oracle import causal_conv1d_oracle, causal_conv1d_oracle_backward
from cakeconv.integrations.fla import (
    cake_short_convolution_class,
    causal_conv1d,
    causal_conv1d_delegation_reason,
    kcp_context_from_fla,
)

from tests.helpers import TOLERANCES, rel_err
from tests.kcp._dist import run_on_ranks
from tests.kcp.test_kcp_fla_context import (
    FlaContextStandIn,
    _AllGatherCount,
    _fla_cp_builder,
    _fla_local_tokens,
    context_fields,
    make_context,
)


class ShortConvolutionShape(nn.Conv1d):
    """ShortConvolution's constructor and attributes (FLA 0.6.0); its forward is never to be reached."""

    def __init__(self, hidden_size, kernel_size, bias=False, activation="silu", backend="triton", device=None,
                 dtype=None, **kwargs):
        super().__init__(hidden_size, hidden_size, kernel_size, padding=kernel_size - 1, groups=hidden_size, bias=bias,
                         device=device, dtype=dtype)
        self.hidden_size, self.activation, self.backend = hidden_size, activation, backend

    def forward(self, *args, **kwargs):
        raise AssertionError("a call that cakeconv should run reached the base's forward")


CakeShape = cake_short_convolution_class(ShortConvolutionShape)


def _data(shape, D, seed, dtype, wdtype=torch.float32, W=4):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, D, generator=g).to(dtype)
    dy = torch.randn(*shape, D, generator=g).to(dtype)
    residual = torch.randn(*shape, D, generator=g).to(dtype)
    w = (torch.randn(D, W, generator=g) * 0.5).to(wdtype)
    b = (torch.randn(D, generator=g) * 0.5).to(wdtype)
    return x, dy, residual, w, b


def _run(fn, x, dy, *params):
    """fn(x, *params) forward and backward: (y, dx, parameter gradients)."""
    xg = x.clone().requires_grad_(True)
    ps = [p.clone().requires_grad_(True) if p is not None else None for p in params]
    y = fn(xg, *ps)
    y.backward(dy)
    return y.detach(), xg.grad, [p.grad for p in ps if p is not None]


# --------------------------------------------------------------------------------------------------
# Tier 1: one process.
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("W, activation", [(4, "swish"), (3, None), (7, None)])
@pytest.mark.parametrize("dtype, wdtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16)])
@pytest.mark.parametrize("packed", [False, True])
def test_training_path_is_cakeconv(W, activation, dtype, wdtype, packed, monkeypatch):
    D = 24
    shape = (1, 41) if packed else (3, 13)
    cu = torch.tensor([0, 1, 4, 4, 20, 41], dtype=torch.int32) if packed else None
    x, dy, residual, w, b = _data(shape, D, 1, dtype, wdtype, W)
    cake_act = None if activation is None else "silu"
    assert causal_conv1d_delegation_reason(x, w, b, activation=activation, cu_seqlens=cu) is None
    seen = []

    def counting(x, weight, *args, **kwargs):
        seen.append((tuple(weight.shape), kwargs.get("activation", "silu")))
        return cake_causal_conv1d_det(x, weight, *args, **kwargs)

    monkeypatch.setattr(cfla, "cake_causal_conv1d_det", counting)

    def via_fla_api(xg, wg, bg):
        y, state = causal_conv1d(xg, wg, bg, activation=activation, cu_seqlens=cu, cake_backend="reference")
        assert state is None
        return y

    def plain(xg, wg, bg):
        return cake_causal_conv1d_det(xg, wg, bg, cu_seqlens=cu, activation=cake_act, backend="reference")

    got, want = _run(via_fla_api, x, dy, w, b), _run(plain, x, dy, w, b)
    assert seen == [((D, W), cake_act)], "cakeconv ran, at the taps' width and the call's activation"
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    for a, c in zip(got[2], want[2]):
        assert a.dtype == wdtype and torch.equal(a, c)
    y64 = causal_conv1d_oracle(x, w, b, cu, activation=cake_act)
    dx64, dw64, db64 = causal_conv1d_oracle_backward(dy, x, w, b, cu, activation=cake_act)
    tol = TOLERANCES[dtype]
    assert rel_err(got[0], y64) <= tol and rel_err(got[1], dx64) <= tol
    assert rel_err(got[2][0], dw64) <= 4 * tol and rel_err(got[2][1], db64) <= 4 * tol
    y_res, _ = causal_conv1d(x, w, None, residual=residual, activation=activation, cu_seqlens=cu,
                             cake_backend="reference")
    plain_y = cake_causal_conv1d_det(x, w, cu_seqlens=cu, activation=cake_act, backend="reference")
    assert torch.equal(y_res, plain_y + residual)


def test_delegated_calls_reach_flas_function_unchanged(monkeypatch):
    calls = []

    def fla_stand_in(x, **kwargs):
        calls.append(kwargs)
        return "fla-y", "fla-state"

    monkeypatch.setattr(cfla, "_fla_causal_conv1d", lambda: fla_stand_in)
    D = 16
    x, _, _, w, b = _data((2, 6), D, 2, torch.float32)
    state = torch.zeros(2, D, 4)
    odd_context = FlaContextStandIn(layout="zigzag_per_document")
    cases = [
        (dict(weight=None), "no weight"),
        (dict(weight=torch.randn(D, 9)), "kernel_size = 9"),
        (dict(weight=w[:, :1]), "kernel_size = 1"),
        (dict(activation="relu"), "activation = 'relu'"),
        (dict(initial_state=state), "initial_state"),
        (dict(output_final_state=True), "output_final_state"),
        (dict(cp_context=object()), "not FLA's FLACPContext"),
        (dict(cp_context=odd_context), "layout 'zigzag_per_document'"),
        (dict(weight=w[:12], bias=b[:12], x=x[..., :12]), "multiple of 8"),
        (dict(weight=w.half()), "weight dtype"),
        (dict(x=x.view(2, 6, 2, 8)), "x of shape (2, 6, 2, 8)"),
        (dict(x=x.to(torch.int32)), "x dtype"),
    ]
    for i, (change, why) in enumerate(cases):
        args = dict(x=x, weight=w, bias=b, activation="silu", backend="cuda", chunk_indices=None, seq_idx=i)
        args.update(change)
        reason = causal_conv1d_delegation_reason(**args)
        assert reason is not None and why in reason, (why, reason)
        assert causal_conv1d(**args, cake_backend="reference") == ("fla-y", "fla-state")
        got = calls[-1]
        expected = dict(residual=None, initial_state=None, output_final_state=False, cu_seqlens=None,
                        cu_seqlens_cpu=None, cp_context=None)
        expected.update((k, v) for k, v in args.items() if k != "x")
        assert got.keys() == expected.keys(), why
        for k, v in expected.items():
            assert (got[k] is v) if (v is None or isinstance(v, torch.Tensor)) else (got[k] == v), (why, k)
    assert len(calls) == len(cases)


def test_delegation_without_fla_asks_for_it(monkeypatch):
    for name in ("fla", "fla.modules", "fla.modules.causal_conv1d"):
        monkeypatch.setitem(sys.modules, name, None)  # `import fla...` raises ImportError
    x, _, _, w, _ = _data((1, 5), 8, 3, torch.float32)
    with pytest.raises(ImportError, match="flash-linear-attention"):
        causal_conv1d(x, w, initial_state=torch.zeros(1, 8, 4))


def test_user_errors():
    x, _, residual, w, b = _data((2, 5), 8, 4, torch.float32)
    cu = torch.tensor([0, 2, 5])
    context = FlaContextStandIn(group=None, cu_seqlens=cu, cu_seqlens_cpu=cu)
    with pytest.raises(ValueError, match="cake_backend"):
        causal_conv1d(x, w, activation="silu", cake_backend="cuda")
    packed = r"with cu_seqlens, x must be packed as \[1, S, D\]; got x of shape \(2, 5, 8\)"
    with pytest.raises(ValueError, match=packed):
        causal_conv1d(x, w, activation="silu", cu_seqlens=cu)
    with pytest.raises(ValueError, match=r"with cp_context, x must be this rank's rows as \[1, S, D\]"):
        causal_conv1d(x, w, activation="silu", cp_context=context)
    with pytest.raises(ValueError, match="residual must have x's shape"):
        causal_conv1d(x, w, activation="silu", residual=residual[:1])
    with pytest.raises(ValueError, match="cu_seqlens must"):  # cakeconv's own check
        causal_conv1d(x[:1], w, activation="silu", cu_seqlens=torch.tensor([0, 2, 4]), cake_backend="reference")


def test_context_without_group_runs_one_rank_on_its_documents():
    """FLA runs a context without a process group as one rank on its local cu_seqlens: so does cakeconv."""
    D = 16
    cu = torch.tensor([0, 3, 4, 11, 19], dtype=torch.int32)
    context = FlaContextStandIn(group=None, cu_seqlens=cu, cu_seqlens_cpu=cu)
    x, dy, _, w, b = _data((1, 19), D, 5, torch.bfloat16, torch.bfloat16)

    def via_fla_api(xg, wg, bg):
        return causal_conv1d(xg, wg, bg, activation="silu", cu_seqlens=None, cp_context=context,
                             cake_backend="reference")[0]

    def plain(xg, wg, bg):
        return cake_causal_conv1d_det(xg, wg, bg, cu_seqlens=cu, backend="reference")

    got, want = _run(via_fla_api, x, dy, w, b), _run(plain, x, dy, w, b)
    for a, c in zip([got[0], got[1], *got[2]], [want[0], want[1], *want[2]]):
        assert torch.equal(a, c)
    conv = CakeShape(D, 4, bias=True, dtype=torch.bfloat16, cake_backend="reference")
    assert conv.delegation_reason(x, cp_context=context) is None
    with torch.no_grad():
        conv.weight.copy_(w.view(D, 1, 4))
        conv.bias.copy_(b)
        assert torch.equal(conv(x, cp_context=context)[0], want[0])


# --------------------------------------------------------------------------------------------------
# Tiers 2 and 3: two gloo ranks.
# --------------------------------------------------------------------------------------------------

# (layout, global cu_seqlens, W, activation): W = 7 with 12-token shares (24 tokens, 2 ranks;
# zigzag: 6-token parts) takes halos of 6 rows, up to a whole part.
CP_CASES = [("contiguous", [0, 2, 3, 9, 16, 17, 24], 4, "silu"), ("zigzag", [0, 0, 5, 6, 7, 13, 24, 24], 3, None),
            ("contiguous", [0, 24], 7, None), ("zigzag", [0, 1, 23, 24], 7, None)]


def _check_cp_case(rank, fla_ctx, layout, cu, W, activation, seed, dtype, wdtype, module_class):
    """The function and a swapped module with ``fla_ctx`` == the single-rank op, on this rank's rows."""
    D = 16
    T = cu[-1]
    x, dy, residual, w, b = _data((T,), D, seed, dtype, wdtype, W)
    idx = _fla_local_tokens(layout, T, dist.get_world_size(), rank)
    want = _run(lambda xg, wg, bg: cake_causal_conv1d_det(xg, wg, bg, cu_seqlens=torch.tensor(cu), activation=activation,
                                                          backend="reference"),
                x, dy, w, b)
    x_1SD, dy_1SD, res_1SD = (t[idx][None] for t in (x, dy, residual))

    def via_fla_api(xg, wg, bg):
        y, state = causal_conv1d(xg, wg, bg, residual=res_1SD, activation=activation, cu_seqlens=fla_ctx.cu_seqlens,
                                 cp_context=fla_ctx, cake_backend="reference")
        assert state is None
        return y

    got = _run(via_fla_api, x_1SD, dy_1SD, w, b)
    assert torch.equal(got[0][0], want[0][idx] + residual[idx]), f"rank {rank}: y ({layout}, {cu})"
    assert torch.equal(got[1][0], want[1][idx]), f"rank {rank}: dx ({layout}, {cu})"
    for partial, full in zip(got[2], want[2]):
        assert partial.dtype == wdtype
        total = partial.float()
        dist.all_reduce(total)
        tol = 1e-5 if wdtype == torch.float32 else 2e-2  # BF16: each rank's partial sum is rounded
        assert (total - full.float()).abs().max().item() <= tol * max(1.0, full.float().abs().max().item())

    # the second call made no collective (the derived context is cached on the FLA context)
    count = _AllGatherCount()
    try:
        conv = module_class(D, W, bias=True, activation=activation, dtype=wdtype, cake_backend="reference")
        assert conv.delegation_reason(x_1SD, cp_context=fla_ctx) is None
        with torch.no_grad():
            conv.weight.copy_(w.view(D, 1, W))
            conv.bias.copy_(b)
        y_mod, state = conv(x_1SD.clone(), residual=res_1SD, cp_context=fla_ctx)
    finally:
        count.restore()
    assert count.n == 0 and state is None
    assert torch.equal(y_mod, got[0]), f"rank {rank}: module y ({layout})"


def _functional_cp_stand_in(rank, world, cases, fields_by_case):
    for i, ((layout, cu, W, activation), fields) in enumerate(zip(cases, fields_by_case)):
        fla_ctx = make_context(fields[rank], dist.group.WORLD)
        dtype, wdtype = [(torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32)][i % 2]
        _check_cp_case(rank, fla_ctx, layout, cu, W, activation, 20 + i, dtype, wdtype, CakeShape)
    return True


def _functional_cp_fla(rank, world, cases):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from fla.ops.cp import build_cp_context
    cake_class = cake_short_convolution_class()  # over FLA's ShortConvolution
    for i, (layout, cu, W, activation) in enumerate(cases):
        fla_ctx = build_cp_context(torch.tensor(cu, dtype=torch.int32), dist.group.WORLD, conv1d_kernel_size=W,
                                   layout=layout)
        assert type(fla_ctx).__name__ == "FLACPContext"
        dtype, wdtype = [(torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32)][i % 2]
        _check_cp_case(rank, fla_ctx, layout, cu, W, activation, 40 + i, dtype, wdtype, cake_class)
        # a copy made for the backward (FLA's pipeline parallelism) is a new object: derived again
        copy = fla_ctx.copy_for_backward()
        assert kcp_context_from_fla(copy) is not kcp_context_from_fla(fla_ctx)
        _check_cp_case(rank, copy, layout, cu, W, activation, 60 + i, dtype, wdtype, cake_class)
    return True


@pytest.mark.dist
def test_cp_context_bitwise_on_every_rank():
    """With fla importable the ranks build their contexts with FLA's build_cp_context and swap FLA's
    ShortConvolution; without it, they get the stand-in fields and the ShortConvolution-shaped base."""
    if _fla_cp_builder() is not None:  # asked here, not at import: the spawned ranks import this module
        assert run_on_ranks(_functional_cp_fla, 2, CP_CASES, timeout_s=240) == [True, True]
        return
    fields_by_case = [context_fields(cu, 2, layout) for layout, cu, _, _ in CP_CASES]
    assert run_on_ranks(_functional_cp_stand_in, 2, CP_CASES, fields_by_case, timeout_s=180) == [True, True]
