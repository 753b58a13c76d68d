"""Host-side KCP planning (kcp/plan.py): layouts, fragment validation, segments and halo tables.

No process group here: every rank's plan is built in one process and checked against a brute-force
definition written independently below (walk the tokens one by one). The halo tables are checked
by simulating the exchange in plain Python, so the distributed tests (test_kcp_exchange.py) only
have to prove the transport.

Every table is checked for the seed width's H = 3 and, against the same brute force, for every
H = W - 1 of the widths 2..8 (``LayoutPlanner.plans``), with the peer links of H = 7 covering the
messages of every H.

Shape legend: T global tokens, S local rows, C channels, D segments, H = W - 1 halo rows (3 for
the seed width), P ranks.
"""

from __future__ import annotations

import random

import pytest
import torch

from cakeconv.cake_causal_conv1d_det_train_backend.kcp.plan import (
    HALO_ROWS,
    LAYOUTS,
    MAX_HALO_ROWS,
    LayoutPlanner,
    build_rank_plans,
    build_rank_plans_per_halo,
    layout_fragments,
    normalize_cu_seqlens,
    validate_fragments,
)

H = HALO_ROWS


# ---------------------------------------------------------------------------------------------
# Independent brute-force definitions
# ---------------------------------------------------------------------------------------------


def random_cu_seqlens(rng: random.Random, num_docs: int, max_len: int) -> list[int]:
    """Packed batch with empty documents and 1..3-token documents mixed with longer ones."""
    cu = [0]
    for _ in range(num_docs):
        kind = rng.random()
        if kind < 0.15:
            length = 0
        elif kind < 0.5:
            length = rng.randint(1, 3)
        else:
            length = rng.randint(1, max_len)
        cu.append(cu[-1] + length)
    return cu


def random_fragments(rng: random.Random, total_tokens: int, world_size: int) -> list[list[tuple[int, int]]]:
    """Cut [0, T) into spans of 1..5 tokens (many 1- and 2-token ones), deal them to random ranks
    and shuffle each rank's local order. Some ranks may get nothing."""
    spans = []
    pos = 0
    while pos < total_tokens:
        length = rng.choice([1, 1, 2, 2, 3, 4, 5])
        spans.append((pos, min(total_tokens, pos + length)))
        pos += length
    fragments = [[] for _ in range(world_size)]
    for span in spans:
        fragments[rng.randrange(world_size)].append(span)
    for rank_spans in fragments:
        rng.shuffle(rank_spans)
    return fragments


def doc_bounds(cu: list[int], token: int) -> tuple[int, int]:
    """(start, stop) of the non-empty document holding ``token``, by a linear scan."""
    for d in range(len(cu) - 1):
        if cu[d] <= token < cu[d + 1]:
            return cu[d], cu[d + 1]
    raise AssertionError(f"token {token} is in no document")


def brute_force_plan(cu: list[int], fragments, h: int = H) -> list[dict]:
    """Per rank: local tokens, segments as (first token, stop token), hist and fut source tables
    of ``h`` halo rows."""
    owner = {}
    local_tokens = []
    for r, rank_spans in enumerate(fragments):
        tokens = []
        for start, stop in rank_spans:
            for t in range(start, stop):
                owner[t] = (r, len(tokens))
                tokens.append(t)
        local_tokens.append(tokens)
    plans = []
    for r, rank_spans in enumerate(fragments):
        segments = []
        for start, stop in rank_spans:
            for t in range(start, stop):
                if t == start or doc_bounds(cu, t)[0] == t:
                    segments.append([t, t + 1])
                else:
                    segments[-1][1] = t + 1
        hist, fut = [], []
        for first, stop in segments:
            ds, de = doc_bounds(cu, first)
            hist.append([list(owner[u]) if u >= ds else [-1, -1] for u in range(first - h, first)])
            fut.append([list(owner[u]) if u < de else [-1, -1] for u in range(stop, stop + h)])
        plans.append(dict(tokens=local_tokens[r], segments=segments, hist=hist, fut=fut))
    return plans


