"""The KCP context: one rank's share of a context-parallel packed batch, ready on the device.

``build_kcp_context`` turns the GLOBAL document boundaries and a layout (or an explicit fragment
table) into this rank's plan (plan.py), moves it to the device, and checks with one small
collective that every rank of the group was given the same batch and layout. After that, the
forward and backward need no host work: the local segment boundaries, the boundary rows and the
halo tables are all device tensors of the plan.

The halo tables depend on the conv width W (H = W - 1 rows per segment and direction). The context
builds those of W = 4 with itself and those of another width on the first call of that width
(``KcpContext.plan_for_width``), then keeps them: host work once per width and context, never per
call. Building every width up front would cost 2.7 to 3 times the build of W = 4 alone (measured
on 8 ranks, T = 524,288 tokens: 25 -> 65 ms with 16k documents in zigzag, 0.44 -> 1.25 s with 13k
documents in zigzag_per_document), a price every batch would pay for widths most models never
use. Hence: a CUDA graph that captures a call of width W needs one eager call of that width on the
context first (a capture that would build tables raises). The pairs of ranks that any width's
exchanges use are connected at build time (those of W = 8 include every smaller width's), so a
later width's first exchange opens no new connection.

Shape legend: T global tokens, S local rows, C channels, D local segments, H = W - 1 halo rows,
W conv width, P ranks.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import threading
import weakref

import torch
import torch.distributed as dist

from .exchange import coalescing, start_exchange
from ..constants import MAX_WIDTH, MIN_WIDTH
from .plan import (
    LAYOUTS,
    MAX_HALO_ROWS,
    LayoutPlanner,
    RankPlan,
    build_rank_plans,
    layout_fragments,
    normalize_cu_seqlens,
    validate_fragments,
)

class ObjectRegistry:
    """Process-local ints naming live objects that a torch custom op cannot take as an argument.

    The KCP custom ops (ops.py) take a ``KcpContext`` and a ``RecomputeHandleDetKcp``
    as the int ``op_id`` the object got at construction. Ids come from a per-process counter
    (1, 2, 3, ... in construction order: the same on every rank that builds its objects in the
    same order) and are never reused; the map holds the objects weakly, so a dropped object is
    forgotten and the registry does not grow with the number of objects ever made.
    """

    def __init__(self, what: str):
        self._what = what
        self._live = weakref.WeakValueDictionary()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def register(self, obj) -> int:
        """A fresh id for ``obj`` (held weakly)."""
        with self._lock:
            op_id = next(self._ids)
            self._live[op_id] = obj
        return op_id

    def get(self, op_id):
        """The live object of ``op_id``, or None."""
        return self._live.get(int(op_id))

    def lookup(self, op_id):
        """The live object of ``op_id``.

        Raises:
            RuntimeError: no live object has that id in this process (it was garbage-collected,
                or the id comes from another process).
        """
        obj = self._live.get(int(op_id))
        if obj is None:
            raise RuntimeError(
                f"no live {self._what} with op_id {op_id} in this process: it was garbage-collected "
                f"(keep it alive until the backward of every call that used it has run) or the id "
                f"comes from another process")
        return obj

    def __len__(self) -> int:
        return len(self._live)


CONTEXTS = ObjectRegistry("KcpContext")

_LAYOUT_IDS = {"contiguous": 0, "zigzag": 1, "zigzag_per_document": 2, "fragments": 3}
_FINGERPRINT_FIELDS = ("ok", "world size", "layout", "total tokens", "cu_seqlens", "fragments")


class KcpContext:
    """One rank's view of a context-parallel packed batch (build it with ``build_kcp_context``).

    It holds the process group, this rank's complete plan (every table computed by the plan
    builder, plan.py ``RankPlan``, on ``device``) and the ``op_id`` the torch custom ops carry.
    ``plan`` is the plan of the seed width W = 4; ``plan_for_width(W)`` gives (and on first use
    builds and keeps) the plan of any width 2..8. The segments, hence ``local_cu_seqlens`` and
    ``local_token_indices``, are the same for every width.

    Attributes (read-only by convention):
        group: the torch.distributed process group, or None for a 1-rank context with no process
            group.
        plan: the RankPlan of W = 4 (3 halo rows); the properties below read it.
        layout: the layout name, or ``"fragments"`` for an explicit table.
        fragments: the whole table, ``fragments[r]`` = tuple of ``(start, stop)`` global spans of
            rank r in its local order.
        global_cu_seqlens: tuple of ints, the global document boundaries.
        device: where every tensor of the plan lives.
        op_id: the process-local int by which the torch custom ops (ops.py) find this context
            (``CONTEXTS``; a custom op cannot take a Python object). Assigned once, at
            construction, from a per-process counter; the registry holds the context weakly.
            Under torch.compile a new context is a new value of that int: the first one causes
            one recompile, after which Dynamo treats it as a dynamic int.
    """

    def __init__(self, *, group, layout: str, fragments, global_cu_seqlens, device: torch.device, plan: RankPlan,
                 planner: LayoutPlanner | None = None):
        """``plan``: this rank's plan on ``device`` (any H; ``build_kcp_context`` gives H = 3).
        ``planner``: the LayoutPlanner of ``global_cu_seqlens`` and ``fragments`` that built it, kept
        to build other widths' plans (None: made again from them when first needed)."""
        self.group = group
        self.layout = layout
        self.fragments = fragments
        self.global_cu_seqlens = tuple(global_cu_seqlens)
        self.device = device
        self.plan = plan
        self._plans = {plan.halo_rows: plan}  # H -> RankPlan on device
        self._planner = planner
        self._plans_lock = threading.Lock()
        self.coalesce = coalescing(group, device)  # NCCL batches the halo messages
        self.op_id: int = CONTEXTS.register(self)  # last: a failed construction registers nothing

    # The plan's figures, by name.
    rank = property(lambda self: self.plan.rank, doc="This rank, in ``group``.")
    world_size = property(lambda self: self.plan.world_size, doc="P, the ranks of ``group``.")
    total_tokens = property(lambda self: self.global_cu_seqlens[-1], doc="T, global tokens.")
    num_local_tokens = property(lambda self: self.plan.num_local_tokens, doc="S_local.")
    num_segments = property(lambda self: self.plan.num_segments, doc="D, local segments.")
    local_token_indices = property(lambda self: self.plan.local_token_indices,
                                   doc="int64 [S]: the global token of each local row, in local order.")
    local_cu_seqlens = property(lambda self: self.plan.local_cu_seqlens,
                                doc="int32 [D + 1]: local segment boundaries (a segment: consecutive tokens "
                                    "of one fragment and one document).")
    fix_fwd_rows = property(lambda self: self.plan.fix_fwd_rows,
                            doc="int64: local rows whose y needs the history halo.")
    fix_bwd_rows = property(lambda self: self.plan.fix_bwd_rows,
                            doc="int64: local rows whose dx needs the future halo.")

    @property
    def widths(self) -> tuple[int, ...]:
        """The conv widths whose tables the context holds (ascending)."""
        return tuple(sorted(h + 1 for h in self._plans))

    def plan_for_width(self, width: int) -> RankPlan:
        """This rank's plan for convs of width ``width`` (H = width - 1 halo rows), on ``device``.

        The plan of a width is built on its first request (host work: the halo tables of all ranks
        for that H, then one copy to the device), kept, and shared by every later call; its segment
        tensors are ``plan``'s. The build needs no collective (every rank computes the same tables
        from the same global inputs). It cannot run while a CUDA graph is being captured: make one
        eager call of each width first.

        Raises:
            ValueError: width outside 2..8.
            RuntimeError: the tables of ``width`` are missing while a CUDA graph is being captured.
        """
        plan = self._plans.get(width - 1) if type(width) is int else None
        if plan is not None:
            return plan
        if isinstance(width, bool) or not isinstance(width, int) or not MIN_WIDTH <= width <= MAX_WIDTH:
            raise ValueError(f"the conv width must be an int from {MIN_WIDTH} to {MAX_WIDTH}, got {width!r}")
        if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"the KcpContext has no halo tables for width W = {width} yet and cannot build them while a CUDA "
                f"graph is being captured: make one eager call of width {width} with this context before capturing")
        with self._plans_lock:
            plan = self._plans.get(width - 1)
            if plan is None:
                plan = self._build_plan(width - 1, self._layout_planner())
                self._plans[width - 1] = plan  # last: a failed build leaves nothing behind
        return plan

    def _layout_planner(self) -> LayoutPlanner:
        if self._planner is None:
            self._planner = LayoutPlanner(self.global_cu_seqlens, self.fragments)
        return self._planner

    def _build_plan(self, h: int, planner: LayoutPlanner) -> RankPlan:
        """This rank's plan of H = h on the device, sharing ``plan``'s segment tensors."""
        host = planner.plans(h)[self.rank]
        assert host.num_segments == self.plan.num_segments and host.num_local_tokens == self.plan.num_local_tokens
        return dataclasses.replace(host, local_token_indices=self.plan.local_token_indices,
                                   local_cu_seqlens=self.plan.local_cu_seqlens).to(self.device)

    def __repr__(self) -> str:
        return (
            f"KcpContext(rank={self.rank}, world_size={self.world_size}, layout={self.layout!r}, "
            f"total_tokens={self.total_tokens}, num_local_tokens={self.num_local_tokens}, "
            f"num_segments={self.num_segments}, device={self.device})"
        )

    def load_layout_(self, other: "KcpContext") -> "KcpContext":
        """Copy another context's tables into this context's device tensors, in place.

        For CUDA-graph replay with a new batch layout: a graph captured with this context keeps
        reading the same device tensors, so after ``ctx.load_layout_(build_kcp_context(new_cu,
        ...))`` a replay computes the new layout without re-capture. No collective (``other`` was
        built, and cross-checked, by one). The copies are enqueued on the current stream.

        The caps: every table must keep its shape, i.e. the same group, rank, local token count
        S_local, local segment count D, the same messages (peers, row counts, and for messages sent
        as slices of x their first rows) and the same numbers of boundary rows. ``other`` must be
        built for the same group and device. Whether a new batch fits depends on where its
        document boundaries fall: the same layout and T, the same number of local segments
        (document pieces; empty documents make none) on every rank, and no document boundary
        within W - 1 tokens of a fragment edge in either batch, give equal shapes. The tables of
        every width this context holds (``widths``) are checked and loaded; ``other`` builds
        those it lacks (host work, no collective).

        Raises:
            ValueError: a table whose shape differs (named in the message), other messages, or a
                different group, rank or device; nothing is copied then.
        """
        if not isinstance(other, KcpContext):
            raise ValueError(f"load_layout_ expects a KcpContext, got {type(other).__name__}")
        if (other.group, other.rank, other.world_size, other.device) != (self.group, self.rank, self.world_size, self.device):
            raise ValueError(
                f"load_layout_ needs a context of the same group, rank and device: this is rank {self.rank} of "
                f"{self.world_size} on {self.device}, the other rank {other.rank} of {other.world_size} on {other.device}")
        pairs = [(h, self._plans[h], other.plan_for_width(h + 1)) for h in sorted(self._plans)]
        for h, mine_plan, theirs_plan in pairs:
            width = "" if h == self.plan.halo_rows else f" of width W = {h + 1}"
            for name in ("hist", "fut"):
                mine, theirs = getattr(mine_plan, name), getattr(theirs_plan, name)
                if (mine.sends, mine.recvs) != (theirs.sends, theirs.recvs):
                    raise ValueError(
                        f"load_layout_: the {name} messages{width} differ (this context sends {mine.sends} and "
                        f"receives {mine.recvs} as (peer, rows), the other {theirs.sends} / {theirs.recvs}); a "
                        f"captured graph cannot serve it")
                if mine.send_starts != theirs.send_starts:
                    raise ValueError(
                        f"load_layout_: the {name} messages{width} start at other rows (this context sends slices "
                        f"of x from rows {mine.send_starts}, the other from {theirs.send_starts}); a captured "
                        f"graph cannot serve it")
            mine, theirs = mine_plan.device_tables(), theirs_plan.device_tables()
            bad = [f"{k}{width}: {tuple(mine[k].shape)} vs {tuple(theirs[k].shape)}" for k in mine
                   if mine[k].shape != theirs[k].shape or mine[k].dtype != theirs[k].dtype]
            if bad:
                raise ValueError(
                    "load_layout_: the new layout does not fit this context's tables (a captured graph keeps their "
                    "shapes); differing: " + "; ".join(bad))
        for _, mine_plan, theirs_plan in pairs:
            theirs = theirs_plan.device_tables()
            for k, t in mine_plan.device_tables().items():
                t.copy_(theirs[k])
        self.layout = other.layout
        self.fragments = other.fragments
        self.global_cu_seqlens = other.global_cu_seqlens
        self._planner = other._planner
        return self

    def shard(self, x_global: torch.Tensor) -> torch.Tensor:
        """This rank's rows of a global packed tensor ``[T, ...]`` or ``[1, T, ...]``, in local order.

        Raises:
            ValueError: the token dimension is not T.
        """
        token_dim = 1 if (x_global.dim() >= 3 and x_global.shape[0] == 1) else 0
        if x_global.dim() < 1 or x_global.shape[token_dim] != self.total_tokens:
            raise ValueError(
                f"shard expects [T, C] or [1, T, C] with T = {self.total_tokens}, got shape {tuple(x_global.shape)}"
            )
        index_S = self.local_token_indices
        if index_S.device != x_global.device:
            index_S = index_S.to(x_global.device)
        return x_global.index_select(token_dim, index_S)


