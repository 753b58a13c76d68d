"""KCP at every conv width W = 2..8, with and without SiLU (SPEC 1b), over gloo (tier 3).

The halo of a width W is the H = W - 1 rows before (forward: x) and after (backward: FP32 g) each
local segment, over as many fragments and ranks as it takes, never across a document boundary.
Each rank checks ITS OWN rows (rank 0 has no halo, so a rank-0-only check would prove nothing):

    y_kcp == y_single[local tokens]  and  dx_kcp == dx_single[local tokens]   (bitwise)
    all_reduce(dweight_kcp) ~ dweight_single, all_reduce(dbias_kcp) ~ dbias_single (FP32 order)

for W in {2, 3, 5, 8} and activation None or "silu", on every layout and on explicit tables of
1-token fragments at W = 8 (halos over up to 7 ranks); the multi form at W = 3 without activation
(bitwise the single-tensor calls and the single-rank op); the recompute handle at W = 8 under both
checkpoint modes (tests/kcp/test_kcp_recompute.py's table); the errors (different widths in one
multi call, W = 9, activation "relu") raised on every rank before any exchange. The cases are
spread over 2, 3, 4 and 8 ranks, one spawn per world size. Under TRITON_INTERPRET=1 (marked
interpret): 2 ranks on the Triton backend, W = 8 over 1-token fragments. In this process: the
context's per-width tables (built on the first call of a width, kept), ``load_layout_`` of a
context holding two widths, the entry points and the custom ops at another width, on a 1-rank
context whose fragments make local multi-hop halos.

Shape legend: T global tokens, S local rows, C channels, W conv width, D local segments, P ranks.
"""

from __future__ import annotations

import os
import random

import pytest
import torch
import torch.distributed as dist

import cakeconv.cake_causal_conv1d_det_train_backend.kcp.ops as kcp_ops
from cakeconv import (
    build_kcp_context,
    cake_causal_conv1d_det,
    cake_causal_conv1d_det_kcp,
    cake_causal_conv1d_det_multi_kcp,
)
from cakeconv.cake_causal_conv1d_det_train_backend.kcp import (
    cake_causal_conv1d_det_backward_kcp,
    cake_causal_conv1d_det_forward_kcp,
    cake_causal_conv1d_det_multi_backward_kcp,
    cake_causal_conv1d_det_multi_forward_kcp,
)

from tests.helpers import deal_fragments

from ._dist import run_on_ranks
from .test_kcp_recompute import _case as recompute_case
from .test_kcp_recompute import _install_counters, _take


def _global_inputs(T, C, W, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, C, generator=g).to(torch.bfloat16)
    dy = torch.randn(T, C, generator=g).to(torch.bfloat16)
    w = torch.randn(C, W, generator=g) * 0.5
    b = torch.randn(C, generator=g) * 0.5
    return x, dy, w, b


def _single(x, dy, w, b, cu, activation, backend):
    leaves = [t.clone().requires_grad_(True) for t in (x, w, b)]
    y = cake_causal_conv1d_det(leaves[0], leaves[1], leaves[2], cu_seqlens=cu, activation=activation, backend=backend)
    y.backward(dy)
    return [y.detach()] + [t.grad for t in leaves]


def _check(where, ctx, cu, W, activation, backend, seed, C=8, reduce=True):
    """The KCP call on ctx against the single-rank op of the whole batch; returns D."""
    x, dy, w, b = _global_inputs(ctx.total_tokens, C, W, seed)
    y_s, dx_s, dw_s, db_s = _single(x, dy, w, b, cu, activation, backend)
    xl, wl, bl = ctx.shard(x).requires_grad_(True), w.clone().requires_grad_(True), b.clone().requires_grad_(True)
    y = cake_causal_conv1d_det_kcp(xl, wl, ctx, bias=bl, activation=activation, backend=backend)
    y.backward(ctx.shard(dy))
    idx = ctx.local_token_indices
    assert torch.equal(y, y_s[idx]), f"{where}: y differs"
    assert torch.equal(xl.grad, dx_s[idx]), f"{where}: dx differs"
    assert wl.grad.shape == (C, W) and wl.grad.dtype == torch.float32
    dw, db = wl.grad.clone(), bl.grad.clone()
    if reduce:
        dist.all_reduce(dw)
        dist.all_reduce(db)
    for name, got, want in (("dweight", dw, dw_s), ("dbias", db, db_s)):
        err = (got - want).abs().max().item()
        assert err <= 1e-5 * max(1.0, want.abs().max().item()), f"{where}: {name} off by {err}"
    assert W in ctx.widths, f"{where}: widths {ctx.widths}"
    return ctx.num_segments