def simulate_exchange(plans, kind: str, source_by_rank: list[torch.Tensor], h: int = H) -> list[torch.Tensor]:
    """Run every rank's HaloTables in one process: pack, pass the messages, fill the slots.

    ``source_by_rank[q]``: the rows rank q sends from and reads itself from (history: its local x
    rows; future: g of its ``fut.g_rows``, i.e. the ``local`` array of HaloTables).
    """
    sent = {}  # (sender, receiver) -> rows
    for plan in plans:
        tables = getattr(plan, kind)
        packed = source_by_rank[plan.rank][tables.send_rows]
        off = 0
        for peer, n in tables.sends:
            sent[(plan.rank, peer)] = packed[off:off + n]
            off += n
        assert off == packed.shape[0]
    buffers = []
    for plan in plans:
        tables = getattr(plan, kind)
        local = source_by_rank[plan.rank]
        recv = torch.cat([sent.pop((peer, plan.rank)) for peer, _ in tables.recvs]) if tables.recvs else local[:0]
        assert recv.shape[0] == tables.num_recv
        buf = torch.zeros((plan.num_segments * h,) + tuple(local.shape[1:]), dtype=local.dtype)
        m = tables.map
        buf[m >= 0] = local[m[m >= 0]]
        buf[m <= -2] = recv[-2 - m[m <= -2]]
        buffers.append(buf)
    assert not sent, f"messages nobody receives: {sorted(sent)}"
    return buffers


def check_plans(cu: list[int], fragments, h: int = H, plans=None) -> None:
    """Every table of every rank (``plans``, default ``build_rank_plans``; ``h`` halo rows) against
    the brute force, and the exchange specs by simulation."""
    plans = build_rank_plans(cu, fragments) if plans is None else plans
    expected = brute_force_plan(cu, fragments, h)
    world_size = len(fragments)
    assert len(plans) == world_size
    for plan, exp in zip(plans, expected):
        r = plan.rank
        assert plan.world_size == world_size
        assert plan.local_token_indices.dtype == torch.int64
        assert plan.local_token_indices.tolist() == exp["tokens"]
        assert plan.num_local_tokens == len(exp["tokens"])
        assert plan.local_cu_seqlens.dtype == torch.int32
        lengths = [stop - first for first, stop in exp["segments"]]
        cu_local = [0]
        for length in lengths:
            cu_local.append(cu_local[-1] + length)
        assert plan.local_cu_seqlens.tolist() == cu_local, f"rank {r}"
        assert plan.num_segments == len(exp["segments"])
        assert plan.halo_rows == h
        assert plan.hist_src.shape == (plan.num_segments, h, 2) and plan.hist_src.dtype == torch.int64
        assert plan.fut_src.shape == (plan.num_segments, h, 2) and plan.fut_src.dtype == torch.int64
        assert plan.hist_src.tolist() == exp["hist"], f"rank {r}"
        assert plan.fut_src.tolist() == exp["fut"], f"rank {r}"

    # g_rows: the rows of each rank named by anybody's fut table (sent rows first, then the
    # rows it reads itself); every named row is there.
    for plan in plans:
        named = sorted({row for exp in expected for seg in exp["fut"] for (q, row) in seg if q == plan.rank})
        assert plan.fut.g_rows.dtype == torch.int64
        assert sorted(set(plan.fut.g_rows.tolist())) == named
        assert plan.hist.g_rows.numel() == 0

    # Message structure: peers increasing, self excluded, pairwise message lengths agree.
    for kind in ("hist", "fut"):
        for plan in plans:
            tables = getattr(plan, kind)
            for messages in (tables.sends, tables.recvs):
                peers = [q for q, _ in messages]
                assert peers == sorted(set(peers)) and plan.rank not in peers
                assert all(n > 0 for _, n in messages)
            assert tables.map.shape == (plan.num_segments * h,)
            for q, n in tables.sends:
                assert dict(getattr(plans[q], kind).recvs)[plan.rank] == n
            for q, n in tables.recvs:
                assert dict(getattr(plans[q], kind).sends)[plan.rank] == n

    # Boundary rows: the first (last) min(h, length) rows of every segment with a history
    # (look-ahead) row, in local rows, ascending.
    for plan, exp in zip(plans, expected):
        fwd, bwd, row = [], [], 0
        for (first, stop), hist, fut in zip(exp["segments"], exp["hist"], exp["fut"]):
            n = min(h, stop - first)
            if any(q >= 0 for q, _ in hist):
                fwd += range(row, row + n)
            if any(q >= 0 for q, _ in fut):
                bwd += range(row + stop - first - n, row + stop - first)
            row += stop - first
        assert plan.fix_fwd_rows.tolist() == sorted(fwd) and plan.fix_bwd_rows.tolist() == sorted(bwd), f"rank {plan.rank}"

    # Simulated exchange: history of x rows, future of g rows; x[t] = t + 1, g[t] = -(t + 1).
    x_by_rank = [(p.local_token_indices + 1).double()[:, None] * torch.tensor([[1.0, 10.0]]) for p in plans]
    g_by_rank = [-(p.local_token_indices[p.fut.g_rows] + 1).double()[:, None] * torch.tensor([[1.0, 10.0]]) for p in plans]
    hist_bufs = simulate_exchange(plans, "hist", x_by_rank, h)
    fut_bufs = simulate_exchange(plans, "fut", g_by_rank, h)
    for plan, exp, hist, fut in zip(plans, expected, hist_bufs, fut_bufs):
        want_hist, want_fut = [], []
        for first, stop in exp["segments"]:
            ds, de = doc_bounds(cu, first)
            want_hist += [float(u + 1) if u >= ds else 0.0 for u in range(first - h, first)]
            want_fut += [-float(u + 1) if u < de else 0.0 for u in range(stop, stop + h)]
        assert hist[:, 0].tolist() == want_hist, f"rank {plan.rank}"
        assert fut[:, 0].tolist() == want_fut, f"rank {plan.rank}"
        assert torch.equal(hist[:, 1], hist[:, 0] * 10) and torch.equal(fut[:, 1], fut[:, 0] * 10)