def build_kcp_context(cu_seqlens, *, layout=None, group=None, fragments=None, device=None) -> KcpContext:
    """Build this rank's KCP context; a collective over ``group`` (every rank must call it).

    Args:
        cu_seqlens: GLOBAL document boundaries of the packed batch, identical on every rank: 1-D
            integer tensor (or sequence of ints), ``0 = cu[0] <= ... <= cu[N] = T``.
        layout: ``"contiguous"``, ``"zigzag"`` or ``"zigzag_per_document"`` (kcp_plan.py
            ``layout_fragments``). Give at most one of ``layout`` and ``fragments``; neither means
            ``"contiguous"``.
        group: torch.distributed process group; default the world group when torch.distributed is
            initialised, else a 1-rank context (rank 0, size 1, group None).
        fragments: explicit table, ``fragments[r]`` = list of ``(start, stop)`` global spans of
            rank r in its local order; together they must tile ``[0, T)`` exactly once.
        device: where the context's tensors live; default ``cu_seqlens.device`` (CPU for a
            sequence).

    The build-time collective is an all-gather of a few int64 fingerprint numbers (outcome of the
    local build, group size, layout, T, hashes of cu_seqlens and of the fragment table). Every rank
    reaches the same verdict: if any rank's input is invalid or differs from another rank's, every
    rank raises ValueError and none hangs. It also serves as the group's first collective, which
    NCCL's batched point-to-point calls of the halo exchange need. Then one tiny exchange in each
    direction connects every pair of ranks that exchanges halo rows (``_connect_peers``).

    Raises:
        ValueError: bad or mismatched inputs (on every rank), or ``group`` given without an
            initialised torch.distributed / not containing this process.
    """
    if group is None:
        if dist.is_available() and dist.is_initialized():
            group = dist.group.WORLD
    elif not (dist.is_available() and dist.is_initialized()):
        raise ValueError(f"build_kcp_context got group={group!r} but torch.distributed is not initialised")
    if group is None:
        rank, world_size = 0, 1
    else:
        rank = dist.get_rank(group)
        world_size = dist.get_world_size(group)
        if rank < 0:
            raise ValueError(f"build_kcp_context: this process is not a member of group {group!r}")

    # Everything that depends on the inputs is tried before the collective and raised after it,
    # so that a bad input on one rank fails every rank instead of hanging the others.
    error = None
    try:
        if layout is not None and fragments is not None:
            raise ValueError(
                f"build_kcp_context takes at most one of layout and fragments, got layout={layout!r} and "
                f"fragments={fragments!r}"
            )
        if device is None:
            device = cu_seqlens.device if isinstance(cu_seqlens, torch.Tensor) else torch.device("cpu")
        device = torch.device(device)
        cu = normalize_cu_seqlens(cu_seqlens)
        if fragments is None:
            layout_name = "contiguous" if layout is None else layout
            if layout_name not in LAYOUTS:
                raise ValueError(f"unknown KCP layout {layout_name!r}; valid layouts are {', '.join(LAYOUTS)}")
            table = validate_fragments(layout_fragments(cu, world_size, layout_name), cu[-1], world_size)
        else:
            layout_name = "fragments"
            table = validate_fragments(fragments, cu[-1], world_size)
        planner = LayoutPlanner(cu, table)
        plan = build_rank_plans(cu, table, planner=planner)[rank]
        fingerprint = [1, world_size, _LAYOUT_IDS[layout_name], cu[-1], _hash_ints(cu), _hash_ints(_flatten(table))]
    except Exception as exc:  # re-raised below, after the collective
        error = exc
        fingerprint = [0, world_size, -1, -1, -1, -1]

    if group is not None:
        _check_fingerprints(fingerprint, group, rank, world_size, error)
    elif error is not None:
        raise error

    ctx = KcpContext(group=group, layout=layout_name, fragments=table, global_cu_seqlens=cu, device=device,
                     plan=plan.to(device), planner=planner)
    if group is not None:
        _connect_peers(ctx, planner.peer_links(MAX_HALO_ROWS)[rank])
    return ctx


