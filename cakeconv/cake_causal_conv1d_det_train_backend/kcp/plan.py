"""Host-side planning for the context-parallel ("KCP") causal conv1d: layouts, segments, halo tables.

Everything here runs once, on the CPU, with plain Python and torch; nothing touches
torch.distributed. Every rank computes the same global tables from the same global inputs
(``cu_seqlens`` and the fragment table) and keeps its own ``RankPlan``. The tables are later moved
to the device (``RankPlan.to``) so that the forward and backward run with no host work.

Vocabulary:
- fragment: a ``(start, stop)`` span of global tokens held by one rank; a rank's fragments, in its
  local order, are its local rows.
- segment: a maximal run of local rows that are consecutive global tokens within one fragment AND
  one document. ``local_cu_seqlens`` cuts the local rows into segments; the conv treats each
  segment as a "document" whose 3 history rows come from the halo instead of zeros.
- halo: the ``H = 3`` rows before a segment (history, for the forward) and the 3 rows after it
  (future, for the backward), only inside the segment's document. They may live on any rank,
  including this one, and may span several fragments ("multi-hop") when fragments are shorter
  than 3 tokens.

Slot layout of the halo buffers (what the kernels index):
    slot = d * H + j        (d: segment, j in 0..H-1)
    history slot (d, j) holds global token  first_token(d) - H + j   (j = H-1 is the row just before)
    future  slot (d, j) holds global token  stop_token(d) + j        (j = 0 is the row just after)
A slot whose token lies outside the segment's document (or outside [0, T)) is -1 in the tables
and zero in the exchanged buffer.

Shape legend (tensor-name suffixes):
    T  global tokens          P  ranks (world size)       N  documents
    S  S_local, local rows    C  channels                 D  n_seg, local segments
    H  halo rows (3)          F  n_fut, rows of this rank sent as future rows
    K  a peer's message length
"""

from __future__ import annotations

import bisect
import dataclasses
import operator
from typing import Sequence

import torch

HALO_ROWS = 3
"""H = W - 1 for the width-4 conv."""

LAYOUTS = ("contiguous", "zigzag", "zigzag_per_document")
"""Names accepted by ``layout_fragments``."""

Fragments = tuple[tuple[tuple[int, int], ...], ...]
"""Per rank, its ``(start, stop)`` global token spans in local order."""


# --------------------------------------------------------------------------------------------
# cu_seqlens and fragment tables
# --------------------------------------------------------------------------------------------