def _layout_cu(rng, P, layout, unit):
    """Global cu_seqlens valid for the layout: short documents (1-3 tokens) among long ones."""
    if layout == "zigzag_per_document":
        lens = [2 * P * rng.choice([1, 1, 2, 3]) for _ in range(rng.randint(2, 4))] + [0]
        rng.shuffle(lens)
    else:
        T = unit * 2 * P
        lens = []
        while sum(lens) < T:
            lens.append(min(T - sum(lens), rng.choice([0, 1, 2, 3, 9, 17, 40])))
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    return cu


def _run_cases(rank, world, cases, backend="reference"):
    """cases: (layout or "fragments", W, activation, seed); fragments: 1-token spans, dealt."""
    n = 0
    for layout, W, activation, seed in cases:
        rng = random.Random(seed)
        if layout == "fragments":
            cu_list = _layout_cu(rng, world, "contiguous", 3)
            frags = deal_fragments(rng, cu_list[-1], world, (1,))
            ctx = build_kcp_context(torch.tensor(cu_list, dtype=torch.int32), fragments=frags)
        elif layout == "round_robin":  # token t on rank t % P, one document: 7-row halos over 7 ranks
            cu_list = [0, 2 * world]
            frags = [[(t, t + 1) for t in range(r, 2 * world, world)] for r in range(world)]
            ctx = build_kcp_context(torch.tensor(cu_list, dtype=torch.int32), fragments=frags)
        else:
            cu_list = _layout_cu(rng, world, layout, rng.choice([2, 5]))
            ctx = build_kcp_context(torch.tensor(cu_list, dtype=torch.int32), layout=layout)
        cu = torch.tensor(cu_list, dtype=torch.int32)
        n += _check(f"rank {rank}/{world} {layout} W={W} activation={activation}", ctx, cu, W, activation, backend,
                    seed)
    return n


def _check_multi(rank, world, seed, W=3, activation=None, backend="reference", channels=(8, 16, 24), unit=3):
    """q, k, v (C = 8, 16, 24; biases on all but the second) at width W in ONE call == the
    single-tensor calls and the single-rank op, bitwise; one exchange forward, one backward."""
    rng = random.Random(seed)
    cu_list = _layout_cu(rng, world, "zigzag", unit)
    cu = torch.tensor(cu_list, dtype=torch.int32)
    ctx = build_kcp_context(cu, layout="zigzag")
    tensors = [_global_inputs(ctx.total_tokens, C, W, seed + C) for C in channels]
    xs = [ctx.shard(t[0]).requires_grad_(True) for t in tensors]
    ws = [t[2].clone().requires_grad_(True) for t in tensors]
    bs = [None if i == 1 else t[3].clone().requires_grad_(True) for i, t in enumerate(tensors)]
    _take()
    ys = cake_causal_conv1d_det_multi_kcp(xs, ws, ctx, biases=bs, activation=activation, backend=backend)
    assert _take()["exchange"] == 1
    torch.autograd.backward(ys, [ctx.shard(t[1]) for t in tensors])
    assert _take()["exchange"] == 1
    idx = ctx.local_token_indices
    for i, (x, dy, w, b) in enumerate(tensors):
        x1, w1 = ctx.shard(x).requires_grad_(True), w.clone().requires_grad_(True)
        b1 = None if bs[i] is None else b.clone().requires_grad_(True)
        y1 = cake_causal_conv1d_det_kcp(x1, w1, ctx, bias=b1, activation=activation, backend=backend)
        y1.backward(ctx.shard(dy))
        assert torch.equal(ys[i], y1) and torch.equal(xs[i].grad, x1.grad), f"rank {rank}: multi [{i}]"
        assert torch.equal(ws[i].grad, w1.grad), f"rank {rank}: multi dweight[{i}]"
        assert b1 is None or torch.equal(bs[i].grad, b1.grad), f"rank {rank}: multi dbias[{i}]"
    # and the single-rank op of the whole batch (the first tensor, with its bias)
    y_s, dx_s = _single(*tensors[0], cu, activation, backend)[:2]
    assert torch.equal(ys[0], y_s[idx]) and torch.equal(xs[0].grad, dx_s[idx]), f"rank {rank}: multi vs single rank"
    return 1


