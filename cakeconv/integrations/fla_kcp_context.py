"""A KCP context derived from flash-linear-attention's context-parallel context (``FLACPContext``).

Part of the FLA integration (``cakeconv.integrations.fla`` re-exports ``kcp_context_from_fla``):
the core KCP package knows nothing of FLA.

Model code that uses FLA's context parallelism builds one ``FLACPContext`` per batch
(``fla.ops.cp.build_cp_context(cu_seqlens, group, conv1d_kernel_size=4, layout=...)``) and passes
it to each CP op of a layer (the short convolution, the KDA step). ``kcp_context_from_fla`` turns
that context into the ``KcpContext`` of the same batch, so that one FLA context serves both.

An FLA context holds this rank's view only: its local ``cu_seqlens`` (document boundaries inside
its share, clamped to the share, repeated values collapsed), the layout (``contiguous``: one part,
chain slot r; ``zigzag``: a front part, slot r, then a back part, slot 2P-1-r, as KCP's zigzag),
and per part ``pre_num_conv_tokens``: how many tokens of the document holding the part's first
token lie before the part (0: a document starts with the part). The global boundaries are rebuilt
from these, identically on every rank:

1. each rank lists, per part, the global positions of the boundaries strictly inside the part and
   the part's ``pre_num_conv_tokens``;
2. one all-gather of a fixed-size header per rank, then one of the padded boundary lists;
3. every rank forms the same global ``cu_seqlens``: 0, T, every inner boundary, and the start of
   every part that does not continue a document; it checks that each continuing part's document
   start is a boundary that another part reported, with none between it and the part;
4. ``build_kcp_context(global_cu, layout=..., group=fla_context.group, device=...)``, whose own
   fingerprint all-gather checks once more that every rank formed the same batch.

Empty documents of the original batch do not reach the FLA context; they hold no token, so no bit
of y or dx depends on them. A failure on any rank (a context that is not consistent, or mismatched
layouts or share lengths between ranks) raises ValueError on every rank after the header
all-gather, so no rank is left waiting.

The derived context is cached per FLA context object (keyed by its id and the device; the entry is
dropped when the FLA context is garbage-collected): later calls with the same object do no
collective and no work beyond comparing a few fields. ``FLACPContext.copy_for_backward()`` makes a
new object, which derives again (a collective: every rank must do the same); so does a context
changed in place since (its ``cu_seqlens`` tensors written, a field set), at its next use. SPMD
code changes its contexts on every rank alike, so every rank derives again at the same call.
"""

from __future__ import annotations

import bisect
import threading
import weakref

import torch
import torch.distributed as dist

from ..cake_causal_conv1d_det_train_backend.kcp.context import KcpContext, _collective_device, build_kcp_context

FLA_LAYOUTS = {"contiguous": 0, "zigzag": 1}
# The fields of FLA 0.6.0's FLACPContext that the derivation reads.
FLA_CONTEXT_FIELDS = ("group", "layout", "cu_seqlens", "cu_seqlens_cpu", "pre_num_conv_tokens", "part_len",
                      "front_num_seqs", "pre_num_conv_tokens_by_part")
_HEADER = 11  # ok, layout id, P, part length, parts, then (slot, pre_num_conv_tokens, inner count) x 2

# (id(fla_context), device) -> (weakref to the FLA context, what the derivation read, its KcpContext)
_CACHE: dict[tuple[int, torch.device], tuple[weakref.ref, tuple, KcpContext]] = {}
_CACHE_LOCK = threading.Lock()


def kcp_context_from_fla(fla_context, *, device=None) -> KcpContext:
    """The ``KcpContext`` of the batch an FLA ``FLACPContext`` describes (cached per FLA context).

    Args:
        fla_context: an ``fla.ops.cp.FLACPContext`` with a process group (any object with its
            fields: ``group``, ``layout``, ``cu_seqlens`` / ``cu_seqlens_cpu``,
            ``pre_num_conv_tokens``, and for zigzag ``part_len``, ``front_num_seqs``,
            ``pre_num_conv_tokens_by_part``).
        device: where the KCP tables live; default the device of ``fla_context.cu_seqlens``.

    Returns:
        The KcpContext (group ``fla_context.group``, the same layout, the same local rows in the
        same order as FLA's local buffer). The first call for an FLA context is a collective over
        its group (module docstring); later calls return the cached context.

    Raises:
        ValueError: not an FLA CP context, no process group, a layout other than ``contiguous`` /
            ``zigzag``, or contexts of the ranks that do not describe one batch (on every rank).
    """
    group = _check_fla_fields(fla_context)
    if device is None:
        cu = fla_context.cu_seqlens if fla_context.cu_seqlens is not None else fla_context.cu_seqlens_cpu
        device = cu.device
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    key = (id(fla_context), device)
    snapshot = _snapshot(fla_context)
    with _CACHE_LOCK:
        entry = _CACHE.get(key)
    if entry is not None and entry[0]() is fla_context and _same(entry[1], snapshot):
        return entry[2]

    ctx = _derive(fla_context, group, device)
    with _CACHE_LOCK:
        known = key in _CACHE
        _CACHE[key] = (weakref.ref(fla_context), snapshot, ctx)
    if not known:
        weakref.finalize(fla_context, _forget, key)
    return ctx