# ---------------------------------------------------------------------------------------------
# Layouts
# ---------------------------------------------------------------------------------------------

# Grid rationale: P = 1 (degenerate zigzag: chunks 0 and 1 on one rank), 2, 3 (odd), 4, 8; the
# batches mix empty documents, 1-token documents and documents spanning several ranks.
LAYOUT_CASES = [
    (1, [0, 4, 4, 10, 12]),
    (2, [0, 8, 8, 16, 24]),
    (3, [0, 6, 18, 24, 24, 36]),
    (4, [0, 8, 16, 16, 24, 40, 48]),
    (8, [0, 16, 32, 48]),
]


def tiles_once(fragments, total_tokens: int) -> bool:
    covered = sorted(t for rank_spans in fragments for start, stop in rank_spans for t in range(start, stop))
    return covered == list(range(total_tokens))


@pytest.mark.parametrize("world_size, cu", LAYOUT_CASES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_layout_fragments_tile_and_plans(layout, world_size, cu):
    fragments = layout_fragments(cu, world_size, layout)
    assert len(fragments) == world_size
    assert tiles_once(fragments, cu[-1])
    validate_fragments(fragments, cu[-1], world_size)
    check_plans(cu, fragments)


@pytest.mark.parametrize("world_size, cu", LAYOUT_CASES)
def test_contiguous_formula(world_size, cu):
    total = cu[-1]
    part = total // world_size
    fragments = layout_fragments(cu, world_size, "contiguous")
    for r, plan in enumerate(build_rank_plans(cu, fragments)):
        assert fragments[r] == [(r * part, (r + 1) * part)]
        assert plan.local_token_indices.tolist() == list(range(r * part, (r + 1) * part))


@pytest.mark.parametrize("world_size, cu", LAYOUT_CASES)
def test_zigzag_formula(world_size, cu):
    total = cu[-1]
    chunk = total // (2 * world_size)
    fragments = layout_fragments(cu, world_size, "zigzag")
    plans = build_rank_plans(cu, fragments)
    for r, plan in enumerate(plans):
        back = 2 * world_size - 1 - r
        assert fragments[r] == [(r * chunk, (r + 1) * chunk), (back * chunk, (back + 1) * chunk)]
        # local -> global, as KCP_RESEARCH.md 1.2 states it
        want = [r * chunk + i if i < chunk else back * chunk + (i - chunk) for i in range(2 * chunk)]
        assert plan.local_token_indices.tolist() == want
        # global -> owner
        for g in range(total):
            k = g // chunk
            owner = min(k, 2 * world_size - 1 - k)
            row = g % chunk + chunk * (k >= world_size)
            if owner == r:
                assert plan.local_token_indices[row] == g


def test_zigzag_last_rank_reads_its_own_front_part():
    # One document over P = 4 ranks, chunk 4: rank 3 holds chunks 3 and 4 (adjacent tokens 12..19).
    cu = [0, 32]
    plans = build_rank_plans(cu, layout_fragments(cu, 4, "zigzag"))
    last = plans[3]
    assert last.local_cu_seqlens.tolist() == [0, 4, 8]  # forced cut between the two parts
    # back part (first token 16) reads tokens 13, 14, 15 = its own front rows 1, 2, 3
    assert last.hist_src[1].tolist() == [[3, 1], [3, 2], [3, 3]]
    assert last.hist.map.tolist()[3:6] == [1, 2, 3]  # slots 3..5 from its own rows 1..3
    # front part of rank 1 (tokens 4..7) reads rank 0's front; back part of rank 1 (tokens 24..27)
    # reads rank 2's back part (tokens 21, 22, 23 = rank 2 rows 5, 6, 7)
    assert plans[1].hist_src[0].tolist() == [[0, 1], [0, 2], [0, 3]]
    assert plans[1].hist_src[1].tolist() == [[2, 5], [2, 6], [2, 7]]


@pytest.mark.parametrize("world_size, cu", LAYOUT_CASES)
def test_zigzag_per_document_formula(world_size, cu):
    fragments = layout_fragments(cu, world_size, "zigzag_per_document")
    plans = build_rank_plans(cu, fragments)
    for r, plan in enumerate(plans):
        # TransformerEngine's THD index formula, rank-major over documents.
        want = []
        for s in range(len(cu) - 1):
            local_len = (cu[s + 1] - cu[s]) // world_size
            for i in range(local_len):
                offset = r if i < local_len // 2 else 2 * world_size - 2 - r
                want.append(i + cu[s] + (local_len // 2) * offset)
        assert plan.local_token_indices.tolist() == want


def test_zigzag_per_document_short_documents_are_multi_hop():
    # L = 2P = 8 for P = 4: 1-token chunks, so a halo of 3 rows spans 3 chunks on 3 ranks.
    cu = [0, 8, 8, 16]
    fragments = layout_fragments(cu, 4, "zigzag_per_document")
    assert fragments[0] == [(0, 1), (7, 8), (8, 9), (15, 16)]
    assert fragments[3] == [(3, 4), (4, 5), (11, 12), (12, 13)]
    check_plans(cu, fragments)
    plans = build_rank_plans(cu, fragments)
    # rank 3, second segment (token 4): tokens 1, 2, 3 on ranks 1, 2 and itself
    assert plans[3].hist_src[1].tolist() == [[1, 0], [2, 0], [3, 0]]
    # rank 0, second segment (token 7): tokens 4, 5, 6 on ranks 3, 2, 1 (back parts)
    assert plans[0].hist_src[1].tolist() == [[3, 1], [2, 1], [1, 1]]


@pytest.mark.parametrize(
    "layout, world_size, cu, pattern",
    [
        ("contiguous", 3, [0, 5, 10], r"T % P == 0.*T = 10.*P = 3"),
        ("zigzag", 2, [0, 6], r"T % \(2\*P\) == 0.*T = 6.*P = 2"),
        ("zigzag", 3, [0, 3, 9], r"T % \(2\*P\) == 0.*T = 9"),
        ("zigzag_per_document", 2, [0, 4, 4, 10, 14], r"divisible.*2\*P = 4.*document 2 of length 6"),
    ],
)
def test_divisibility_errors_name_the_length(layout, world_size, cu, pattern):
    with pytest.raises(ValueError, match=pattern):
        layout_fragments(cu, world_size, layout)


def test_unknown_layout_lists_the_valid_ones():
    with pytest.raises(ValueError, match="ring.*contiguous, zigzag, zigzag_per_document"):
        layout_fragments([0, 8], 2, "ring")


def test_empty_batch_and_empty_documents():
    for layout in LAYOUTS:
        fragments = layout_fragments([0], 3, layout)
        assert fragments == [[], [], []]
        for plan in build_rank_plans([0], fragments):
            assert plan.local_token_indices.numel() == 0
            assert plan.local_cu_seqlens.tolist() == [0]
            assert plan.hist_src.shape == (0, H, 2) and plan.fut_src.shape == (0, H, 2)
            assert plan.hist.sends == plan.hist.recvs == () and plan.fut.g_rows.numel() == 0
    # only empty documents between real ones: they contribute nothing and cut nothing
    cu = [0, 0, 4, 4, 4, 8, 8]
    assert layout_fragments(cu, 2, "zigzag_per_document") == [[(0, 1), (3, 4), (4, 5), (7, 8)], [(1, 2), (2, 3), (5, 6), (6, 7)]]
    check_plans(cu, layout_fragments(cu, 2, "zigzag_per_document"))


# ---------------------------------------------------------------------------------------------
# Fragment validation and cu_seqlens
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fragments, pattern",
    [
        ([[(0, 4)], [(3, 8)]], r"overlap.*\(0, 4\) of rank 0.*\(3, 8\) of rank 1"),
        ([[(0, 4), (2, 3)], [(4, 8)]], r"overlap.*\(0, 4\).*\(2, 3\)"),
        ([[(0, 3)], [(4, 8)]], r"gap.*\[3, 4\)"),
        ([[(0, 3)], [(3, 7)]], r"gap.*\[7, 8\)"),
        ([[], [(1, 8)]], r"gap.*\[0, 1\)"),
        ([[(0, 4), (4, 4)], [(4, 8)]], r"empty or reversed span \(4, 4\)"),
        ([[(0, 4)], [(8, 4)]], r"empty or reversed span \(8, 4\)"),
        ([[(0, 4)], [(4, 9)]], r"\(4, 9\) outside \[0, T\) with T = 8"),
        ([[(0, 8)]], r"1 rank entries.*2 ranks"),
        ([[(0, 4)], [(4, "8")]], r"not a pair of ints"),
    ],
)
def test_validate_fragments_errors(fragments, pattern):
    with pytest.raises(ValueError, match=pattern):
        validate_fragments(fragments, 8, 2)


def test_validate_fragments_normalizes():
    table = validate_fragments([[[4, 8], (0, 2)], [(2, 4)]], 8, 2)
    assert table == (((4, 8), (0, 2)), ((2, 4),))


@pytest.mark.parametrize(
    "cu, pattern",
    [
        (torch.tensor([[0, 4]]), r"1-D.*\(1, 2\)"),
        (torch.tensor([0.0, 4.0]), r"integer.*float32"),
        (torch.tensor([1, 4]), r"start at 0.*1"),
        (torch.tensor([0, 5, 3]), r"non-decreasing.*cu_seqlens\[1\] = 5 > cu_seqlens\[2\] = 3"),
        ([], r"at least one value"),
    ],
)
def test_cu_seqlens_errors(cu, pattern):
    with pytest.raises(ValueError, match=pattern):
        normalize_cu_seqlens(cu)


# ---------------------------------------------------------------------------------------------
# Random packed batches, explicit fragments (multi-hop)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 8])
def test_random_fragments_against_brute_force(world_size):
    rng = random.Random(1234 + world_size)
    for _ in range(12):
        cu = random_cu_seqlens(rng, num_docs=rng.randint(1, 8), max_len=14)
        check_plans(cu, random_fragments(rng, cu[-1], world_size))


def test_document_spanning_all_ranks_one_token_each():
    # T = 4, P = 4, one document: rank 3's history comes from ranks 0, 1, 2 (three hops).
    cu = [0, 4]
    plans = build_rank_plans(cu, layout_fragments(cu, 4, "contiguous"))
    assert plans[3].hist_src.tolist() == [[[0, 0], [1, 0], [2, 0]]]
    assert plans[0].fut_src.tolist() == [[[1, 0], [2, 0], [3, 0]]]
    assert plans[1].hist_src.tolist() == [[[-1, -1], [-1, -1], [0, 0]]]
    assert [q for q, _ in plans[1].hist.recvs] == [0] and [q for q, _ in plans[1].hist.sends] == [2, 3]
    assert plans[1].hist.map.tolist() == [-1, -1, -2]  # slot 2 is the first row received
    check_plans(cu, layout_fragments(cu, 4, "contiguous"))


def test_adjacent_fragments_of_one_rank_are_separate_segments():
    # Rank 0 holds (0, 2) then (2, 5): two segments, the second reads the first locally.
    cu = [0, 5]
    plan = build_rank_plans(cu, [[(0, 2), (2, 5)]])[0]
    assert plan.local_cu_seqlens.tolist() == [0, 2, 5]
    assert plan.hist_src[1].tolist() == [[-1, -1], [0, 0], [0, 1]]
    assert plan.fut_src[0].tolist() == [[0, 2], [0, 3], [0, 4]]
    assert plan.fut.g_rows.tolist() == [2, 3, 4] and plan.fut.sends == ()
    assert plan.fut.map.tolist()[:3] == [0, 1, 2]  # segment 0's future: g of its own rows 2..4


def test_plan_to_device_keeps_values():
    cu = [0, 3, 9]
    plan = build_rank_plans(cu, layout_fragments(cu, 3, "contiguous"))[1]
    moved = plan.to("meta")  # another device: every table moves, the host figures stay
    for name, table in plan.device_tables().items():
        assert moved.device_tables()[name].device.type == "meta" and table.device.type == "cpu", name
        assert moved.device_tables()[name].shape == table.shape, name
    assert moved.hist.sends == plan.hist.sends and moved.fut.recvs == plan.fut.recvs
    assert moved.hist_src.device.type == "meta" and moved.num_segments == plan.num_segments
    back = plan.to(torch.device("cpu"))
    assert torch.equal(back.hist.map, plan.hist.map) and torch.equal(back.fut.g_rows, plan.fut.g_rows)


# ---------------------------------------------------------------------------------------------
# Every width: H = W - 1 for W = 2..8
# ---------------------------------------------------------------------------------------------


def _peers(messages) -> set[int]:
    return {q for q, _ in messages}


@pytest.mark.parametrize("world_size", [1, 2, 3, 8])
def test_every_halo_size_against_brute_force(world_size):
    """Random batches and fragments (many 1-token ones, so halos of 7 rows span many fragments and
    ranks): the plans of every H against the brute force; the peer links of H = 7 are the union
    of H = 7's message peers and cover every H's."""
    rng = random.Random(77 + world_size)
    for _ in range(3):
        cu = random_cu_seqlens(rng, num_docs=rng.randint(1, 8), max_len=20)
        fragments = random_fragments(rng, cu[-1], world_size)
        planner = LayoutPlanner(cu, fragments)
        links = planner.peer_links()
        for h in range(1, MAX_HALO_ROWS + 1):
            plans = planner.plans(h)
            check_plans(cu, fragments, h, plans)
            for plan, link in zip(plans, links):
                for tables in (plan.hist, plan.fut):
                    assert _peers(tables.sends) <= _peers(link.sends) and _peers(tables.recvs) <= _peers(link.recvs)
        for plan, link in zip(planner.plans(MAX_HALO_ROWS), links):
            assert _peers(link.sends) == _peers(plan.hist.sends) | _peers(plan.fut.sends)
            assert _peers(link.recvs) == _peers(plan.hist.recvs) | _peers(plan.fut.recvs)
            assert all(n == 1 for _, n in link.sends + link.recvs) and link.send_rows.numel() == len(link.sends)


def test_width_8_one_token_per_rank_spans_seven_ranks():
    # T = 8, P = 8, one document, rank r holds token r: rank 7's history comes from ranks 0..6.
    cu = [0, 8]
    plans = build_rank_plans(cu, layout_fragments(cu, 8, "contiguous"), halo_rows=7)
    assert plans[7].hist_src.tolist() == [[[q, 0] for q in range(7)]]
    assert plans[0].fut_src.tolist() == [[[q, 0] for q in range(1, 8)]]
    assert [q for q, _ in plans[7].hist.recvs] == list(range(7)) and plans[7].fix_fwd_rows.tolist() == [0]
    assert [q for q, _ in plans[3].hist.sends] == [4, 5, 6, 7] and [q for q, _ in plans[3].fut.sends] == [0, 1, 2]
    check_plans(cu, layout_fragments(cu, 8, "contiguous"), 7, plans)


def test_plans_per_halo_share_the_segments():
    cu = [0, 5, 12]
    by_rank = build_rank_plans_per_halo(cu, [[(0, 2), (7, 12)], [(2, 7)]], (1, 3, 7))
    for by_h in by_rank:
        assert sorted(by_h) == [1, 3, 7] and all(p.halo_rows == h for h, p in by_h.items())
        assert by_h[1].local_cu_seqlens is by_h[7].local_cu_seqlens
        assert by_h[3].local_token_indices is by_h[7].local_token_indices


@pytest.mark.parametrize("halo_rows", [0, 8, -1])
def test_halo_rows_outside_the_widths_raise(halo_rows):
    with pytest.raises(ValueError, match=f"halo_rows must be in 1..7.*got {halo_rows}"):
        build_rank_plans([0, 4], [[(0, 4)]], halo_rows=halo_rows)
