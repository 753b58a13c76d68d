"""KCP ops over gloo (tier 3): every rank's y and dx bitwise equal the single-rank op's.

Each world size spawns its ranks once and runs every case inside. All ranks draw the same global
batch from the same seed; each computes the single-rank op of the whole batch (same backend) and
checks ITS OWN rows (rank 0 has no halo, so a rank-0-only check would prove nothing):
    y_kcp == y_single[local tokens]  and  dx_kcp == dx_single[local tokens]   (bitwise)
    all_reduce(dweight_kcp) ~ dweight_single                                   (FP32 reordering)
and the multi form (q, k, v with their own C and taps) against separate single-tensor calls.

Shape legend: T global tokens, S local rows, C channels, P ranks.
"""

from __future__ import annotations

import os
import random

import pytest
import torch
import torch.distributed as dist

from cakeconv import build_kcp_context, cake_causal_conv1d_det, cake_causal_conv1d_det_kcp, cake_causal_conv1d_det_multi_kcp

from ._dist import run_on_ranks
from .test_kcp_plan import random_cu_seqlens, random_fragments


def _global_inputs(T, C, seed, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, C, generator=g).to(dtype)
    dy = torch.randn(T, C, generator=g).to(dtype)
    w = torch.randn(C, 4, generator=g) * 0.5
    b = torch.randn(C, generator=g) * 0.5
    return x, dy, w, b


def _single(x, dy, w, b, cu, backend):
    xg, wg, bg = (t.clone().requires_grad_(True) for t in (x, w, b))
    y = cake_causal_conv1d_det(xg, wg, bg, cu_seqlens=cu, backend=backend)
    y.backward(dy)
    return y.detach(), xg.grad, wg.grad, bg.grad


def _kcp(ctx, x, dy, w, b, backend, multi_rows=False):
    xl = ctx.shard(x).requires_grad_(True)
    wl, bl = w.clone().requires_grad_(True), b.clone().requires_grad_(True)
    y = cake_causal_conv1d_det_kcp(xl, wl, ctx, bias=bl, backend=backend)
    y.backward(ctx.shard(dy))
    return y.detach(), xl.grad, wl.grad, bl.grad


def _check_case(rank, world, cu_list, layout, fragments, C, backend, seed):
    T = cu_list[-1]
    cu = torch.tensor(cu_list, dtype=torch.int32)
    x, dy, w, b = _global_inputs(T, C, seed)
    y_s, dx_s, dw_s, db_s = _single(x, dy, w, b, cu, backend)
    ctx = build_kcp_context(cu, layout=layout, fragments=fragments)
    y, dx, dw, db = _kcp(ctx, x, dy, w, b, backend)
    idx = ctx.local_token_indices
    assert torch.equal(y, y_s[idx]), f"rank {rank}: y differs ({layout or 'fragments'})"
    assert torch.equal(dx, dx_s[idx]), f"rank {rank}: dx differs ({layout or 'fragments'})"
    dist.all_reduce(dw)
    dist.all_reduce(db)
    scale = max(1.0, dw_s.abs().max().item())
    assert (dw - dw_s).abs().max().item() <= 1e-5 * scale, f"rank {rank}: dweight"
    assert (db - db_s).abs().max().item() <= 1e-5 * max(1.0, db_s.abs().max().item()), f"rank {rank}: dbias"
    return ctx.num_segments


def _check_multi(rank, world, cu_list, layout, backend, seed):
    """q, k, v (C = 8, 16, 24) in one call == three single calls, bitwise, forward and backward."""
    T = cu_list[-1]
    cu = torch.tensor(cu_list, dtype=torch.int32)
    ctx = build_kcp_context(cu, layout=layout)
    tensors = [_global_inputs(T, C, seed + C) for C in (8, 16, 24)]
    xs = [ctx.shard(t[0]).requires_grad_(True) for t in tensors]
    ws = [t[2].clone().requires_grad_(True) for t in tensors]
    bs = [tensors[0][3].clone().requires_grad_(True), None, tensors[2][3].clone().requires_grad_(True)]
    ys = cake_causal_conv1d_det_multi_kcp(xs, ws, ctx, biases=bs, backend=backend)
    torch.autograd.backward(ys, [ctx.shard(t[1]) for t in tensors])
    for i, t in enumerate(tensors):
        x1 = ctx.shard(t[0]).requires_grad_(True)
        w1 = t[2].clone().requires_grad_(True)
        b1 = None if bs[i] is None else bs[i].detach().clone().requires_grad_(True)
        y1 = cake_causal_conv1d_det_kcp(x1, w1, ctx, bias=b1, backend=backend)
        y1.backward(ctx.shard(t[1]))
        assert torch.equal(ys[i], y1), f"rank {rank}: multi y[{i}]"
        assert torch.equal(xs[i].grad, x1.grad), f"rank {rank}: multi dx[{i}]"
        assert torch.equal(ws[i].grad, w1.grad), f"rank {rank}: multi dweight[{i}]"
        if b1 is not None:
            assert torch.equal(bs[i].grad, b1.grad), f"rank {rank}: multi dbias[{i}]"
    # and against the single-rank op of the whole batch
    y_s = _single(tensors[1][0], tensors[1][1], tensors[1][2], tensors[1][3], cu, backend)[0]
    assert torch.equal(y_s[ctx.local_token_indices], cake_causal_conv1d_det_kcp(xs[1].detach(), ws[1].detach(), ctx, bias=tensors[1][3], backend=backend))