def normalize_cu_seqlens(cu_seqlens) -> list[int]:
    """Return the global document boundaries as a list of Python ints, validated.

    Args:
        cu_seqlens: 1-D integer tensor (any device) or sequence of ints: ``0 = cu[0] <= cu[1] <=
            ... <= cu[N] = T``. Repeated values (empty documents) are allowed.

    Raises:
        ValueError: not 1-D, not integer, empty, not starting at 0, or decreasing.
    """
    if isinstance(cu_seqlens, torch.Tensor):
        if cu_seqlens.dim() != 1:
            raise ValueError(f"cu_seqlens must be 1-D, got shape {tuple(cu_seqlens.shape)}")
        if cu_seqlens.dtype.is_floating_point or cu_seqlens.dtype.is_complex or cu_seqlens.dtype == torch.bool:
            raise ValueError(f"cu_seqlens must be an integer tensor, got dtype {cu_seqlens.dtype}")
        values = [int(v) for v in cu_seqlens.tolist()]
    else:
        try:
            values = [operator.index(v) for v in cu_seqlens]
        except TypeError as exc:
            raise ValueError(f"cu_seqlens must be a 1-D sequence of ints, got {cu_seqlens!r}") from exc
    if len(values) == 0:
        raise ValueError("cu_seqlens must have at least one value (cu_seqlens[0] = 0), got []")
    if values[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0, got cu_seqlens[0] = {values[0]}")
    for i in range(1, len(values)):
        if values[i] < values[i - 1]:
            raise ValueError(
                f"cu_seqlens must be non-decreasing, got cu_seqlens[{i - 1}] = {values[i - 1]} > "
                f"cu_seqlens[{i}] = {values[i]}"
            )
    return values


def layout_fragments(cu_seqlens: Sequence[int], world_size: int, layout: str) -> list[list[tuple[int, int]]]:
    """Fragment table of a named layout (P ranks, T = cu_seqlens[-1] global tokens).

    - ``contiguous``: needs ``T % P == 0``; rank r holds ``[r*T/P, (r+1)*T/P)``.
    - ``zigzag``: needs ``T % 2P == 0``; with ``c = T/2P``, rank r holds chunk r then chunk
      ``2P-1-r`` of the whole stream.
    - ``zigzag_per_document``: needs every document length ``L_d % 2P == 0``; each document is
      cut into 2P chunks and rank r holds, for each document in order, its chunk r then its chunk
      ``2P-1-r`` (rank-major, as TransformerEngine's THD format). Empty documents contribute
      nothing.

    Zero-length spans are left out, so a rank may hold no fragment at all (e.g. T = 0).

    Returns:
        ``fragments[r]`` = list of ``(start, stop)`` spans of rank r, in local order.

    Raises:
        ValueError: unknown layout, ``world_size < 1``, or a divisibility failure (naming the rule
            and the offending length: T, or the document's index and length).
    """
    cu = normalize_cu_seqlens(cu_seqlens)
    world_size = operator.index(world_size)
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    num_tokens = cu[-1]
    num_ranks = world_size
    fragments: list[list[tuple[int, int]]] = [[] for _ in range(num_ranks)]

    def add(rank: int, start: int, stop: int) -> None:
        if start < stop:
            fragments[rank].append((start, stop))

    if layout == "contiguous":
        if num_tokens % num_ranks != 0:
            raise ValueError(
                f"contiguous layout needs T % P == 0, got T = {num_tokens} tokens for P = {num_ranks} ranks"
            )
        part = num_tokens // num_ranks
        for r in range(num_ranks):
            add(r, r * part, (r + 1) * part)
    elif layout == "zigzag":
        if num_tokens % (2 * num_ranks) != 0:
            raise ValueError(
                f"zigzag layout needs T % (2*P) == 0, got T = {num_tokens} tokens for P = {num_ranks} "
                f"ranks (2*P = {2 * num_ranks})"
            )
        chunk = num_tokens // (2 * num_ranks)
        for r in range(num_ranks):
            back = 2 * num_ranks - 1 - r
            add(r, r * chunk, (r + 1) * chunk)
            add(r, back * chunk, (back + 1) * chunk)
    elif layout == "zigzag_per_document":
        for d in range(len(cu) - 1):
            length = cu[d + 1] - cu[d]
            if length % (2 * num_ranks) != 0:
                raise ValueError(
                    f"zigzag_per_document layout needs every document length divisible by 2*P = "
                    f"{2 * num_ranks} (P = {num_ranks} ranks), got document {d} of length {length}"
                )
        for r in range(num_ranks):
            back = 2 * num_ranks - 1 - r
            for d in range(len(cu) - 1):
                chunk = (cu[d + 1] - cu[d]) // (2 * num_ranks)
                add(r, cu[d] + r * chunk, cu[d] + (r + 1) * chunk)
                add(r, cu[d] + back * chunk, cu[d] + (back + 1) * chunk)
    else:
        raise ValueError(f"unknown KCP layout {layout!r}; valid layouts are {', '.join(LAYOUTS)}")
    return fragments


def validate_fragments(fragments, total_tokens: int, world_size: int) -> Fragments:
    """Check an explicit fragment table and return it as nested tuples of Python ints.

    Rules: one list per rank (``world_size`` lists); each span is a pair of ints with
    ``0 <= start < stop <= T``; all spans together tile ``[0, T)`` exactly once. A rank may hold
    no span. The local order of a rank's spans is its own choice (any order is valid).

    Raises:
        ValueError: wrong number of ranks, a malformed or empty span, an overlap or a gap (the
            message names the spans, their ranks, or the uncovered range).
    """
    total_tokens = operator.index(total_tokens)
    world_size = operator.index(world_size)
    if isinstance(fragments, (str, bytes)) or not isinstance(fragments, Sequence):
        raise ValueError(f"fragments must be a list (one entry per rank) of lists of (start, stop), got {fragments!r}")
    if len(fragments) != world_size:
        raise ValueError(f"fragments has {len(fragments)} rank entries, but the group has {world_size} ranks")
    table = []
    spans_with_rank = []
    for r, rank_spans in enumerate(fragments):
        if isinstance(rank_spans, (str, bytes)) or not isinstance(rank_spans, Sequence):
            raise ValueError(f"fragments[{r}] must be a list of (start, stop) spans, got {rank_spans!r}")
        rank_table = []
        for span in rank_spans:
            try:
                start, stop = (operator.index(v) for v in span)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"fragments[{r}] has a span {span!r} that is not a pair of ints") from exc
            if not start < stop:
                raise ValueError(f"fragments[{r}] has an empty or reversed span ({start}, {stop}); spans need start < stop")
            if start < 0 or stop > total_tokens:
                raise ValueError(
                    f"fragments[{r}] has a span ({start}, {stop}) outside [0, T) with T = {total_tokens}"
                )
            rank_table.append((start, stop))
            spans_with_rank.append((start, stop, r))
        table.append(tuple(rank_table))
    spans_with_rank.sort()
    covered = 0
    prev = None
    for start, stop, r in spans_with_rank:
        if start < covered:
            raise ValueError(
                f"fragments overlap: span ({prev[0]}, {prev[1]}) of rank {prev[2]} and span ({start}, {stop}) "
                f"of rank {r}"
            )
        if start > covered:
            raise ValueError(f"fragments leave a gap: tokens [{covered}, {start}) belong to no rank")
        covered = stop
        prev = (start, stop, r)
    if covered != total_tokens:
        raise ValueError(f"fragments leave a gap: tokens [{covered}, {total_tokens}) belong to no rank")
    return tuple(table)