def _check_errors(rank, world, backend="reference"):
    """Bad widths and activations raise ValueError naming the value on every rank, before any
    exchange (a later valid call still works)."""
    cu = torch.tensor([0, 5, 4 * world], dtype=torch.int32)
    ctx = build_kcp_context(cu, layout="contiguous")
    S = ctx.num_local_tokens
    x8, x16 = torch.randn(S, 8).bfloat16(), torch.randn(S, 16).bfloat16()
    _take()
    with pytest.raises(ValueError, match=r"weights\[0\] has W = 3.*weights\[1\] has W = 5"):
        cake_causal_conv1d_det_multi_kcp([x8, x16], [torch.randn(8, 3), torch.randn(16, 5)], ctx, backend=backend)
    with pytest.raises(ValueError, match=r"W = 9.*2 <= W <= 8"):
        cake_causal_conv1d_det_kcp(x8, torch.randn(8, 9), ctx, backend=backend)
    with pytest.raises(ValueError, match=r"W = 1\b"):
        cake_causal_conv1d_det_kcp(x8.requires_grad_(True), torch.randn(8, 1), ctx, backend=backend)
    with pytest.raises(ValueError, match="'relu'"):
        cake_causal_conv1d_det_kcp(x8, torch.randn(8, 3), ctx, activation="relu", backend=backend)
    with pytest.raises(ValueError, match="'relu'"):
        cake_causal_conv1d_det_multi_kcp([x8, x16], [torch.randn(8, 3), torch.randn(16, 3)], ctx,
                                         activation="relu", backend=backend)
    with pytest.raises(ValueError, match=r"W = 9"):
        cake_causal_conv1d_det_forward_kcp(x8, torch.randn(8, 9), ctx, backend=backend)
    assert _take()["exchange"] == 0, "a refused call exchanged"
    assert ctx.widths == (4,)  # nothing built for a refused call
    y = cake_causal_conv1d_det_kcp(x8, torch.randn(8, 3), ctx, activation=None, backend=backend)
    assert y.shape == x8.shape and ctx.widths == (3, 4)
    return 1


def _world(rank, world, cases, extra):
    _install_counters()
    n = _run_cases(rank, world, cases)
    if "multi" in extra:
        n += _check_multi(rank, world, 500 + world)
    if "errors" in extra:
        n += _check_errors(rank, world)
    if "recompute" in extra:
        # 1- and 2-token fragments: the W = 8 histories span several fragments and ranks
        rng = random.Random(600 + world)
        cu_list = [0, 3, 3, 9, 26]
        ctx = build_kcp_context(torch.tensor(cu_list, dtype=torch.int32),
                                fragments=deal_fragments(rng, cu_list[-1], world, (1, 1, 2)))
        for form in ("single", "multi"):
            n += recompute_case(rank, world, "fragments", ctx, form, 700 + world, width=8, activation=None,
                                modes=(True, False))
    return n


# (world size, cases, extra checks): every layout, W in {2, 3, 5, 8}, both activations, spread.
WORLDS = {
    2: ([("contiguous", 2, None, 1), ("zigzag", 3, "silu", 2), ("zigzag_per_document", 8, None, 3)],
        ("multi", "errors", "recompute")),
    3: ([("zigzag", 5, None, 11), ("zigzag_per_document", 5, "silu", 12), ("contiguous", 8, "silu", 13),
         ("fragments", 8, None, 14)], ()),
    4: ([("zigzag_per_document", 2, "silu", 21), ("zigzag", 8, None, 22), ("fragments", 8, "silu", 23),
         ("fragments", 3, None, 24)], ()),
    8: ([("round_robin", 8, None, 31), ("round_robin", 8, "silu", 32), ("contiguous", 3, None, 33)], ()),
}


@pytest.mark.dist
@pytest.mark.parametrize("world", sorted(WORLDS))
def test_every_width_bitwise_on_every_rank(world):
    cases, extra = WORLDS[world]
    counts = run_on_ranks(_world, world, cases, extra, timeout_s=240)
    assert len(counts) == world and all(c > 0 for c in counts)


def _interp_world(rank, world):
    assert os.environ.get("TRITON_INTERPRET") == "1"
    _install_counters()
    # token t on rank t % 2: the 7-row histories and futures alternate between the two ranks
    return _run_cases(rank, world, [("round_robin", 8, None, 41)], backend="triton")