def _layout_cu(rng, P, layout, T_unit):
    """Global cu_seqlens valid for the layout (docs of 1-3 tokens and docs spanning many ranks)."""
    if layout == "zigzag_per_document":
        lens = [2 * P * rng.choice([1, 1, 2, 3, 5]) for _ in range(rng.randint(2, 4))] + [0]
        rng.shuffle(lens)
        cu = [0]
        for n in lens:
            cu.append(cu[-1] + n)
        return cu
    T = T_unit * 2 * P
    cu = random_cu_seqlens(rng, 12, max(4, T // 3))
    cu = [min(c, T) for c in cu] + [T]
    return sorted(cu)


def _all_cases(rank, world, backend, seed, C):
    rng = random.Random(seed)
    count = 0
    for layout in ("contiguous", "zigzag", "zigzag_per_document"):
        for rep in range(2):
            cu = _layout_cu(rng, world, layout, T_unit=rng.choice([1, 2, 5]))
            count += _check_case(rank, world, cu, layout, None, C, backend, seed + rep)
    for rep in range(2):
        cu = random_cu_seqlens(rng, 10, 12)
        if cu[-1] == 0:
            cu.append(5)
        frags = random_fragments(rng, cu[-1], world)
        count += _check_case(rank, world, cu, None, frags, C, backend, seed + 10 + rep)
    # A rank whose fragments all start documents (no history to receive) still takes part.
    T = 8 * world
    cu = sorted(set([0, T] + [4 * r for r in range(2 * world)]))
    frags = [[(4 * r, 4 * r + 4), (4 * (2 * world - 1 - r), 4 * (2 * world - r))] for r in range(world)]
    count += _check_case(rank, world, cu, None, frags, C, backend, seed + 20)
    _check_multi(rank, world, _layout_cu(rng, world, "zigzag", 3), "zigzag", backend, seed + 30)
    return count


@pytest.mark.dist
@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
def test_kcp_reference_bitwise_on_every_rank(world):
    counts = run_on_ranks(_all_cases, world, "reference", 1000 + world, 16, timeout_s=240)
    assert len(counts) == world and all(c > 0 for c in counts)


def _interp_cases(rank, world, seed):
    assert os.environ.get("TRITON_INTERPRET") == "1"
    rng = random.Random(seed)
    n = _check_case(rank, world, _layout_cu(rng, world, "zigzag", 3), "zigzag", None, 8, "triton", seed)
    cu = random_cu_seqlens(rng, 6, 6)
    cu = cu if cu[-1] > 0 else cu + [4]
    n += _check_case(rank, world, cu, None, random_fragments(rng, cu[-1], world), 8, "triton", seed + 1)
    if world == 2:
        # 6 documents of 4 tokens, each cut into two pieces per rank: 12 local segments with halos on
        # every rank, so the main kernels place rows by per-token segment indices
        # (kernels/segment_ids.py) here and in the single-rank op (one world size: CI time)
        segments = _check_case(rank, world, list(range(0, 4 * 6 + 1, 4)), "zigzag_per_document", None, 8, "triton",
                               seed + 3)
        assert segments >= 5, f"rank {rank}: {segments} local segments"
        n += segments
        # the multi form: column slices of the packed send and receive buffers (bounds-checked)
        _check_multi(rank, world, _layout_cu(rng, world, "zigzag_per_document", 2), "zigzag_per_document",
                     "triton", seed + 2)
    return n


@pytest.mark.interpret
@pytest.mark.dist
@pytest.mark.parametrize("world", [2, 3])
def test_kcp_triton_interpreted_bitwise_on_every_rank(world):
    counts = run_on_ranks(_interp_cases, world, 2000 + world, timeout_s=600)
    assert len(counts) == world
