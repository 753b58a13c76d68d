"""build_kcp_context / KcpContext (kcp_context.py): defaults, sharding, input checks, and the
build-time agreement check across ranks (every rank must raise, none may hang).

Shape legend: T global tokens, S local rows, C channels.
"""

from __future__ import annotations

import pytest
import torch

from cakeconv.cake_causal_conv1d_det_train_backend.kcp.context import KcpContext, build_kcp_context

from ._dist import run_on_ranks


def test_no_process_group_gives_a_one_rank_context():
    cu = torch.tensor([0, 5, 5, 9], dtype=torch.int32)
    ctx = build_kcp_context(cu)
    assert isinstance(ctx, KcpContext)
    assert (ctx.group, ctx.rank, ctx.world_size) == (None, 0, 1)
    assert ctx.layout == "contiguous" and ctx.fragments == (((0, 9),),)
    assert ctx.total_tokens == 9 and ctx.num_local_tokens == 9 and ctx.global_cu_seqlens == (0, 5, 5, 9)
    assert ctx.device == cu.device
    assert ctx.local_token_indices.dtype == torch.int64 and ctx.local_token_indices.tolist() == list(range(9))
    assert ctx.local_cu_seqlens.dtype == torch.int32 and ctx.local_cu_seqlens.tolist() == [0, 5, 9]
    assert ctx.num_segments == 2
    assert ctx.plan.hist_src.tolist() == [[[-1, -1]] * 3] * 2 and ctx.plan.fut.g_rows.numel() == 0
    assert ctx.plan.hist.map.tolist() == [-1] * 6 and ctx.plan.hist.sends == ctx.plan.hist.recvs == ()


def test_shard_in_local_order():
    cu = torch.tensor([0, 4, 10])
    ctx = build_kcp_context(cu, fragments=[[(6, 10), (0, 6)]])
    assert ctx.layout == "fragments"
    assert ctx.local_token_indices.tolist() == [6, 7, 8, 9, 0, 1, 2, 3, 4, 5]
    x_TC = torch.arange(10 * 8, dtype=torch.float32).reshape(10, 8)
    assert torch.equal(ctx.shard(x_TC), x_TC[[6, 7, 8, 9, 0, 1, 2, 3, 4, 5]])
    assert torch.equal(ctx.shard(x_TC[None]), x_TC[None, [6, 7, 8, 9, 0, 1, 2, 3, 4, 5]])
    # segments: (6, 10) | (0, 4) | (4, 6), cut at the fragment and at the document boundary
    assert ctx.local_cu_seqlens.tolist() == [0, 4, 8, 10]
    with pytest.raises(ValueError, match="T = 10.*\\(9, 8\\)"):
        ctx.shard(x_TC[:9])


