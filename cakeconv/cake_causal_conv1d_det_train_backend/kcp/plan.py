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
  segment as a "document" whose H history rows come from the halo instead of zeros.
- halo: for a conv of width W, the ``H = W - 1`` rows before a segment (history, for the forward)
  and the H rows after it (future, for the backward), only inside the segment's document. They may
  live on any rank, including this one, and may span several fragments ("multi-hop") when
  fragments are shorter than H tokens. The segments do not depend on W; the halo tables do: a
  ``RankPlan`` holds the tables of one H (``halo_rows``; 3 for the seed width W = 4). A
  ``LayoutPlanner`` does the work every H shares (token owners, segments) once; its ``plans(H)``
  adds one H's tables and ``peer_links(7)`` the pairs of ranks that any width's exchanges use.
  Measured on 8 ranks, T = 524,288 tokens: the shared work 31 ms and about 6 ms per H with 16k
  documents in zigzag, 0.54 s and about 0.2 s per H with 13k documents in zigzag_per_document;
  all seven H cost 2.7 to 3 times H = 3 alone. So the context (context.py) builds H = 3 with
  itself and another H on its first use.

Slot layout of the halo buffers (what the kernels index):
    slot = d * H + j        (d: segment, j in 0..H-1)
    history slot (d, j) holds global token  first_token(d) - H + j   (j = H-1 is the row just before)
    future  slot (d, j) holds global token  stop_token(d) + j        (j = 0 is the row just after)
A slot whose token lies outside the segment's document (or outside [0, T)) is -1 in the tables
and zero in the exchanged buffer.

Shape legend (tensor-name suffixes):
    T  global tokens          P  ranks (world size)       N  documents
    S  S_local, local rows    C  channels                 D  n_seg, local segments
    H  halo rows (W - 1)      F  n_fut, rows of this rank sent as future rows
    K  a peer's message length
