"""Halo exchange over gloo (kcp/exchange.py + the plan's HaloTables): every rank's buffer, slot by slot.

Each world size spawns its ranks once and runs every case inside (processes cost seconds). All
ranks draw the same random batches from the same seed, build the context, and check their OWN
buffers against the global tensors (rank 0 has no history, so a rank-0 check would prove nothing):
    hist[d*H + j] = x_global[first(d) - H + j]   if that token is in the segment's document, else 0
    fut[d*H + j]  = f(stop(d) + j)               if that token is in the segment's document, else 0
where f(t) is what the token's owner put in its g row. The test packs, exchanges and fills the slots
itself from the tables (plan.py HaloTables), independently of the ops' gather kernel.

Shape legend: T global tokens, S local rows, C channels, D segments, H = 3 halo rows, F future rows.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from cakeconv.cake_causal_conv1d_det_train_backend.kcp.context import build_kcp_context
from cakeconv.cake_causal_conv1d_det_train_backend.kcp.exchange import start_exchange
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


def fill(tables, local, recv, num_slots):
    """The halo buffer from the map: local[m] (m >= 0), recv[-2 - m] (m <= -2), else zero."""
    buf = torch.zeros((num_slots,) + tuple(local.shape[1:]), dtype=local.dtype)
    m = tables.map
    buf[m >= 0] = local[m[m >= 0]]
    buf[m <= -2] = recv[-2 - m[m <= -2]]
    return buf


def start(tables, local, ctx):
    """Pack this rank's rows for its peers and start the exchange; returns (pending, recv)."""
    send = local[tables.send_rows].contiguous()
    recv = torch.full((tables.num_recv,) + tuple(local.shape[1:]), 7.0, dtype=local.dtype)  # garbage first
    return start_exchange(send, recv, tables, ctx.group, ctx.coalesce), recv


def check_case(rank: int, cu: list[int], *, layout=None, fragments=None, dtype=torch.float32) -> tuple:
    ctx = build_kcp_context(torch.tensor(cu, dtype=torch.int32), layout=layout, fragments=fragments)
    plan = ctx.plan
    x_TC = global_x(cu[-1], dtype)
    x_local_SC = ctx.shard(x_TC)
    g_local_FC = g_of_tokens(ctx.local_token_indices[plan.fut.g_rows])
    want_hist, want_fut = expected_buffers(ctx, x_TC)
    assert plan.fut.send_rows.tolist() == list(range(plan.fut.num_send))  # the first g rows are sent

    # Both exchanges in flight at once, overlapped with other work: they must not mix messages.
    pending_hist, recv_hist = start(plan.hist, x_local_SC, ctx)
    pending_fut, recv_fut = start(plan.fut, g_local_FC, ctx)
    _ = x_local_SC.sum()  # "interior work"
    pending_fut.wait()
    pending_hist.wait()
    pending_hist.wait()  # wait() is idempotent
    hist_NC = fill(plan.hist, x_local_SC, recv_hist, ctx.num_segments * H)
    fut_NC = fill(plan.fut, g_local_FC, recv_fut, ctx.num_segments * H)
    assert torch.equal(hist_NC, want_hist), f"rank {rank} hist\n{hist_NC}\n{want_hist}"
    assert torch.equal(fut_NC, want_fut), f"rank {rank} fut\n{fut_NC}\n{want_fut}"
    peers = {q for q, _ in plan.hist.sends + plan.hist.recvs}
    return ctx.num_segments, len(peers)


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
    # One rank, zigzag: the back part reads its own front part (map >= 0), no messages.
    cu = [0, 12]
    ctx = build_kcp_context(torch.tensor(cu), layout="zigzag")
    assert ctx.group is None and ctx.plan.hist.sends == ctx.plan.hist.recvs == ()
    assert check_case(0, cu, layout="zigzag") == (2, 0)


def test_exchange_with_peers_needs_a_group():
    ctx = build_kcp_context(torch.tensor([0, 8]))
    tables = dataclasses.replace(ctx.plan.hist, sends=((1, 2),), send_starts=None)
    with pytest.raises(RuntimeError, match="no process group"):
        start_exchange(torch.zeros(2, C), torch.zeros(0, C), tables, None, False)