# --------------------------------------------------------------------------------------------
# Plans
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class ExchangeSpec:
    """One rank's part of a halo exchange, fully indexed so the exchange does no host work.

    The exchange moves rows of a per-rank ``values[num_values, C]`` array into a per-rank
    ``buffer[num_slots, C]`` (``num_slots = n_seg * H``, slot = d * H + j); every slot is filled
    from exactly one (rank, row) source or left zero.

    Fields:
        rank: this rank (in the group).
        num_values: rows of the values array this rank sends from (S_local for the history
            exchange, n_fut = len(fut_rows) for the future exchange).
        num_slots: rows of the buffer this rank receives into (n_seg * H).
        peers: other ranks this rank sends to or receives from, increasing; both dicts below have
            a (possibly empty) entry for every peer.
        send_idx: ``send_idx[q]`` int64 [K]: rows of this rank's values array to send to q, in the
            order q lists them in its ``recv_slot[rank]``.
        recv_slot: ``recv_slot[q]`` int64 [K]: this rank's buffer slots filled by q's message, in
            message order (ascending slot).
        self_src_idx: int64 [K]: rows of this rank's own values array copied locally ...
        self_dst_slot: int64 [K]: ... into these slots (ascending).
    """

    rank: int
    num_values: int
    num_slots: int
    peers: tuple[int, ...]
    send_idx: dict[int, torch.Tensor]
    recv_slot: dict[int, torch.Tensor]
    self_src_idx: torch.Tensor
    self_dst_slot: torch.Tensor

    def to(self, device) -> "ExchangeSpec":
        """A copy with every index tensor on ``device``."""
        return dataclasses.replace(
            self,
            send_idx={q: t.to(device) for q, t in self.send_idx.items()},
            recv_slot={q: t.to(device) for q, t in self.recv_slot.items()},
            self_src_idx=self.self_src_idx.to(device),
            self_dst_slot=self.self_dst_slot.to(device),
        )