def test_one_rank_named_layouts():
    cu = torch.tensor([0, 6, 12])
    zig = build_kcp_context(cu, layout="zigzag")
    assert zig.layout == "zigzag" and zig.fragments == (((0, 6), (6, 12)),)
    assert zig.local_cu_seqlens.tolist() == [0, 6, 12]
    per_doc = build_kcp_context(cu, layout="zigzag_per_document")
    assert per_doc.fragments == (((0, 3), (3, 6), (6, 9), (9, 12)),)
    assert per_doc.plan.hist_src[1].tolist() == [[0, 0], [0, 1], [0, 2]]


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        (dict(layout="zigzag", fragments=[[(0, 8)]]), r"at most one of layout and fragments"),
        (dict(layout="ring"), r"unknown KCP layout 'ring'.*contiguous, zigzag, zigzag_per_document"),
        (dict(fragments=[[(0, 4)]]), r"gap.*\[4, 8\)"),
        (dict(fragments=[[(0, 8)], [(8, 8)]]), r"2 rank entries.*1 ranks"),
    ],
)
def test_bad_arguments(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        build_kcp_context(torch.tensor([0, 8]), **kwargs)


@pytest.mark.parametrize(
    "cu, pattern",
    [
        (torch.tensor([0.0, 8.0]), r"integer.*float32"),
        (torch.tensor([[0, 8]]), r"1-D.*\(1, 2\)"),
        (torch.tensor([2, 8]), r"start at 0.*2"),
        (torch.tensor([0, 8, 4]), r"non-decreasing.*8 > cu_seqlens\[2\] = 4"),
    ],
)
def test_bad_cu_seqlens(cu, pattern):
    with pytest.raises(ValueError, match=pattern):
        build_kcp_context(cu)


def test_a_failed_build_leaves_nothing_behind():
    with pytest.raises(ValueError):
        build_kcp_context(torch.tensor([0, 7]), layout="zigzag")
    ctx = build_kcp_context(torch.tensor([0, 8]), layout="zigzag")
    assert ctx.fragments == (((0, 4), (4, 8)),)


def agreement_worker(rank: int, world_size: int) -> list[str]:
    """Several builds in one process group; each returns the error message or 'ok'."""
    outcomes = []

    def attempt(**kwargs):
        try:
            ctx = build_kcp_context(**kwargs)
        except ValueError as exc:
            outcomes.append(str(exc))
        else:
            outcomes.append("ok")
            assert ctx.world_size == world_size and ctx.rank == rank and ctx.group is not None

    # 1. The same input: fine, and the shard is the rank's contiguous piece.
    attempt(cu_seqlens=torch.tensor([0, 3, 8]))
    # 2. Different cu_seqlens on the two ranks (same T).
    attempt(cu_seqlens=torch.tensor([0, 3 + rank, 8]))
    # 3. Different layouts.
    attempt(cu_seqlens=torch.tensor([0, 8]), layout="zigzag" if rank == 0 else "contiguous")
    # 4. One rank's input is invalid (T = 7 cannot be split in 2): the other must not hang.
    attempt(cu_seqlens=torch.tensor([0, 8 - rank]))
    # 5. Fragments given on one rank, layout on the other (same tokens, different layout name).
    if rank == 0:
        attempt(cu_seqlens=torch.tensor([0, 8]), fragments=[[(0, 4)], [(4, 8)]])
    else:
        attempt(cu_seqlens=torch.tensor([0, 8]), layout="contiguous")
    # 6. Different explicit fragment tables.
    attempt(cu_seqlens=torch.tensor([0, 8]), fragments=[[(0, 4)], [(4, 8)]] if rank == 0 else [[(0, 5)], [(5, 8)]])
    # 7. Everything agrees again: the group still works after the failures.
    attempt(cu_seqlens=torch.tensor([0, 8]), fragments=[[(4, 8)], [(0, 4)]])
    return outcomes


@pytest.mark.dist
def test_mismatched_inputs_raise_on_every_rank():
    outcomes = run_on_ranks(agreement_worker, 2)
    for rank, per_rank in enumerate(outcomes):
        assert per_rank[0] == "ok" and per_rank[6] == "ok", f"rank {rank}: {per_rank}"
        assert "different cu_seqlens" in per_rank[1], f"rank {rank}: {per_rank[1]}"
        assert "different layout" in per_rank[2] and "'zigzag'" in per_rank[2], f"rank {rank}: {per_rank[2]}"
        assert "different layout" in per_rank[4] and "'fragments'" in per_rank[4], f"rank {rank}: {per_rank[4]}"
        assert "different fragments" in per_rank[5], f"rank {rank}: {per_rank[5]}"
    # 4: rank 1's own error names T; rank 0 learns that rank 1 failed
    assert "T = 7" in outcomes[1][3]
    assert "failed on rank(s) [1]" in outcomes[0][3]


# ----------------------------------------------------------------- load_layout_ (graph replay)


def _layout_case(rank, world_size, backend):
    """Load layout B into a context built for layout A; the op through it equals B's, bitwise."""
    from cakeconv import cake_causal_conv1d_det, cake_causal_conv1d_det_kcp

    T, C = 1000, 16
    cu_a = torch.tensor([0, 5, 300, 1000], dtype=torch.int32)
    cu_b = torch.tensor([0, 17, 410, 1000], dtype=torch.int32)  # same segment counts, edges 250/500/750 clear
    ctx = build_kcp_context(cu_a, layout="zigzag")
    ctx_b = build_kcp_context(cu_b, layout="zigzag")
    tables = {k: v.clone() for k, v in ctx.plan.device_tables().items()}
    assert any(not torch.equal(tables[k], v) for k, v in ctx_b.plan.device_tables().items())
    assert ctx.load_layout_(ctx_b) is ctx
    for k, v in ctx.plan.device_tables().items():
        assert torch.equal(v, ctx_b.plan.device_tables()[k]), k
    assert ctx.global_cu_seqlens == (0, 17, 410, 1000)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(T, C, generator=g).bfloat16()
    dy = torch.randn(T, C, generator=g).bfloat16()
    w = torch.randn(C, 4, generator=g)
    xs = x.clone().requires_grad_(True)
    y_s = cake_causal_conv1d_det(xs, w, cu_seqlens=cu_b, backend=backend)
    y_s.backward(dy)
    xl = ctx.shard(x).requires_grad_(True)
    y = cake_causal_conv1d_det_kcp(xl, w, ctx, backend=backend)
    y.backward(ctx.shard(dy))
    idx = ctx.local_token_indices
    assert torch.equal(y, y_s[idx]) and torch.equal(xl.grad, xs.grad[idx])
    # A layout of another shape is refused, naming the table, and nothing is copied.
    ctx_c = build_kcp_context(torch.tensor([0, 1000], dtype=torch.int32), layout="zigzag")
    before = {k: v.clone() for k, v in ctx.plan.device_tables().items()}
    with pytest.raises(ValueError, match="local_cu_seqlens"):
        ctx.load_layout_(ctx_c)
    assert all(torch.equal(before[k], v) for k, v in ctx.plan.device_tables().items())
    return rank


def test_load_layout_one_rank():
    assert _layout_case(0, 1, "reference") == 0


def test_load_layout_two_ranks_every_rank():
    assert run_on_ranks(_layout_case, 2, "reference", timeout_s=120) == [0, 1]