"""

from __future__ import annotations

import bisect
import dataclasses
import operator
from typing import Sequence

import torch

from ..constants import HALO_ROWS, MAX_WIDTH  # H = W - 1: 3 for the seed width W = 4

MAX_HALO_ROWS = MAX_WIDTH - 1
"""The largest H a plan is built for (W = 8)."""

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
class HaloTables:
    """One direction (history or future) of a rank's halo exchange, as index tables.

    The exchange moves rows of the ranks' "source" arrays into each rank's halo buffer
    ``halo[D * H, C]`` (slot ``d * H + j``). This rank:

    1. packs the rows it sends, ``send[i] = source[send_rows[i]]``, peer after peer;
    2. sends ``send[off : off + n]`` to each ``(peer, n)`` of ``sends`` (in order, ``off`` the
       running sum) and receives ``recv[off : off + n]`` from each ``(peer, n)`` of ``recvs``;
    3. fills every slot from ``map``: ``m >= 0``: ``local[m]``; ``m <= -2``: ``recv[-2 - m]``;
       ``m == -1``: zero (the token is outside the segment's document).

    The source and ``local`` arrays: history: both are the local x rows ``x[S, C]``. Future: the
    source is the local FP32 g rows, computed only for ``g_rows`` (``local[i]`` = g of local row
    ``g_rows[i]``; the first ``len(send_rows)`` of them are ``send_rows``, then the rows this rank
    reads itself), so ``send_rows`` and the non-negative ``map`` entries index ``local``.

    Between two ranks there is at most one message per direction, whose length and row order both
    ends derive from the same global tables, so sends and receives pair up in any matching order.

    Fields (index tensors int64):
        send_rows: [K_send] rows of the source array to send (history: local rows; future: indices
            into ``local``, i.e. ``0 .. K_send - 1``).
        sends: ``((peer, n), ...)``, ascending peer; n > 0.
        recvs: ``((peer, n), ...)``, ascending peer; n > 0.
        map: [D * H] slot sources as above.
        g_rows: [F] (future only; empty for history) local rows whose g this rank computes.
        send_starts: when every message's rows are consecutive ascending rows of the source,
            the first row of each message (a message is then a slice of the source, no packing
            needed); else None.
    """

    send_rows: torch.Tensor
    sends: tuple[tuple[int, int], ...]
    recvs: tuple[tuple[int, int], ...]
    map: torch.Tensor
    g_rows: torch.Tensor
    send_starts: tuple[int, ...] | None

    @property
    def num_send(self) -> int:
        return sum(n for _, n in self.sends)

    @property
    def num_recv(self) -> int:
        return sum(n for _, n in self.recvs)

    def to(self, device) -> "HaloTables":
        """A copy with every index tensor on ``device``."""
        return dataclasses.replace(self, send_rows=self.send_rows.to(device), map=self.map.to(device),
                                   g_rows=self.g_rows.to(device))


@dataclasses.dataclass(frozen=True, eq=False)
class RankPlan:
    """Everything one rank needs for the KCP forward and backward of one width, on the host.

    The tables serve the convs of width ``W = halo_rows + 1``; the segment fields
    (``local_token_indices``, ``local_cu_seqlens``) are the same for every width.

    Fields (CPU tensors until ``to(device)``):
        rank, world_size: this rank and P (in the process group).
        num_local_tokens: S_local.
        num_segments: D.
        local_token_indices: int64 [S]: global token of each local row, in local order.
        local_cu_seqlens: int32 [D + 1]: segment boundaries in local rows (``[0]`` if S = 0).
        hist_src: int64 [D, H, 2]: ``(owner_rank, owner_local_row)`` of global token
            ``first_token(d) - H + j``, or ``(-1, -1)`` when that token is before the segment's
            document start.
        fut_src: int64 [D, H, 2]: ``(owner_rank, owner_local_row)`` of global token
            ``stop_token(d) + j``, or ``(-1, -1)`` when that token is at or past the document end.
        fix_fwd_rows: int64: the first (up to H) rows of every segment with a history row (their
            taps reach into another fragment): the forward rewrites their y once the halo is in.
        fix_bwd_rows: int64: the last (up to H) rows of every segment with a look-ahead row: the
            backward rewrites their dx once the future halo is in.
        hist: HaloTables of the history exchange (x rows before each segment).
        fut: HaloTables of the future exchange (FP32 g rows after each segment).
        halo_rows: H, the rows of each segment's history and future (W - 1).
    """

    rank: int
    world_size: int
    num_local_tokens: int
    num_segments: int
    local_token_indices: torch.Tensor
    local_cu_seqlens: torch.Tensor
    hist_src: torch.Tensor
    fut_src: torch.Tensor
    fix_fwd_rows: torch.Tensor
    fix_bwd_rows: torch.Tensor
    hist: HaloTables
    fut: HaloTables
    halo_rows: int = HALO_ROWS

    def to(self, device) -> "RankPlan":
        """A copy with every tensor on ``device``."""
        return dataclasses.replace(
            self,
            local_token_indices=self.local_token_indices.to(device),
            local_cu_seqlens=self.local_cu_seqlens.to(device),
            hist_src=self.hist_src.to(device),
            fut_src=self.fut_src.to(device),
            fix_fwd_rows=self.fix_fwd_rows.to(device),
            fix_bwd_rows=self.fix_bwd_rows.to(device),
            hist=self.hist.to(device),
            fut=self.fut.to(device),
        )

    def device_tables(self) -> dict[str, torch.Tensor]:
        """Every tensor the KCP programs read, by name (``KcpContext.load_layout_`` copies them)."""
        return {
            "local_token_indices": self.local_token_indices,
            "local_cu_seqlens": self.local_cu_seqlens,
            "fix_fwd_rows": self.fix_fwd_rows,
            "fix_bwd_rows": self.fix_bwd_rows,
            "hist.send_rows": self.hist.send_rows,
            "hist.map": self.hist.map,
            "fut.send_rows": self.fut.send_rows,
            "fut.map": self.fut.map,
            "fut.g_rows": self.fut.g_rows,
        }


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


def _boundary_rows(local_cu: torch.Tensor, hist_src: torch.Tensor, fut_src: torch.Tensor):
    """(fix_fwd_rows, fix_bwd_rows), sorted int64 (see RankPlan); H from the tables' shape."""
    cu = local_cu.to(torch.int64)
    start_D, length_D = cu[:-1], cu[1:] - cu[:-1]
    j_H = torch.arange(hist_src.shape[1], dtype=torch.int64)
    inside_DH = j_H[None, :] < length_D[:, None]
    has_hist_D = (hist_src[:, :, 0] >= 0).any(1)
    has_fut_D = (fut_src[:, :, 0] >= 0).any(1)
    fwd = (start_D[:, None] + j_H[None, :])[inside_DH & has_hist_D[:, None]]
    bwd = (start_D[:, None] + length_D[:, None] - 1 - j_H.flip(0)[None, :])[inside_DH.flip(1) & has_fut_D[:, None]]
    return torch.sort(fwd).values, torch.sort(bwd).values


def _halo_tables(src_by_rank: list[torch.Tensor], future: bool) -> list[HaloTables]:
    """Every rank's HaloTables of one direction from every receiver's [D * H, 2] source table."""
    num_ranks = len(src_by_rank)
    empty = torch.empty(0, dtype=torch.int64)
    # to_peer[q][r]: owner rows that q sends to r, in r's ascending slot order
    to_peer = [dict() for _ in range(num_ranks)]
    recv_slots = []  # per receiver: (slots grouped by owner, recvs)
    self_slots = []  # per receiver: (slots, owner rows) it fills from itself
    for r, src_K2 in enumerate(src_by_rank):
        owner = src_K2[:, 0]
        remote = torch.nonzero((owner >= 0) & (owner != r)).flatten()
        grouped = remote[torch.sort(owner[remote], stable=True).indices]
        counts = torch.bincount(owner[grouped], minlength=num_ranks).tolist()
        recvs = tuple((q, n) for q, n in enumerate(counts) if n > 0)
        for (q, _), slots in zip(recvs, torch.split(grouped, [n for _, n in recvs])):
            to_peer[q][r] = src_K2[slots, 1]
        recv_slots.append((grouped, recvs))
        mine = torch.nonzero(owner == r).flatten()
        self_slots.append((mine, src_K2[mine, 1]))
    tables = []
    for r, src_K2 in enumerate(src_by_rank):
        sends = tuple((q, int(rows.numel())) for q, rows in sorted(to_peer[r].items()))
        send_rows = torch.cat([rows for _, rows in sorted(to_peer[r].items())]) if sends else empty
        grouped, recvs = recv_slots[r]
        slots, rows = self_slots[r]
        map_K = torch.full((src_K2.shape[0],), -1, dtype=torch.int64)
        map_K[grouped] = -2 - torch.arange(grouped.numel(), dtype=torch.int64)
        if future:
            # local = g of g_rows = [rows sent, peer by peer] + [rows this rank reads itself]
            self_rows = torch.unique(rows)
            g_rows = torch.cat([send_rows, self_rows])
            map_K[slots] = send_rows.numel() + torch.searchsorted(self_rows, rows)
            send_rows = torch.arange(send_rows.numel(), dtype=torch.int64)
        else:
            g_rows = empty
            map_K[slots] = rows
        tables.append(HaloTables(send_rows=send_rows, sends=sends, recvs=recvs, map=map_K, g_rows=g_rows,
                                 send_starts=_slice_starts(send_rows, sends)))
    return tables


def _slice_starts(send_rows: torch.Tensor, sends) -> tuple[int, ...] | None:
    """First row of each message if every message is a run of consecutive ascending rows."""
    starts, off = [], 0
    for _, n in sends:
        rows = send_rows[off:off + n]
        if not torch.equal(rows, torch.arange(int(rows[0]), int(rows[0]) + n, dtype=rows.dtype)):
            return None
        starts.append(int(rows[0]))
        off += n
    return tuple(starts)


def build_rank_plans(cu_seqlens, fragments, halo_rows: int = HALO_ROWS, *, planner=None) -> list[RankPlan]:
    """Plans of all ranks (``len(fragments)`` of them) for one halo size H = ``halo_rows``.

    Deterministic and identical on every rank: each rank may call it and keep
    ``plans[rank]``. Validates both inputs (``normalize_cu_seqlens``, ``validate_fragments``).
    ``halo_rows`` is W - 1 of the conv the plans serve (default 3, the seed width W = 4).
    ``planner``: the ``LayoutPlanner`` of these same inputs, to reuse its work (None: one is made).

    Raises:
        ValueError: bad ``cu_seqlens`` or fragment table, or ``halo_rows`` outside 1..7.
    """
    if planner is None:
        planner = LayoutPlanner(cu_seqlens, fragments)
    return planner.plans(halo_rows)


def build_rank_plans_per_halo(cu_seqlens, fragments, halo_rows) -> list[dict[int, RankPlan]]:
    """Plans of all ranks for each H of ``halo_rows`` (ints in 1..7): ``out[rank][H]``.

    The owners of the tokens and the segments are computed once (``LayoutPlanner``) and shared by
    every H's plan (the same CPU tensors); only the halo tables are per H.
    """
    planner = LayoutPlanner(cu_seqlens, fragments)
    out: list[dict[int, RankPlan]] = [dict() for _ in range(planner.num_ranks)]
    for h in dict.fromkeys(halo_rows):
        for r, plan in enumerate(planner.plans(h)):
            out[r][h] = plan
    return out


def _check_halo_rows(halo_rows) -> int:
    h = operator.index(halo_rows)
    if not 1 <= h <= MAX_HALO_ROWS:
        raise ValueError(f"halo_rows must be in 1..{MAX_HALO_ROWS} (conv widths 2..{MAX_WIDTH}), got {h}")
    return h


class LayoutPlanner:
    """The token owners and the segments of a batch layout, from which the plans of any H are built.

    Building a ``LayoutPlanner`` validates the inputs and does the work every H shares: the owner
    (rank, local row) of every global token and each rank's segments. ``plans(H)`` then adds the
    halo tables of one H for all ranks, ``peer_links(H)`` the pairs of ranks they connect.
    Deterministic and identical on every rank. Holds on the host 2 int64 [T] owner tables, each
    rank's local token indices (T int64 in all) and segments.

    Raises (construction):
        ValueError: bad ``cu_seqlens`` or fragment table.
    """

    def __init__(self, cu_seqlens, fragments):
        cu = normalize_cu_seqlens(cu_seqlens)
        num_tokens = cu[-1]
        table = validate_fragments(fragments, num_tokens, len(fragments))
        self.num_ranks = len(table)

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

        # Segments of every rank: local boundaries; global first and stop token; document bounds.
        local_cu, segments = [], []
        for rank_spans in table:
            seg_start, seg_stop, doc_start, doc_stop = _segments_of_rank(cu, rank_spans)
            lengths_D = torch.tensor([b - a for a, b in zip(seg_start, seg_stop)], dtype=torch.int64)
            cu_D1 = torch.zeros(len(seg_start) + 1, dtype=torch.int64)
            cu_D1[1:] = torch.cumsum(lengths_D, 0)
            local_cu.append(cu_D1.to(torch.int32))
            segments.append(tuple(torch.tensor(v, dtype=torch.int64)
                                  for v in (seg_start, seg_stop, doc_start, doc_stop)))
        self._owner_rank_T, self._owner_row_T = owner_rank_T, owner_row_T
        self._local_token_indices, self._local_cu, self._segments = local_token_indices, local_cu, segments

    def _sources(self, h: int):
        """Per rank: (hist_src [D, H, 2], fut_src [D, H, 2]) of RankPlan for H = h."""
        j_H = torch.arange(h, dtype=torch.int64)
        out = []
        for start_D, stop_D, doc_start_D, doc_stop_D in self._segments:
            hist_tok_DH = start_D[:, None] - h + j_H[None, :]
            fut_tok_DH = stop_D[:, None] + j_H[None, :]
            owners = (self._owner_rank_T, self._owner_row_T)
            out.append((_owners(hist_tok_DH, hist_tok_DH >= doc_start_D[:, None], *owners),
                        _owners(fut_tok_DH, fut_tok_DH < doc_stop_D[:, None], *owners)))
        return out

    def plans(self, halo_rows: int = HALO_ROWS) -> list[RankPlan]:
        """Every rank's RankPlan for H = ``halo_rows`` (1..7; ValueError otherwise)."""
        h = _check_halo_rows(halo_rows)
        sources = self._sources(h)
        hist_tables = _halo_tables([hist.reshape(-1, 2) for hist, _ in sources], future=False)
        fut_tables = _halo_tables([fut.reshape(-1, 2) for _, fut in sources], future=True)
        plans = []
        for r, (hist_src, fut_src) in enumerate(sources):
            fix_fwd, fix_bwd = _boundary_rows(self._local_cu[r], hist_src, fut_src)
            plans.append(
                RankPlan(
                    rank=r,
                    world_size=self.num_ranks,
                    num_local_tokens=self._local_token_indices[r].numel(),
                    num_segments=self._local_cu[r].numel() - 1,
                    local_token_indices=self._local_token_indices[r],
                    local_cu_seqlens=self._local_cu[r],
                    hist_src=hist_src,
                    fut_src=fut_src,
                    fix_fwd_rows=fix_fwd,
                    fix_bwd_rows=fix_bwd,
                    hist=hist_tables[r],
                    fut=fut_tables[r],
                    halo_rows=h,
                )
            )
        return plans

    def peer_links(self, halo_rows: int = MAX_HALO_ROWS) -> list[HaloTables]:
        """Per rank: a one-row message to and from every peer that the exchanges of any H <= halo_rows use.

        Both exchanges move rows from the rank that owns a token to the rank that reads it (x rows
        before a segment, g rows after it), and the tokens of H' rows are among those of H >= H'
        rows, so the (owner, reader) pairs of H = 7 cover every width. ``sends``/``recvs`` list
        those peers with one row each; ``map``, ``g_rows`` are empty, ``send_rows`` zeros.
        """
        h = _check_halo_rows(halo_rows)
        j_H = torch.arange(h, dtype=torch.int64)
        reads_PP = torch.zeros((self.num_ranks, self.num_ranks), dtype=torch.bool)  # [reader, owner]
        for r, (start_D, stop_D, doc_start_D, doc_stop_D) in enumerate(self._segments):
            hist_tok_DH = start_D[:, None] - h + j_H[None, :]
            fut_tok_DH = stop_D[:, None] + j_H[None, :]
            tokens = torch.cat([hist_tok_DH[hist_tok_DH >= doc_start_D[:, None]],
                                fut_tok_DH[fut_tok_DH < doc_stop_D[:, None]]])
            reads_PP[r] = torch.bincount(self._owner_rank_T[tokens], minlength=self.num_ranks) > 0
        reads_PP.fill_diagonal_(False)
        links = []
        empty = torch.empty(0, dtype=torch.int64)
        for r in range(self.num_ranks):
            sends = tuple((q, 1) for q in torch.nonzero(reads_PP[:, r]).flatten().tolist())
            recvs = tuple((q, 1) for q in torch.nonzero(reads_PP[r]).flatten().tolist())
            links.append(HaloTables(send_rows=torch.zeros(len(sends), dtype=torch.int64), sends=sends, recvs=recvs,
                                    map=empty, g_rows=empty, send_starts=None))
        return links