@dataclasses.dataclass(frozen=True, eq=False)
class RankPlan:
    """Everything one rank needs for the KCP forward and backward, computed on the host.

    Fields (CPU tensors until ``to(device)``):
        rank, world_size: this rank and P.
        num_local_tokens: S_local.
        num_segments: n_seg.
        local_token_indices: int64 [S]: global token of each local row, in local order.
        local_cu_seqlens: int32 [n_seg + 1]: segment boundaries in local rows (``[0]`` if S = 0).
        hist_src: int64 [n_seg, H, 2]: ``(owner_rank, owner_local_row)`` of global token
            ``first_token(d) - H + j``, or ``(-1, -1)`` when that token is before the segment's
            document start.
        fut_src: int64 [n_seg, H, 2]: ``(owner_rank, owner_local_row)`` of global token
            ``stop_token(d) + j``, or ``(-1, -1)`` when that token is at or past the document end.
        fut_rows: int64 [n_fut]: sorted unique local rows of this rank named as ``(rank, row)`` in
            any rank's ``fut_src`` (this rank included). The future exchange sends rows of
            ``g_send[n_fut, C]`` with ``g_send[i]`` = FP32 gradient of the pre-activation of local
            row ``fut_rows[i]``.
        hist_exchange: ExchangeSpec whose values are rows of ``x_local[S, C]``; the receive buffer
            ``hist[n_seg * H, C]`` holds slot ``d*H + j`` = the token named by ``hist_src[d, j]``.
        fut_exchange: ExchangeSpec whose values are rows of ``g_send[n_fut, C]``; the receive
            buffer ``fut[n_seg * H, C]`` holds slot ``d*H + j`` = g of the token named by
            ``fut_src[d, j]``.
    """

    rank: int
    world_size: int
    num_local_tokens: int
    num_segments: int
    local_token_indices: torch.Tensor
    local_cu_seqlens: torch.Tensor
    hist_src: torch.Tensor
    fut_src: torch.Tensor
    fut_rows: torch.Tensor
    hist_exchange: ExchangeSpec
    fut_exchange: ExchangeSpec

    def to(self, device) -> "RankPlan":
        """A copy with every tensor (tables and exchange specs) on ``device``."""
        return dataclasses.replace(
            self,
            local_token_indices=self.local_token_indices.to(device),
            local_cu_seqlens=self.local_cu_seqlens.to(device),
            hist_src=self.hist_src.to(device),
            fut_src=self.fut_src.to(device),
            fut_rows=self.fut_rows.to(device),
            hist_exchange=self.hist_exchange.to(device),
            fut_exchange=self.fut_exchange.to(device),
        )


def _segments_of_rank(cu: list[int], rank_spans) -> tuple[list[int], list[int], list[int], list[int]]:
    """Cut a rank's fragments at document boundaries.

    Returns four lists over segments: global start, global stop, document start, document stop.
    """
    seg_start, seg_stop, doc_start, doc_stop = [], [], [], []
    for start, stop in rank_spans:
        pos = start
        while pos < stop:
            # Document containing token `pos`: the last d with cu[d] <= pos (skips empty documents).
            d = bisect.bisect_right(cu, pos) - 1
            end = min(stop, cu[d + 1])
            seg_start.append(pos)
            seg_stop.append(end)
            doc_start.append(cu[d])
            doc_stop.append(cu[d + 1])
            pos = end
    return seg_start, seg_stop, doc_start, doc_stop