def _connect_peers(ctx: KcpContext, links) -> None:
    """One tiny exchange along ``links`` (plan.py ``LayoutPlanner.peer_links``: every pair of ranks
    whose halo exchanges of any width 2..8 move rows), so that those pairs are connected before the
    first KCP call of any width.

    NCCL connects a pair of ranks lazily, at their first point-to-point operation, and the host
    waits there until both ranks take part. Here every rank takes part (the build is collective);
    later, a rank whose peer failed before an exchange waits on the GPU, where the process group's
    watchdog ends it after the timeout, instead of waiting on the host, where nothing does.
    """
    device = _collective_device(ctx.group)
    send = torch.zeros((links.num_send, 1), dtype=torch.float32, device=device)
    recv = torch.empty((links.num_recv, 1), dtype=torch.float32, device=device)
    start_exchange(send, recv, links, ctx.group, coalescing(ctx.group, device)).wait()


def _flatten(table) -> list[int]:
    flat = []
    for rank_spans in table:
        flat.append(len(rank_spans))
        for start, stop in rank_spans:
            flat.extend((start, stop))
    return flat


def _hash_ints(values) -> int:
    """A hash of a list of ints that is the same in every process (unlike Python's ``hash``)."""
    digest = hashlib.sha256(",".join(str(int(v)) for v in values).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _collective_device(group) -> torch.device:
    backend = str(dist.get_backend(group)).lower()
    if "gloo" in backend or "nccl" not in backend:
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def _check_fingerprints(fingerprint: list[int], group, rank: int, world_size: int, error) -> None:
    """All-gather every rank's fingerprint; raise on every rank if any rank failed or differs."""
    device = _collective_device(group)
    mine_F = torch.tensor(fingerprint, dtype=torch.int64, device=device)
    gathered = [torch.empty_like(mine_F) for _ in range(world_size)]
    dist.all_gather(gathered, mine_F, group=group)
    table_PF = torch.stack(gathered).cpu().tolist()

    failed = [r for r in range(world_size) if table_PF[r][0] == 0]
    if failed:
        if error is not None:
            raise error
        raise ValueError(
            f"build_kcp_context failed on rank(s) {failed} of the group (see the error raised there); "
            f"every rank raises so that none waits for the others"
        )
    assert error is None
    for field in range(1, len(_FINGERPRINT_FIELDS)):
        values = [table_PF[r][field] for r in range(world_size)]
        if any(v != values[0] for v in values):
            groups = {}
            for r, v in enumerate(values):
                groups.setdefault(v, []).append(r)
            name = _FINGERPRINT_FIELDS[field]
            if name == "layout":
                inverse = {i: n for n, i in _LAYOUT_IDS.items()}
                detail = "; ".join(f"ranks {rs}: {inverse.get(v, v)!r}" for v, rs in groups.items())
            elif name in ("cu_seqlens", "fragments"):
                detail = "ranks " + " vs ".join(str(rs) for rs in groups.values())
            else:
                detail = "; ".join(f"ranks {rs}: {v}" for v, rs in groups.items())
            raise ValueError(
                f"build_kcp_context: the ranks of the group were given different {name} "
                f"(this is rank {rank}; {detail}); every rank must pass the same global cu_seqlens, layout "
                f"or fragments"
            )
