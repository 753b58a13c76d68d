"""Halo exchange for the context-parallel ("KCP") causal conv1d: point-to-point, fully pre-indexed.

``halo_exchange`` moves rows of a per-rank ``values`` array into a per-rank halo buffer, as an
``ExchangeSpec`` (kcp_plan.py) describes: local index copies for the rank's own rows, one send and
one receive per peer that has rows to move (``dist.batch_isend_irecv``, peers in increasing rank
order). A rank only talks to the ranks its fragments border, so the cost does not grow with the
number of ranks. Works on gloo (CPU tensors) and NCCL (CUDA tensors).

No host sync and no host reads of device data: every index tensor was placed on the device at plan
time and every message length is a tensor size (host metadata). With NCCL this makes the call
capturable in a CUDA graph once the peers' connections exist (the context's build-time collective
and an eager warm-up call set them up).

Message matching: between a pair (q, r) there is at most one message per direction per call, and
both ends derive its length and order from the same global table, so sends and receives pair up
whatever order the backend matches in. All ranks that share rows must call the exchange the same
number of times, in the same order (it is a collective in all but name).

Shape legend: V values rows (num_values), N halo slots (n_seg * H), C channels (or any trailing
shape), K one message's rows.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .plan import ExchangeSpec


class PendingExchange:
    """An exchange in flight; ``wait()`` finishes it and returns the filled halo buffer.

    The self copies are already in the buffer when the handle is returned; the peers' rows are
    written by ``wait()`` (after the receives complete, on the current stream). ``wait()`` may be
    called more than once; later calls return the same buffer.
    """

    def __init__(self, out_NC: torch.Tensor, works: list, recvs: list[tuple[torch.Tensor, torch.Tensor]], sends: list[torch.Tensor]):
        self._out_NC = out_NC
        self._works = works
        self._recvs = recvs  # (recv_slot_K, recv_buf_KC) per receiving peer
        self._sends = sends  # keeps the send buffers alive until the sends complete
        self._done = False

    def wait(self) -> torch.Tensor:
        if not self._done:
            for work in self._works:
                work.wait()
            for slots_K, buf_KC in self._recvs:
                self._out_NC.index_copy_(0, slots_K, buf_KC)
            self._works, self._recvs, self._sends = [], [], []
            self._done = True
        return self._out_NC


def start_halo_exchange(
    values_VC: torch.Tensor,
    spec: ExchangeSpec,
    n_slots: int,
    group=None,
    *,
    out: torch.Tensor | None = None,
) -> PendingExchange:
    """Start a halo exchange; see ``halo_exchange``. Returns a handle whose ``wait()`` gives the buffer."""
    if values_VC.dim() < 1 or values_VC.shape[0] != spec.num_values:
        raise ValueError(
            f"halo exchange values must have {spec.num_values} rows (the spec's num_values), got shape "
            f"{tuple(values_VC.shape)}"
        )
    if n_slots != spec.num_slots:
        raise ValueError(f"halo exchange n_slots = {n_slots} does not match the spec's num_slots = {spec.num_slots}")
    out_shape = (n_slots,) + tuple(values_VC.shape[1:])
    if out is None:
        out_NC = values_VC.new_zeros(out_shape)
    else:
        if tuple(out.shape) != out_shape or out.dtype != values_VC.dtype or out.device != values_VC.device:
            raise ValueError(
                f"halo exchange out must be {out_shape} {values_VC.dtype} on {values_VC.device}, got "
                f"{tuple(out.shape)} {out.dtype} on {out.device}"
            )
        out_NC = out
        out_NC.zero_()

    if spec.self_dst_slot.numel() > 0:
        out_NC.index_copy_(0, spec.self_dst_slot, values_VC.index_select(0, spec.self_src_idx))

    ops, recvs, sends = [], [], []
    for q in spec.peers:
        send_idx_K = spec.send_idx[q]
        recv_slot_K = spec.recv_slot[q]
        if send_idx_K.numel() > 0:
            send_KC = values_VC.index_select(0, send_idx_K).contiguous()
            sends.append(send_KC)
            ops.append(_p2p_op(dist.isend, send_KC, q, group))
        if recv_slot_K.numel() > 0:
            recv_KC = values_VC.new_empty((recv_slot_K.numel(),) + tuple(values_VC.shape[1:]))
            recvs.append((recv_slot_K, recv_KC))
            ops.append(_p2p_op(dist.irecv, recv_KC, q, group))
    works = dist.batch_isend_irecv(ops) if ops else []
    return PendingExchange(out_NC, works, recvs, sends)


def halo_exchange(
    values_VC: torch.Tensor,
    spec: ExchangeSpec,
    n_slots: int,
    group=None,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Fill a halo buffer from the rows of every rank's ``values`` array.

    Args:
        values_VC: [num_values, C] this rank's source rows (``x_local`` for the history exchange,
            ``g_send`` for the future exchange); any dtype, any trailing shape.
        spec: this rank's ExchangeSpec, index tensors on ``values_VC.device``.
        n_slots: rows of the buffer (n_seg * H; must equal ``spec.num_slots``).
        group: the process group of the plan; None with no peers means no communication
            (a 1-rank context), None with peers means the default group.
        out: optional preallocated [n_slots, C] buffer of values' dtype and device; it is
            zeroed and filled.

    Returns:
        [n_slots, C]: slot ``d*H + j`` holds the source row named by the plan's table, zero where
        the table says -1.

    Raises:
        ValueError: shapes that do not match the spec.
    """
    return start_halo_exchange(values_VC, spec, n_slots, group, out=out).wait()


def _p2p_op(op, tensor: torch.Tensor, group_peer: int, group) -> "dist.P2POp":
    if group is None:
        # The default group: its group ranks are the global ranks.
        return dist.P2POp(op, tensor, peer=group_peer)
    return dist.P2POp(op, tensor, group=group, group_peer=group_peer)