def _forget(key) -> None:
    with _CACHE_LOCK:
        _CACHE.pop(key, None)


def _snapshot(fla_context) -> tuple:
    """What the derivation read: the group and tables (compared by identity), the tensors' in-place
    version counters and the scalar fields. A context changed in place since (FLA's CUDA-graph mode
    refreshes ``cu_seqlens`` in place) no longer matches and is derived again at its next use."""
    tensors = (fla_context.cu_seqlens, fla_context.cu_seqlens_cpu)
    versions = tuple(t._version if isinstance(t, torch.Tensor) else None for t in tensors)
    fields = (fla_context.layout, fla_context.pre_num_conv_tokens, fla_context.part_len, fla_context.front_num_seqs,
              fla_context.pre_num_conv_tokens_by_part)
    return (fla_context.group, *tensors), versions + fields


def _same(a: tuple, b: tuple) -> bool:
    return all(x is y for x, y in zip(a[0], b[0])) and a[1] == b[1]


def _check_fla_fields(fla_context):
    """The context's process group; ValueError when it is not an FLA CP context with one."""
    missing = [name for name in FLA_CONTEXT_FIELDS if not hasattr(fla_context, name)]
    if missing:
        raise ValueError(f"expected an FLA context (fla.ops.cp.FLACPContext), got {type(fla_context).__name__} "
                         f"without {', '.join(missing)}")
    if fla_context.group is None:
        raise ValueError("the FLA context has no process group (group=None): FLA runs it as one rank on its "
                         "local cu_seqlens; there is no KCP context to derive")
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError("the FLA context has a process group but torch.distributed is not initialised")
    if fla_context.cu_seqlens is None and fla_context.cu_seqlens_cpu is None:
        raise ValueError("the FLA context has no cu_seqlens")
    return fla_context.group


def _derive(fla_context, group, device) -> KcpContext:
    """Steps 1-4 of the module docstring (collectives over ``group``)."""
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    if rank < 0:
        raise ValueError(f"kcp_context_from_fla: this process is not a member of the FLA context's group {group!r}")
    error, header, inner = None, [0] * _HEADER, []
    try:
        header, inner = encode_parts(*local_parts(fla_context, rank, world_size), world_size)
    except ValueError as exc:  # re-raised below, after the header all-gather
        error = exc

    coll_device = _collective_device(group)
    headers_PH = _all_gather_ints(header, group, world_size, coll_device)
    failed = [r for r in range(world_size) if headers_PH[r][0] == 0]
    if failed:
        if error is not None:
            raise error
        raise ValueError(f"kcp_context_from_fla failed on rank(s) {failed} of the group (see the error raised "
                         f"there); every rank raises so that none waits for the others")
    for field, name in ((1, "layout"), (2, "world size"), (3, "part length (T / P, or T / 2P for zigzag)")):
        values = sorted({h[field] for h in headers_PH})
        if len(values) > 1:
            if field == 1:
                values = [n for n, i in FLA_LAYOUTS.items() if i in values]
            raise ValueError(f"kcp_context_from_fla: the FLA contexts of the ranks differ in {name} ({values}); "
                             f"they must be built from one batch with one layout")

    max_inner = max(h[7] + h[10] for h in headers_PH)
    inner_PB = [[] for _ in range(world_size)]
    if max_inner > 0:
        padded = inner + [-1] * (max_inner - len(inner))
        inner_PB = _all_gather_ints(padded, group, world_size, coll_device)
    layout = next(n for n, i in FLA_LAYOUTS.items() if i == headers_PH[0][1])
    cu = global_cu_seqlens(headers_PH, inner_PB)
    ctx = build_kcp_context(cu, layout=layout, group=group, device=device)
    assert ctx.num_local_tokens == headers_PH[rank][3] * headers_PH[rank][4]
    return ctx


