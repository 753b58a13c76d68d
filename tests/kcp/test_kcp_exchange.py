"""Halo exchange over gloo (kcp_exchange.py): every rank's buffer, slot by slot.

Each world size spawns its ranks once and runs every case inside (processes cost seconds). All
ranks draw the same random batches from the same seed, build the context, and check their OWN
buffers against the global tensors (rank 0 has no history, so a rank-0 check would prove nothing):
    hist[d*H + j] = x_global[first(d) - H + j]   if that token is in the segment's document, else 0
    fut[d*H + j]  = f(stop(d) + j)               if that token is in the segment's document, else 0
where f(t) is what the token's owner put in its g_send row.

Shape legend: T global tokens, S local rows, C channels, D segments, H = 3 halo rows, F future rows.
"""

from __future__ import annotations

import random

import pytest
import torch

from cakeconv.cake_causal_conv1d_det_train_backend.kcp.context import build_kcp_context
from cakeconv.cake_causal_conv1d_det_train_backend.kcp.exchange import halo_exchange, start_halo_exchange
from cakeconv.cake_causal_conv1d_det_train_backend.kcp.plan import HALO_ROWS, layout_fragments

from ._dist import run_on_ranks
from .test_kcp_plan import random_cu_seqlens, random_fragments

H = HALO_ROWS
C = 4


def global_x(total_tokens: int, dtype=torch.float32) -> torch.Tensor:
    """x_TC[t, c] = (t + 1) + c / 8: nonzero, unique per token, exact in bf16 for small T."""
    return ((torch.arange(total_tokens)[:, None] + 1).float() + torch.arange(C)[None, :] / 8).to(dtype)


def g_of_tokens(tokens: torch.Tensor) -> torch.Tensor:
    """The FP32 'gradient' row each owner sends for a global token: -(t + 1) - c / 4."""
    return -(tokens[:, None] + 1).float() - torch.arange(C)[None, :] / 4


def expected_buffers(ctx, x_TC: torch.Tensor):
    """Brute force from the global tensors and the context's segments (not its halo tables)."""
    cu = list(ctx.global_cu_seqlens)
    tokens = ctx.local_token_indices.tolist()
    local_cu = ctx.local_cu_seqlens.tolist()
    hist_NC = torch.zeros(ctx.num_segments * H, C, dtype=x_TC.dtype)
    fut_NC = torch.zeros(ctx.num_segments * H, C, dtype=torch.float32)
    for d in range(ctx.num_segments):
        first = tokens[local_cu[d]]
        stop = tokens[local_cu[d + 1] - 1] + 1
        doc = max(i for i in range(len(cu) - 1) if cu[i] <= first < cu[i + 1])
        for j in range(H):
            if first - H + j >= cu[doc]:
                hist_NC[d * H + j] = x_TC[first - H + j]
            if stop + j < cu[doc + 1]:
                fut_NC[d * H + j] = g_of_tokens(torch.tensor([stop + j]))[0]
    return hist_NC, fut_NC


def check_case(rank: int, cu: list[int], *, layout=None, fragments=None, dtype=torch.float32) -> tuple:
    ctx = build_kcp_context(torch.tensor(cu, dtype=torch.int32), layout=layout, fragments=fragments)
    x_TC = global_x(cu[-1], dtype)
    x_local_SC = ctx.shard(x_TC)
    g_send_FC = g_of_tokens(ctx.local_token_indices[ctx.fut_rows])
    want_hist, want_fut = expected_buffers(ctx, x_TC)

    hist_NC = ctx.exchange_hist(x_local_SC)
    fut_NC = ctx.exchange_fut(g_send_FC)
    assert hist_NC.shape == (ctx.num_segments * H, C) and hist_NC.dtype == dtype
    assert fut_NC.shape == (ctx.num_segments * H, C) and fut_NC.dtype == torch.float32
    assert torch.equal(hist_NC, want_hist), f"rank {rank} hist\n{hist_NC}\n{want_hist}"
    assert torch.equal(fut_NC, want_fut), f"rank {rank} fut\n{fut_NC}\n{want_fut}"

    # The split form, overlapped with other work, into preallocated buffers full of garbage;
    # two exchanges in flight at once must not mix their messages.
    out_hist = torch.full_like(hist_NC, 7.0)
    out_fut = torch.full_like(fut_NC, 7.0)
    pending_hist = start_halo_exchange(x_local_SC, ctx.hist_exchange, ctx.num_slots, ctx.group, out=out_hist)
    pending_fut = start_halo_exchange(g_send_FC, ctx.fut_exchange, ctx.num_slots, ctx.group, out=out_fut)
    _ = x_local_SC.sum()  # "interior work"
    assert pending_fut.wait() is out_fut and pending_hist.wait() is out_hist
    assert pending_hist.wait() is out_hist  # wait() is idempotent
    assert torch.equal(out_hist, want_hist) and torch.equal(out_fut, want_fut), f"rank {rank} (split form)"

    # The functional form on the plain spec (what the kernels call).
    again = halo_exchange(x_local_SC, ctx.hist_exchange, ctx.num_slots, ctx.group)
    assert torch.equal(again, want_hist)
    return ctx.num_segments, len(ctx.hist_exchange.peers)