@pytest.mark.interpret
@pytest.mark.dist
def test_every_width_triton_interpreted_on_every_rank():
    """The Triton kernels (interpreted, bounds-checked) at W = 8 without activation over 1-token
    fragments (halos over both ranks). The multi form's column slices do not depend on W: the
    W = 4 interpreted test of test_kcp_ops.py covers them."""
    assert len(run_on_ranks(_interp_world, 2, timeout_s=600)) == 2


# ------------------------------------------------------------------ one process (1-rank context)

def _one_rank_context(seed=5):
    """A 1-rank context of 1- to 3-token fragments in shuffled order: local multi-hop halos."""
    cu = [0, 7, 7, 20, 21, 40]
    rng = random.Random(seed)
    frags = deal_fragments(rng, 40, 1, (1, 1, 2, 3))
    return build_kcp_context(torch.tensor(cu, dtype=torch.int32), fragments=frags), cu


def test_tables_of_a_width_are_built_once_and_share_the_segments():
    ctx, cu = _one_rank_context()
    assert ctx.widths == (4,) and ctx.plan_for_width(4) is ctx.plan and ctx.plan.halo_rows == 3
    plan8 = ctx.plan_for_width(8)
    assert plan8.halo_rows == 7 and ctx.plan_for_width(8) is plan8 and ctx.widths == (4, 8)
    assert plan8.local_cu_seqlens is ctx.local_cu_seqlens and plan8.local_token_indices is ctx.local_token_indices
    assert plan8.hist.map.shape == (ctx.num_segments * 7,) and plan8.fix_fwd_rows.numel() >= ctx.fix_fwd_rows.numel()
    for bad in (1, 9, 4.0, True):
        with pytest.raises(ValueError, match="from 2 to 8"):
            ctx.plan_for_width(bad)
    assert ctx.widths == (4, 8)


@pytest.mark.parametrize("W", [2, 3, 5, 6, 7, 8])
def test_one_rank_multi_hop_every_width(W):
    ctx, cu = _one_rank_context(W)
    for activation in ("silu", None):
        _check(f"W={W} activation={activation}", ctx, torch.tensor(cu, dtype=torch.int32), W, activation,
               "reference", 40 + W, C=16, reduce=False)


def test_entry_points_at_another_width():
    """The forward/backward entry points (single and multi) at W = 5 without activation: the
    autograd op's bits, histories [D, 4, C]; hists of another width are refused."""
    ctx, cu = _one_rank_context()
    x, dy, w, b = _global_inputs(40, 8, 5, 9)
    xl, dyl = ctx.shard(x), ctx.shard(dy)
    y, hist = cake_causal_conv1d_det_forward_kcp(xl, w, ctx, b, activation=None, backend="reference")
    assert hist.shape == (ctx.num_segments, 4, 8)
    dx, dw, db = cake_causal_conv1d_det_backward_kcp(dyl, xl, w, ctx, b, hist=hist, activation=None,
                                                     backend="reference")
    leaves = [t.clone().requires_grad_(True) for t in (xl, w, b)]
    y_a = cake_causal_conv1d_det_kcp(leaves[0], leaves[1], ctx, bias=leaves[2], activation=None, backend="reference")
    y_a.backward(dyl)
    assert torch.equal(y, y_a) and torch.equal(dx, leaves[0].grad)
    assert torch.equal(dw, leaves[1].grad) and torch.equal(db, leaves[2].grad)
    ys, hists = cake_causal_conv1d_det_multi_forward_kcp([xl, xl], [w, w], ctx, [b, None], activation=None,
                                                         backend="reference", hists=[hist, hist])
    assert torch.equal(ys[0], y)
    dxs, dws, dbs = cake_causal_conv1d_det_multi_backward_kcp([dyl, dyl], [xl, xl], [w, w], ctx, [b, None],
                                                              hists=hists, activation=None, backend="reference")
    assert torch.equal(dxs[0], dx) and torch.equal(dws[1], dw) and dbs[1] is None
    with pytest.raises(ValueError, match=r"hists\[0\] must be \[D, W - 1, C\]"):
        cake_causal_conv1d_det_backward_kcp(dyl, xl, torch.randn(8, 4), ctx, hist=hist, backend="reference")
    # the SiLU result differs (the keyword reaches the arithmetic)
    assert not torch.equal(cake_causal_conv1d_det_forward_kcp(xl, w, ctx, b, backend="reference")[0], y)


