"""The KCP context: one rank's share of a context-parallel packed batch, ready on the device.

``build_kcp_context`` turns the GLOBAL document boundaries and a layout (or an explicit fragment
table) into this rank's plan (kcp_plan.py), moves it to the device, and checks with one small
collective that every rank of the group was given the same batch and layout. After that, the
forward and backward need no host work: the local segment boundaries, the halo tables and the
exchange indices are all device tensors held by the ``KcpContext``.

Shape legend: T global tokens, S local rows, C channels, D local segments (n_seg), H halo rows (3),
F rows sent by the future exchange (n_fut), P ranks.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import threading
import weakref

import torch
import torch.distributed as dist

from .exchange import PendingExchange, halo_exchange, start_halo_exchange
from .plan import (
    HALO_ROWS,
    LAYOUTS,
    RankPlan,
    build_rank_plans,
    layout_fragments,
    normalize_cu_seqlens,
    validate_fragments,
)

class ObjectRegistry:
    """Process-local ints naming live objects that a torch custom op cannot take as an argument.

    The KCP custom ops (kcp_custom_ops.py) take a ``KcpContext`` and a ``RecomputeHandleDetKcp``
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

    Attributes (read-only by convention):
        group: the torch.distributed process group, or None for a 1-rank context with no process
            group.
        rank, world_size: this rank and P, in ``group``.
        layout: the layout name, or ``"fragments"`` for an explicit table.
        fragments: the whole table, ``fragments[r]`` = tuple of ``(start, stop)`` global spans of
            rank r in its local order.
        global_cu_seqlens: tuple of ints, the global document boundaries.
        total_tokens: T.
        device: where every tensor below lives.
        num_local_tokens: S_local.
        local_token_indices: int64 [S]: global token of each local row.
        local_cu_seqlens: int32 [D + 1]: local segment boundaries (segment = run of local rows that
            are consecutive tokens of one fragment and one document).
        num_segments: D.
        num_slots: D * H, rows of a halo buffer; slot ``d*H + j``.
        hist_src, fut_src: int64 [D, H, 2]: (owner rank, owner local row) of halo token j of
            segment d, (-1, -1) outside the document (see RankPlan).
        fut_rows: int64 [F]: local rows whose FP32 pre-activation gradient this rank sends in the
            future exchange, ``g_send[i]`` = g of row ``fut_rows[i]``.
        hist_exchange, fut_exchange: ExchangeSpec on ``device``.
        hist_rows: int64 [K]: local rows this rank sends in the history exchange (to peers or
            itself); ``hist_exchange_compact`` is ``hist_exchange`` indexing ``x_local[hist_rows]``.
        fix_fwd_rows, fix_bwd_rows: int64: the local rows whose y (first rows of a continuing
            segment) or dx (last rows of a continued segment) need the halo (``boundary_rows``).
        plan: the RankPlan on ``device`` (the same tensors as above).
        op_id: the process-local int by which the torch custom ops (kcp_custom_ops.py) find this
            context (``CONTEXTS``; a custom op cannot take a Python object). Assigned once, at
            construction, from a per-process counter; the registry holds the context weakly.
            Under torch.compile a new context is a new value of that int: the first one causes
            one recompile, after which Dynamo treats it as a dynamic int.
    """

    def __init__(self, *, group, layout: str, fragments, global_cu_seqlens, device: torch.device, plan: RankPlan):
        self.group = group
        self.rank = plan.rank
        self.world_size = plan.world_size
        self.layout = layout
        self.fragments = fragments
        self.global_cu_seqlens = tuple(global_cu_seqlens)
        self.total_tokens = self.global_cu_seqlens[-1]
        self.device = device
        self.plan = plan
        self.num_local_tokens = plan.num_local_tokens
        self.local_token_indices = plan.local_token_indices
        self.local_cu_seqlens = plan.local_cu_seqlens
        self.num_segments = plan.num_segments
        self.num_slots = plan.num_segments * HALO_ROWS
        self.hist_src = plan.hist_src
        self.fut_src = plan.fut_src
        self.fut_rows = plan.fut_rows
        self.hist_exchange = plan.hist_exchange
        self.fut_exchange = plan.fut_exchange
        self.hist_rows, self.hist_exchange_compact = compact_exchange(plan.hist_exchange)
        self.fix_fwd_rows, self.fix_bwd_rows = boundary_rows(plan)
        self.op_id: int = CONTEXTS.register(self)  # last: a failed construction registers nothing

    def __repr__(self) -> str:
        return (
            f"KcpContext(rank={self.rank}, world_size={self.world_size}, layout={self.layout!r}, "
            f"total_tokens={self.total_tokens}, num_local_tokens={self.num_local_tokens}, "
            f"num_segments={self.num_segments}, device={self.device})"
        )

    def device_tables(self) -> dict[str, torch.Tensor]:
        """Every device tensor the KCP forward and backward read, by name (for ``load_layout_``)."""
        tables = {
            "local_token_indices": self.local_token_indices,
            "local_cu_seqlens": self.local_cu_seqlens,
            "hist_src": self.hist_src,
            "fut_src": self.fut_src,
            "fut_rows": self.fut_rows,
            "hist_rows": self.hist_rows,
            "fix_fwd_rows": self.fix_fwd_rows,
            "fix_bwd_rows": self.fix_bwd_rows,
        }
        for name, spec in (("hist_exchange", self.hist_exchange), ("hist_exchange_compact", self.hist_exchange_compact),
                           ("fut_exchange", self.fut_exchange)):
            tables[f"{name}.self_src_idx"] = spec.self_src_idx
            tables[f"{name}.self_dst_slot"] = spec.self_dst_slot
            for q in spec.peers:
                tables[f"{name}.send_idx[{q}]"] = spec.send_idx[q]
                tables[f"{name}.recv_slot[{q}]"] = spec.recv_slot[q]
        return tables

    def load_layout_(self, other: "KcpContext") -> "KcpContext":
        """Copy another context's tables into this context's device tensors, in place.

        For CUDA-graph replay with a new batch layout: a graph captured with this context keeps
        reading the same device tensors, so after ``ctx.load_layout_(build_kcp_context(new_cu,
        ...))`` a replay computes the new layout without re-capture. No collective (``other`` was
        built, and cross-checked, by one). The copies are enqueued on the current stream.

        The caps: every table must keep its shape, i.e. the same group, rank, local token count
        S_local, local segment count D, exchange peers and per-peer row counts, and the same
        numbers of boundary rows. ``other`` must be built for the same group and device. Whether
        a new batch fits depends on where its document boundaries fall: the same layout and T,
        the same number of local segments (document pieces; empty documents make none) on every
        rank, and no document boundary within 3 tokens of a fragment edge in either batch, give
        equal shapes.

        Raises:
            ValueError: a table whose shape differs (named in the message), or a different group,
                rank or device; nothing is copied then.
        """
        if not isinstance(other, KcpContext):
            raise ValueError(f"load_layout_ expects a KcpContext, got {type(other).__name__}")
        if (other.group, other.rank, other.world_size, other.device) != (self.group, self.rank, self.world_size, self.device):
            raise ValueError(
                f"load_layout_ needs a context of the same group, rank and device: this is rank {self.rank} of "
                f"{self.world_size} on {self.device}, the other rank {other.rank} of {other.world_size} on {other.device}")
        mine, theirs = self.device_tables(), other.device_tables()
        if mine.keys() != theirs.keys():
            raise ValueError(
                f"load_layout_: the exchange peers differ (this context talks to {sorted(self.hist_exchange.peers)} / "
                f"{sorted(self.fut_exchange.peers)}, the other to {sorted(other.hist_exchange.peers)} / "
                f"{sorted(other.fut_exchange.peers)}); a captured graph cannot serve it")
        bad = [f"{k}: {tuple(mine[k].shape)} vs {tuple(theirs[k].shape)}" for k in mine
               if mine[k].shape != theirs[k].shape or mine[k].dtype != theirs[k].dtype]
        if bad:
            raise ValueError(
                "load_layout_: the new layout does not fit this context's tables (a captured graph keeps their "
                "shapes); differing: " + "; ".join(bad))
        for k, t in mine.items():
            t.copy_(theirs[k])
        self.layout = other.layout
        self.fragments = other.fragments
        self.global_cu_seqlens = other.global_cu_seqlens
        self.total_tokens = other.total_tokens
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

    def start_exchange_hist(self, x_local_SC: torch.Tensor, *, out: torch.Tensor | None = None) -> PendingExchange:
        """Start the history exchange of ``x_local[S, C]``; ``wait()`` gives ``hist[D*H, C]``."""
        return start_halo_exchange(x_local_SC, self.hist_exchange, self.num_slots, self.group, out=out)

    def exchange_hist(self, x_local_SC: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
        """History rows ``hist[D*H, C]`` (slot d*H + j = token ``first_token(d) - H + j``, or zero)."""
        return halo_exchange(x_local_SC, self.hist_exchange, self.num_slots, self.group, out=out)

    def start_exchange_fut(self, g_send_FC: torch.Tensor, *, out: torch.Tensor | None = None) -> PendingExchange:
        """Start the future exchange of ``g_send[F, C]``; ``wait()`` gives ``fut[D*H, C]``."""
        return start_halo_exchange(g_send_FC, self.fut_exchange, self.num_slots, self.group, out=out)

    def exchange_fut(self, g_send_FC: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
        """Future rows ``fut[D*H, C]`` (slot d*H + j = g of token ``stop_token(d) + j``, or zero)."""
        return halo_exchange(g_send_FC, self.fut_exchange, self.num_slots, self.group, out=out)


def boundary_rows(plan):
    """(fwd_rows, bwd_rows) int64: the local rows whose result needs a halo.

    fwd_rows: the first (up to 3) rows of every segment with a history row (its taps reach into
    another fragment); bwd_rows: the last (up to 3) rows of every segment with a look-ahead row
    (their dx needs g of another fragment). The KCP ops compute everything else while the exchange
    is in flight and rewrite only these rows once it has arrived.
    """
    cu = plan.local_cu_seqlens.to(torch.int64)
    start_D, length_D = cu[:-1], cu[1:] - cu[:-1]
    j_H = torch.arange(HALO_ROWS, device=cu.device, dtype=torch.int64)
    inside_DH = j_H[None, :] < length_D[:, None]
    has_hist_D = (plan.hist_src[:, :, 0] >= 0).any(1)
    has_fut_D = (plan.fut_src[:, :, 0] >= 0).any(1)
    fwd = (start_D[:, None] + j_H[None, :])[inside_DH & has_hist_D[:, None]]
    bwd = (start_D[:, None] + length_D[:, None] - 1 - j_H.flip(0)[None, :])[inside_DH.flip(1) & has_fut_D[:, None]]
    return torch.sort(fwd).values, torch.sort(bwd).values


def compact_exchange(spec):
    """(rows, spec'): the sorted unique rows a spec sends (to peers or itself) and the same spec
    indexing into ``values[rows]`` instead of ``values``.

    The KCP ops gather only these rows of every tensor of a layer and exchange them in one message
    per peer (the ``multi`` form's single exchange).
    """
    parts = [spec.self_src_idx] + [spec.send_idx[q] for q in spec.peers]
    rows = torch.unique(torch.cat(parts)) if parts else spec.self_src_idx
    remap = lambda idx: torch.searchsorted(rows, idx)  # noqa: E731  (rows is sorted and holds idx)
    compact = dataclasses.replace(
        spec,
        num_values=int(rows.numel()),
        send_idx={q: remap(t) for q, t in spec.send_idx.items()},
        self_src_idx=remap(spec.self_src_idx),
    )
    return rows, compact


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
    NCCL's batched point-to-point calls of the halo exchange need.

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
        plan = build_rank_plans(cu, table)[rank]
        fingerprint = [1, world_size, _LAYOUT_IDS[layout_name], cu[-1], _hash_ints(cu), _hash_ints(_flatten(table))]
    except Exception as exc:  # re-raised below, after the collective
        error = exc
        fingerprint = [0, world_size, -1, -1, -1, -1]

    if group is not None:
        _check_fingerprints(fingerprint, group, rank, world_size, error)
    elif error is not None:
        raise error

    return KcpContext(group=group, layout=layout_name, fragments=table, global_cu_seqlens=cu, device=device, plan=plan.to(device))


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
