"""KCP on process sub-groups whose group ranks differ from the global ranks, over gloo (tier 3).

Four ranks; every rank creates every group (torch.distributed needs that) and the members of each
run every layout and an explicit table of 1-3-token fragments (multi-hop halos) on it:

    [0, 1] and [2, 3]    side by side; in [2, 3] group rank 0 is global rank 2
    [0, 2] and [1, 3]    side by side; group rank 1 is global rank 2 / 3
    [3, 1]               new_group(sort_ranks=False): group rank 0 is global rank 3
    [3, 2, 1, 0]         the world reversed (sort_ranks=False)
    [2]                  one rank alone: group rank 0, global rank 2

Each member checks ITS OWN rows against the single-rank op of the whole batch (bitwise y and dx;
dweight/dbias all-reduced over the group within FP32 tolerance), that the context's rank and size
are the group's, and that its rows are the ones the layout gives its GROUP rank. A halo exchange
that addressed a global rank where a group rank belongs (or a plan built for the global rank)
sends rows to the wrong process or to none, and fails here. Only the public API is used.

Shape legend: T global tokens, C channels, q ranks of a group.
"""

from __future__ import annotations

import inspect
import random

import pytest
import torch
import torch.distributed as dist

from cakeconv import build_kcp_context, cake_causal_conv1d_det, cake_causal_conv1d_det_kcp

from tests.helpers import deal_fragments

from ._dist import run_on_ranks

BACKEND = "reference"
C = 8


def _cu_for(rng, layout, q):
    """Global cu_seqlens valid for the layout on q ranks: short, empty and rank-spanning documents."""
    if layout == "zigzag_per_document":
        lens = [2 * q * rng.choice([0, 1, 2, 3, 6]) for _ in range(5)]
        cu = [0]
        for n in lens + [2 * q * 4]:
            cu.append(cu[-1] + n)
        return cu
    T = 2 * q * 12
    cuts = {0, T} | {rng.randrange(1, T) for _ in range(6)}
    cu = sorted(cuts) + [T]  # an empty document at the end
    return [0] + cu  # and one at the start


def _expected_tokens(layout, cu, fragments, q, r):
    """The global tokens of group rank r, in local order, straight from SPEC section 4."""
    T = cu[-1]
    if fragments is not None:
        return [t for a, b in fragments[r] for t in range(a, b)]
    if layout == "contiguous":
        return list(range(r * T // q, (r + 1) * T // q))
    if layout == "zigzag":
        c = T // (2 * q)
        return list(range(r * c, (r + 1) * c)) + list(range((2 * q - 1 - r) * c, (2 * q - r) * c))
    out = []
    for d in range(len(cu) - 1):
        n = cu[d + 1] - cu[d]
        c = n // (2 * q)
        for k in (r, 2 * q - 1 - r):
            out += list(range(cu[d] + k * c, cu[d] + (k + 1) * c))
    return out


def _case(rank, group, members, layout, cu_list, fragments, seed):
    q = len(members)
    grank = members.index(rank)
    where = f"global rank {rank}, group {members} (group rank {grank}), {layout or 'fragments'}, cu={cu_list}"
    T = cu_list[-1]
    cu = torch.tensor(cu_list, dtype=torch.int32)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, C, generator=g).to(torch.bfloat16)
    dy = torch.randn(T, C, generator=g).to(torch.bfloat16)
    w = torch.randn(C, 4, generator=g) * 0.5
    b = torch.randn(C, generator=g) * 0.5

    xs, ws, bs = (t.clone().requires_grad_(True) for t in (x, w, b))
    y_s = cake_causal_conv1d_det(xs, ws, bs, cu_seqlens=cu, backend=BACKEND)
    y_s.backward(dy)

    ctx = build_kcp_context(cu, layout=layout, fragments=fragments, group=group)
    assert (ctx.rank, ctx.world_size) == (grank, q), f"{where}: ctx.rank/world_size {ctx.rank}/{ctx.world_size}"
    assert ctx.local_token_indices.tolist() == _expected_tokens(layout, cu_list, fragments, q, grank), \
        f"{where}: local tokens {ctx.local_token_indices.tolist()}"
    xl = ctx.shard(x).requires_grad_(True)
    wl, bl = w.clone().requires_grad_(True), b.clone().requires_grad_(True)
    y = cake_causal_conv1d_det_kcp(xl, wl, ctx, bias=bl, backend=BACKEND)
    y.backward(ctx.shard(dy))
    idx = ctx.local_token_indices
    assert torch.equal(y, y_s.detach()[idx]), f"{where}: y differs from the single-rank op"
    assert torch.equal(xl.grad, xs.grad[idx]), f"{where}: dx differs from the single-rank op"
    dw, db = wl.grad.clone(), bl.grad.clone()
    dist.all_reduce(dw, group=group)
    dist.all_reduce(db, group=group)
    torch.testing.assert_close(dw, ws.grad, rtol=1e-5, atol=1e-5 * max(1.0, ws.grad.abs().max().item()))
    torch.testing.assert_close(db, bs.grad, rtol=1e-5, atol=1e-5 * max(1.0, bs.grad.abs().max().item()))


def _all_groups(rank, world, seed):
    assert world == 4
    keep_order = "sort_ranks" in inspect.signature(dist.new_group).parameters
    specs = [[0, 1], [2, 3], [0, 2], [1, 3]]
    if keep_order:
        specs += [[3, 1], [3, 2, 1, 0]]
    specs += [[2]]
    groups = []
    for members in specs:  # every rank creates every group, in the same order
        if keep_order:
            group = dist.new_group(members, sort_ranks=False)
        else:
            group = dist.new_group(members)
        groups.append((members, group))
    done = 0
    for gi, (members, group) in enumerate(groups):
        if rank not in members:
            continue
        assert dist.get_rank(group) == members.index(rank), (members, dist.get_rank(group))
        rng = random.Random(seed + gi)  # the same on every member
        q = len(members)
        for layout in ("contiguous", "zigzag", "zigzag_per_document"):
            _case(rank, group, members, layout, _cu_for(rng, layout, q), None, seed + 10 * gi)
            done += 1
        cu = _cu_for(rng, "contiguous", q)
        _case(rank, group, members, None, cu, deal_fragments(rng, cu[-1], q, (1, 1, 2, 3)), seed + 10 * gi + 5)
        done += 1
    dist.barrier()
    return done, keep_order


@pytest.mark.dist
def test_kcp_on_subgroups_bitwise_on_every_member():
    results = run_on_ranks(_all_groups, 4, 4000, timeout_s=120)  # a wrong peer can hang: fail within 2 min
    keep_order = results[0][1]
    # members per rank: [0,1]/[2,3], [0,2]/[1,3], and (with sort_ranks=False) [3,1], the reversed world; [2]
    expected = {r: 2 + (r in (1, 3)) * keep_order + keep_order + (r == 2) for r in range(4)}
    assert [n for n, _ in results] == [4 * expected[r] for r in range(4)]
