"""The halo messages of the KCP conv: one send and one receive per peer, started together.

Shape legend: K rows of a send or receive buffer, C channels (all tensors of a layer together).

``start_exchange(send_KC, recv_KC, tables, group)`` sends ``send_KC[off : off + n]`` to each
``(peer, n)`` of ``tables.sends`` and receives ``recv_KC[off : off + n]`` from each ``(peer, n)`` of
``tables.recvs`` (plan.py ``HaloTables``), as one batch: with NCCL the sends and receives are
coalesced into one group launch (so their order cannot deadlock), with gloo each is its own
request. Peers are GROUP ranks (the plan is built from the group's rank and size), which is what
``ProcessGroup.send`` / ``recv`` take. Nothing here reads device data on the host or synchronizes,
so the exchange can be captured in a CUDA graph once the peers' connections exist (the context's
build-time collective and an eager warm-up call set them up).

The calls go straight to the process group object (``group.send``, ``group.recv`` and, for NCCL,
``group._start_coalescing`` / ``_end_coalescing``, what ``dist.batch_isend_irecv`` calls after its
per-operation checks), which saves most of the host time of a small exchange; torch builds without
those methods fall back to ``dist.batch_isend_irecv``.

Failure: a rank that does not reach the exchange (it raised before, e.g. on bad input) leaves its
peers waiting. They end with an error when the process group's timeout (``init_process_group(...,
timeout=...)``) expires: gloo raises from ``wait()``; NCCL's watchdog aborts the communicator and
the process (TORCH_NCCL_ASYNC_ERROR_HANDLING, on by default) and reports the timed-out operation.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


class PendingExchange:
    """An exchange in flight; ``wait()`` completes it (on the current stream for NCCL)."""

    __slots__ = ("_works", "_keep")

    def __init__(self, works: list, keep: tuple):
        self._works = works
        self._keep = keep  # the buffers, alive until the transfers complete

    def wait(self) -> None:
        for work in self._works:
            work.wait()
        self._works = []
        self._keep = ()


_NOTHING = PendingExchange([], ())


def coalescing(group, device: torch.device) -> bool:
    """Whether ``group`` batches point-to-point operations on ``device`` (NCCL does, gloo not)."""
    if group is None or not hasattr(group, "_start_coalescing"):
        return False
    try:
        return bool(group._get_backend(device).supports_coalescing)
    except (AttributeError, RuntimeError):
        return False


def start_exchange(send_KC, recv_KC: torch.Tensor, tables, group, coalesce: bool) -> PendingExchange:
    """Start the messages of ``tables`` (a plan.HaloTables) between this rank and its peers.

    Args:
        send_KC: [tables.num_send, C] rows to send, peer after peer (contiguous); or a list with
            one contiguous [n, C] tensor per message of ``tables.sends``.
        recv_KC: [tables.num_recv, C] buffer that receives, peer after peer (contiguous).
        group: the process group (None: a 1-rank context, which has no peers).
        coalesce: ``coalescing(group, device)``, computed once by the context.

    Returns:
        A PendingExchange; ``recv_KC`` holds the rows once ``wait()`` returned.
    """
    sends, recvs = tables.sends, tables.recvs
    if not sends and not recvs:
        return _NOTHING
    if group is None:
        raise RuntimeError("the KCP plan has peers but the context has no process group")
    if not hasattr(group, "send"):  # not a ProcessGroup object: the public API
        return _batch_isend_irecv(send_KC, recv_KC, sends, recvs, group)
    messages = _messages(send_KC, sends)
    device = recv_KC.device
    if coalesce:
        group._start_coalescing(device)
    works = []
    for (peer, _), message in zip(sends, messages):
        works.append(group.send([message], peer, 0))
    off = 0
    for peer, n in recvs:
        works.append(group.recv([recv_KC[off:off + n]], peer, 0))
        off += n
    if coalesce:
        works = [group._end_coalescing(device)]
    return PendingExchange(works, (send_KC, recv_KC))


def _messages(send_KC, sends) -> list:
    """One tensor per message: the given list, or slices of the packed buffer."""
    if isinstance(send_KC, (list, tuple)):
        return list(send_KC)
    out, off = [], 0
    for _, n in sends:
        out.append(send_KC[off:off + n])
        off += n
    return out


def _batch_isend_irecv(send_KC, recv_KC, sends, recvs, group) -> PendingExchange:
    ops = []
    for (peer, _), message in zip(sends, _messages(send_KC, sends)):
        ops.append(dist.P2POp(dist.isend, message, group=group, group_peer=peer))
    off = 0
    for peer, n in recvs:
        ops.append(dist.P2POp(dist.irecv, recv_KC[off:off + n], group=group, group_peer=peer))
        off += n
    return PendingExchange(dist.batch_isend_irecv(ops), (send_KC, recv_KC))