def _owners(tok_DH: torch.Tensor, valid_DH: torch.Tensor, owner_rank_T: torch.Tensor, owner_row_T: torch.Tensor) -> torch.Tensor:
    """int64 [D, H, 2]: (owner rank, owner local row) of each valid token, (-1, -1) elsewhere."""
    safe_DH = torch.where(valid_DH, tok_DH, torch.zeros_like(tok_DH))
    src_DH2 = torch.stack([owner_rank_T[safe_DH], owner_row_T[safe_DH]], dim=-1)
    return torch.where(valid_DH[..., None], src_DH2, torch.full_like(src_DH2, -1))


def _build_exchange_specs(src_by_rank: list[torch.Tensor], value_index_by_rank: list[torch.Tensor], num_values: list[int]):
    """Exchange specs of every rank from every receiver's source table.

    Args:
        src_by_rank: per receiver r, int64 [n_slots_r, 2] (owner_rank, owner_row) or (-1, -1).
        value_index_by_rank: per owner q, int64 map from owner local row to its row in q's values
            array (identity for the history exchange, position in fut_rows for the future one).
        num_values: per rank, rows of its values array.
    """
    num_ranks = len(src_by_rank)
    # send[q][r]: rows of q's values array for r; recv[r][q]: r's slots they fill (same order).
    send = [dict() for _ in range(num_ranks)]
    recv = [dict() for _ in range(num_ranks)]
    self_src = [torch.empty(0, dtype=torch.int64) for _ in range(num_ranks)]
    self_dst = [torch.empty(0, dtype=torch.int64) for _ in range(num_ranks)]
    for r, src_K2 in enumerate(src_by_rank):
        # Valid slots grouped by owner, ascending slot order within each owner (stable sort).
        valid_slots = torch.nonzero(src_K2[:, 0] >= 0).flatten()
        owner_valid = src_K2[valid_slots, 0]
        order = torch.sort(owner_valid, stable=True).indices
        grouped_slots = valid_slots[order]
        counts = torch.bincount(owner_valid, minlength=num_ranks).tolist()
        for q, slots_K in zip(range(num_ranks), torch.split(grouped_slots, counts)):
            if slots_K.numel() == 0:
                continue
            rows_K = value_index_by_rank[q][src_K2[slots_K, 1]]
            if q == r:
                self_src[r], self_dst[r] = rows_K, slots_K
            else:
                send[q][r] = rows_K
                recv[r][q] = slots_K
    empty = torch.empty(0, dtype=torch.int64)
    specs = []
    for r in range(num_ranks):
        peers = tuple(sorted(set(send[r]) | set(recv[r])))
        specs.append(
            ExchangeSpec(
                rank=r,
                num_values=num_values[r],
                num_slots=src_by_rank[r].shape[0],
                peers=peers,
                send_idx={q: send[r].get(q, empty) for q in peers},
                recv_slot={q: recv[r].get(q, empty) for q in peers},
                self_src_idx=self_src[r],
                self_dst_slot=self_dst[r],
            )
        )
    return specs