def exchange_worker(rank: int, world_size: int) -> list:
    stats = []
    rng = random.Random(2024 + world_size)  # same draws on every rank
    for _ in range(6):
        cu = random_cu_seqlens(rng, num_docs=rng.randint(1, 6), max_len=4 * world_size + 6)
        stats.append(check_case(rank, cu, fragments=random_fragments(rng, cu[-1], world_size)))

    # Named layouts, with short chunks (multi-hop) and documents over several ranks.
    p2 = 2 * world_size
    stats.append(check_case(rank, [0, 3, 3, 5 * p2], layout="zigzag"))
    stats.append(check_case(rank, [0, p2, p2, 3 * p2, 4 * p2], layout="zigzag_per_document"))
    stats.append(check_case(rank, [0, 1, 2 * world_size + 1, 3 * world_size], layout="contiguous", dtype=torch.bfloat16))

    # Every fragment starts a document except on the last rank: the others receive no history
    # but still answer (send) or simply take no part, and nothing hangs.
    cu = [0] + [2 * (r + 1) for r in range(world_size)]
    frags = layout_fragments(cu, world_size, "contiguous")
    if world_size > 1:
        cu = cu[:-2] + cu[-1:]  # the last two ranks share a document
    stats.append(check_case(rank, cu, fragments=frags))
    # No rank exchanges anything at all.
    stats.append(check_case(rank, [0] + [3 * (r + 1) for r in range(world_size)], layout="contiguous"))
    return stats


# Grid rationale: 1 rank (self copies only), 2 (one pair), 3 (odd), 4, 8 (multi-hop over many ranks).
@pytest.mark.dist
@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 8])
def test_halo_exchange_every_rank(world_size):
    results = run_on_ranks(exchange_worker, world_size)
    assert len(results) == world_size
    if world_size > 1:
        # some rank did talk to a peer in the random cases (the test is not vacuous)
        assert any(peers > 0 for per_rank in results for _, peers in per_rank)


def test_halo_exchange_without_process_group():
    # 1-rank context, no process group: everything is a self copy, e.g. a local order that puts
    # the document's tail first.
    cu = [0, 2, 9]
    ctx = build_kcp_context(torch.tensor(cu), fragments=[[(5, 9), (0, 5)]])
    assert ctx.group is None and ctx.hist_exchange.peers == ()
    x_TC = global_x(9)
    hist_NC = ctx.exchange_hist(ctx.shard(x_TC))
    want_hist, want_fut = expected_buffers(ctx, x_TC)
    assert torch.equal(hist_NC, want_hist)
    assert torch.equal(hist_NC[0:3], x_TC[2:5])  # segment (5, 9) reads tokens 2, 3, 4
    fut_NC = ctx.exchange_fut(g_of_tokens(ctx.local_token_indices[ctx.fut_rows]))
    assert torch.equal(fut_NC, want_fut)


def test_halo_exchange_rejects_mismatched_shapes():
    ctx = build_kcp_context(torch.tensor([0, 6]), fragments=[[(3, 6), (0, 3)]])
    with pytest.raises(ValueError, match="6 rows.*\\(5, 4\\)"):
        ctx.exchange_hist(torch.zeros(5, C))
    with pytest.raises(ValueError, match="n_slots = 3 .*num_slots = 6"):
        halo_exchange(torch.zeros(6, C), ctx.hist_exchange, 3, None)
    with pytest.raises(ValueError, match="out must be"):
        ctx.exchange_hist(torch.zeros(6, C), out=torch.zeros(6, C, dtype=torch.float64))