def test_custom_ops_at_another_width():
    """The custom ops with W = 3 and activation None: opcheck, and the autograd Functions compiled
    (fullgraph) give the eager bits."""
    ctx, _ = _one_rank_context()
    fwd = torch.ops.cakeconv.cake_causal_conv1d_det_kcp_forward
    x, dy, w, b = _global_inputs(40, 8, 3, 10)
    xs, ws, bs = [ctx.shard(x)], [w], [b]
    D = ctx.num_segments
    torch.library.opcheck(fwd, (xs, ws, bs, [True], ctx.op_id, D, kcp_ops.NO_HANDLE, "conv", "reference", None))
    out = fwd(xs, ws, bs, [True], ctx.op_id, D, kcp_ops.NO_HANDLE, "conv", "reference", None)
    assert out[1].shape == (D, 2, 8)
    bwd = torch.ops.cakeconv.cake_causal_conv1d_det_kcp_backward
    torch.library.opcheck(bwd, ([ctx.shard(dy)], xs, ws, bs, [True], out[1:], ctx.op_id, "reference", None))

    def f(x_, w_, b_):
        a = kcp_ops.CakeCausalConv1dDetFunctionKcp.apply(x_, w_, b_, ctx, "reference", None, None)
        m = kcp_ops.CakeCausalConv1dDetMultiFunctionKcp.apply(ctx, "reference", None, 1, x_, w_, b_, None)[0]
        return a, m

    results = []
    for fn in (f, torch.compile(f, fullgraph=True, backend="aot_eager")):
        leaves = [t.clone().requires_grad_(True) for t in (ctx.shard(x), w, b)]
        a, m = fn(*leaves)
        torch.autograd.backward([a, m], [ctx.shard(dy), ctx.shard(dy)])
        results.append([a.detach(), m.detach()] + [t.grad for t in leaves])
    assert torch.equal(results[0][0], results[0][1]) and torch.equal(results[0][0], out[0])
    assert all(torch.equal(e, c) for e, c in zip(*results))


def test_load_layout_keeps_every_width():
    """A context that holds W = 4 and W = 3 tables loads both from a new layout (the other context
    builds its W = 3 tables on demand); a layout that does not fit W = 3 is refused, nothing copied."""
    T = 64
    frags = [[(16, 32), (0, 16), (48, 64), (32, 48)]]
    cu_a, cu_b = [0, 10, 40, 64], [0, 12, 44, 64]  # boundaries clear of the fragment edges
    ctx = build_kcp_context(torch.tensor(cu_a, dtype=torch.int32), fragments=frags)
    x, dy, w, b = _global_inputs(T, 8, 3, 12)
    cake_causal_conv1d_det_kcp(ctx.shard(x), w, ctx, bias=b, activation=None, backend="reference")
    assert ctx.widths == (3, 4)
    ctx_b = build_kcp_context(torch.tensor(cu_b, dtype=torch.int32), fragments=frags)
    assert ctx.load_layout_(ctx_b) is ctx and ctx_b.widths == (3, 4)
    for W in (3, 4):
        mine, theirs = ctx.plan_for_width(W).device_tables(), ctx_b.plan_for_width(W).device_tables()
        assert all(torch.equal(v, theirs[k]) for k, v in mine.items()), W
    _check("loaded", ctx, torch.tensor(cu_b, dtype=torch.int32), 3, None, "reference", 13, reduce=False)
    # a document boundary 1 token after a fragment edge: other boundary rows (both widths)
    ctx_c = build_kcp_context(torch.tensor([0, 17, 40, 64], dtype=torch.int32), fragments=frags)
    before = {W: {k: v.clone() for k, v in ctx.plan_for_width(W).device_tables().items()} for W in (3, 4)}
    with pytest.raises(ValueError, match="fix_fwd_rows"):
        ctx.load_layout_(ctx_c)
    for W in (3, 4):
        assert all(torch.equal(before[W][k], v) for k, v in ctx.plan_for_width(W).device_tables().items())
    assert ctx.global_cu_seqlens == tuple(cu_b)


def test_capture_without_tables_of_the_width_raises(monkeypatch):
    """While a CUDA graph is being captured, a width without tables raises (no host build)."""
    ctx, _ = _one_rank_context()
    monkeypatch.setattr(ctx, "device", torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="one eager call of width 6"):
        ctx.plan_for_width(6)
    assert ctx.widths == (4,)