def local_parts(fla_context, rank: int, world_size: int):
    """This rank's parts, read from its FLA context: ``(layout, part_len, [(slot, pre, inner)])``.

    ``slot`` is the part's chain position (its start is ``slot * part_len``), ``pre`` its
    ``pre_num_conv_tokens`` and ``inner`` the global positions of the document boundaries strictly
    inside the part, ascending.

    Raises:
        ValueError: an unknown layout, or local tables that FLA's builder cannot have made.
    """
    layout = fla_context.layout
    if layout not in FLA_LAYOUTS:
        raise ValueError(f"kcp_context_from_fla takes FLA's layouts {tuple(FLA_LAYOUTS)}, got layout {layout!r}")
    cu_cpu = fla_context.cu_seqlens_cpu if fla_context.cu_seqlens_cpu is not None else fla_context.cu_seqlens.cpu()
    cu = [int(v) for v in cu_cpu.tolist()]
    if len(cu) < 2 or cu[0] != 0 or any(b <= a for a, b in zip(cu, cu[1:])):
        raise ValueError(f"the FLA context's local cu_seqlens must rise strictly from 0, got {cu}")
    if layout == "contiguous":
        part_len = cu[-1]
        cuts = [(rank, cu, fla_context.pre_num_conv_tokens)]
    else:
        part_len, front = fla_context.part_len, fla_context.front_num_seqs
        pres = fla_context.pre_num_conv_tokens_by_part
        if not (isinstance(front, int) and 0 < front < len(cu) - 1 and cu[front] == part_len == cu[-1] - part_len):
            raise ValueError(f"the FLA zigzag context's local cu_seqlens {cu} do not split into two parts of "
                             f"part_len = {part_len} tokens at entry front_num_seqs = {front}")
        if pres is None or len(pres) != 2:
            raise ValueError(f"the FLA zigzag context needs two pre_num_conv_tokens_by_part, got {pres}")
        back = [v - part_len for v in cu[front:]]
        cuts = [(rank, cu[:front + 1], pres[0]), (2 * world_size - 1 - rank, back, pres[1])]
    parts = []
    for slot, part_cu, pre in cuts:
        start = slot * part_len
        if not isinstance(pre, int) or pre < 0 or pre > start:
            raise ValueError(f"the FLA context's pre_num_conv_tokens = {pre!r} is not a token count in [0, {start}] "
                             f"for its part at token {start}")
        parts.append((slot, pre, [start + v for v in part_cu[1:-1]]))
    return layout, part_len, parts


def encode_parts(layout: str, part_len: int, parts, world_size: int) -> tuple[list[int], list[int]]:
    """A rank's ``local_parts`` as the all-gathered header (``_HEADER`` ints) and inner boundaries."""
    header = [1, FLA_LAYOUTS[layout], world_size, part_len, len(parts)] + [0] * 6
    inner = []
    for i, (slot, pre, bounds) in enumerate(parts):
        header[5 + 3 * i: 8 + 3 * i] = [slot, pre, len(bounds)]
        inner.extend(bounds)
    return header, inner


def global_cu_seqlens(headers_PH, inner_PB) -> list[int]:
    """The global document boundaries from every rank's header and inner boundaries (step 3).

    Raises:
        ValueError: a part continues a document whose start no part reports, or another boundary
            lies between that start and the part (the ranks' contexts describe different batches).
    """
    part_len = headers_PH[0][3]
    slots = {}  # slot -> (rank, pre)
    bounds = set()
    for r, h in enumerate(headers_PH):
        offset = 0
        for i in range(h[4]):
            slot, pre, n = h[5 + 3 * i: 8 + 3 * i]
            assert slot not in slots
            slots[slot] = (r, pre)
            bounds.update(inner_PB[r][offset:offset + n])
            offset += n
            if pre == 0:
                bounds.add(slot * part_len)
    T = part_len * len(slots)
    assert sorted(slots) == list(range(len(slots)))
    bounds.update((0, T))
    cu = sorted(bounds)
    for slot, (r, pre) in sorted(slots.items()):
        if pre == 0:
            continue
        start, doc_start = slot * part_len, slot * part_len - pre
        i = bisect.bisect_left(cu, doc_start)
        if cu[i] != doc_start or cu[i + 1] <= start:
            seen = cu[i] if cu[i] != doc_start else cu[i + 1]
            raise ValueError(
                f"kcp_context_from_fla: the FLA contexts of the ranks do not describe one batch: rank {r}'s part "
                f"starting at token {start} continues a document that starts at token {doc_start} "
                f"(pre_num_conv_tokens = {pre}), but the ranks' boundaries put one at token {seen}")
    return cu


def _all_gather_ints(values, group, world_size: int, device) -> list[list[int]]:
    mine = torch.tensor(values, dtype=torch.int64, device=device)
    gathered = [torch.empty_like(mine) for _ in range(world_size)]
    dist.all_gather(gathered, mine, group=group)
    return torch.stack(gathered).cpu().tolist()