def build_rank_plans(cu_seqlens, fragments) -> list[RankPlan]:
    """Plans of all ranks (``len(fragments)`` of them) from the global boundaries and fragments.

    Deterministic and identical on every rank: each rank may call it and keep
    ``plans[rank]``. Validates both inputs (``normalize_cu_seqlens``, ``validate_fragments``).

    Raises:
        ValueError: bad ``cu_seqlens`` or fragment table.
    """
    cu = normalize_cu_seqlens(cu_seqlens)
    num_tokens = cu[-1]
    table = validate_fragments(fragments, num_tokens, len(fragments))
    num_ranks = len(table)

    # Owner of every global token: rank and local row.
    owner_rank_T = torch.full((num_tokens,), -1, dtype=torch.int64)
    owner_row_T = torch.full((num_tokens,), -1, dtype=torch.int64)
    local_token_indices = []
    for r, rank_spans in enumerate(table):
        start_F = torch.tensor([start for start, _ in rank_spans], dtype=torch.int64)
        length_F = torch.tensor([stop - start for start, stop in rank_spans], dtype=torch.int64)
        num_rows = int(length_F.sum())
        first_row_F = torch.cumsum(length_F, 0) - length_F
        # global token of local row i = start of its fragment + (i - first row of its fragment)
        row_S = torch.arange(num_rows, dtype=torch.int64)
        tokens_S = row_S + torch.repeat_interleave(start_F - first_row_F, length_F)
        owner_rank_T[tokens_S] = r
        owner_row_T[tokens_S] = row_S
        local_token_indices.append(tokens_S)
    assert bool((owner_rank_T >= 0).all()), "validated fragments must cover every token"

    j_H = torch.arange(HALO_ROWS, dtype=torch.int64)
    local_cu, hist_src, fut_src = [], [], []
    for r, rank_spans in enumerate(table):
        seg_start, seg_stop, doc_start, doc_stop = _segments_of_rank(cu, rank_spans)
        lengths_D = torch.tensor([b - a for a, b in zip(seg_start, seg_stop)], dtype=torch.int64)
        cu_D1 = torch.zeros(len(seg_start) + 1, dtype=torch.int64)
        cu_D1[1:] = torch.cumsum(lengths_D, 0)
        local_cu.append(cu_D1.to(torch.int32))
        start_D = torch.tensor(seg_start, dtype=torch.int64)
        stop_D = torch.tensor(seg_stop, dtype=torch.int64)
        doc_start_D = torch.tensor(doc_start, dtype=torch.int64)
        doc_stop_D = torch.tensor(doc_stop, dtype=torch.int64)
        hist_tok_DH = start_D[:, None] - HALO_ROWS + j_H[None, :]
        fut_tok_DH = stop_D[:, None] + j_H[None, :]
        hist_src.append(_owners(hist_tok_DH, hist_tok_DH >= doc_start_D[:, None], owner_rank_T, owner_row_T))
        fut_src.append(_owners(fut_tok_DH, fut_tok_DH < doc_stop_D[:, None], owner_rank_T, owner_row_T))

    # fut_rows[q]: rows of q named by any rank's fut_src; position map row -> index in fut_rows.
    fut_rows, fut_pos = [], []
    all_fut_K2 = torch.cat([f.reshape(-1, 2) for f in fut_src]) if num_ranks else torch.empty(0, 2, dtype=torch.int64)
    for q in range(num_ranks):
        rows_F = torch.unique(all_fut_K2[all_fut_K2[:, 0] == q, 1])  # sorted
        pos_S = torch.full((local_token_indices[q].numel(),), -1, dtype=torch.int64)
        pos_S[rows_F] = torch.arange(rows_F.numel(), dtype=torch.int64)
        fut_rows.append(rows_F)
        fut_pos.append(pos_S)

    identity = [torch.arange(t.numel(), dtype=torch.int64) for t in local_token_indices]
    hist_specs = _build_exchange_specs(
        [h.reshape(-1, 2) for h in hist_src], identity, [t.numel() for t in local_token_indices]
    )
    fut_specs = _build_exchange_specs([f.reshape(-1, 2) for f in fut_src], fut_pos, [f.numel() for f in fut_rows])

    plans = []
    for r in range(num_ranks):
        plans.append(
            RankPlan(
                rank=r,
                world_size=num_ranks,
                num_local_tokens=local_token_indices[r].numel(),
                num_segments=local_cu[r].numel() - 1,
                local_token_indices=local_token_indices[r],
                local_cu_seqlens=local_cu[r],
                hist_src=hist_src[r],
                fut_src=fut_src[r],
                fut_rows=fut_rows[r],
                hist_exchange=hist_specs[r],
                fut_exchange=fut_specs[r],
            )
        )
    return plans
