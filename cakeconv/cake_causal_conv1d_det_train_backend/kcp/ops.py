"""Context-parallel (KCP) conv: programs, the autograd Functions, custom ops, recompute handle.

Shape legend: S local rows, C channels (C_i of tensor i of a layer, C_sum all of them), W the
conv width (2..8, ``weight.shape[1]``), D local segments, H = W - 1 halo rows, n tensors of one
layer, K rows of a halo message, F rows whose g this rank computes for the future exchange.

A rank holds fragments of the packed batch (``KcpContext``). Its rows are cut into segments
(runs of consecutive tokens of one fragment and one document). For each segment d:

    hist[d, j] = x of the token H - j rows before its first token (zero outside the document)
    fut[d, j]  = FP32 g of the token j + 1 rows after its last token (zero outside the document)

and, with rows before the segment read from hist and rows after it from fut, the single-rank math
(``act`` is SiLU with ``activation="silu"``, the identity with ``activation=None``):

    pre[t] = b + sum_{k=0..W-1} w[:, k] * x[t - H + k],     y[t] = act(pre[t])
    g[t]   = dy[t] * act'(pre[t]),      dx[t] = sum_k w[:, k] * g[t + H - k]
    dw     = sum_t g[t] * x[t - H + k],  db = sum_t g[t]        (this rank's rows: PARTIAL sums)

The halo rows of a segment may lie in several preceding (following) fragments, on several ranks
("multi-hop", fragments shorter than H tokens); they never cross a document boundary. The context
holds the exchange tables of each H (``KcpContext.plan_for_width``): those of W = 4 are built with
the context, those of another width on its first call (host work once per width and context).

Forward: the x rows other ranks need are packed (one gather per tensor into one buffer of all the
layer's tensors) and ONE exchange flies while the forward kernel computes every row as if each
segment started its document; then ``hist`` is assembled (one gather) and a small kernel rewrites
the first H rows of the segments whose document started elsewhere. Backward: a head kernel
computes g of the rows other fragments look ahead into, ONE exchange flies while the backward
kernels compute dx (without the look-ahead) and the partial dweight/dbias, then ``fut`` is
assembled and a small kernel rewrites dx of the last H rows of continued segments. (Reference
backend: the exchange completes first.) The boundary rows thus go through the single-rank kernels'
arithmetic on the same inputs: y and dx are bitwise the single-rank op's on this rank's tokens
(same backend, width and activation).

The ladder, as for the single-rank op (conv.py):

1. programs ``_forward_program`` / ``_backward_program`` on validated operands;
2. the custom ops ``cakeconv::cake_causal_conv1d_det_kcp_forward`` / ``..._backward`` (validation,
   the recompute-handle rules, rung 1) for torch.compile, which sees each as one opaque op; the
   context and the handle travel as their ``op_id`` ints (a custom op cannot take a Python object);
3. the entry points ``cake_causal_conv1d_det_(multi_)forward_kcp`` / ``..._backward_kcp``;
4. the autograd Functions ``CakeCausalConv1dDetMultiFunctionKcp`` and its one-tensor form
   ``CakeCausalConv1dDetFunctionKcp``, through one eager/compile wrapper per custom op
   (``_forward_call`` / ``_backward_call``: eager, rung 1 directly, validated once; traced, rung 2);
5. the public ``cake_causal_conv1d_det_kcp`` / ``cake_causal_conv1d_det_multi_kcp``.

The saved state is x, the taps, the biases and the received history rows [D, H, C_i]: the
backward never repeats the forward exchange.
"""

from __future__ import annotations

import itertools
from typing import List, Optional

import torch
from torch import Tensor

from .. import checks
from ..constants import MAX_WIDTH, MIN_WIDTH
from ..conv import rows_view
from ..kernels.launch import (
    backward_workspace_floats,
    triton_backward,
    triton_dx_rows,
    triton_forward,
    triton_forward_rows,
    triton_halo_gather,
    triton_head_g,
)
from ..reference import reference_dx, reference_forward, reference_g_dw
from .context import CONTEXTS, KcpContext, ObjectRegistry
from .exchange import start_exchange

__all__ = [
    "cake_causal_conv1d_det_forward_kcp",
    "cake_causal_conv1d_det_backward_kcp",
    "cake_causal_conv1d_det_multi_forward_kcp",
    "cake_causal_conv1d_det_multi_backward_kcp",
    "CakeCausalConv1dDetFunctionKcp",
    "CakeCausalConv1dDetMultiFunctionKcp",
    "RecomputeHandleDetKcp",
]

HANDLES = ObjectRegistry("RecomputeHandleDetKcp")
KEY_SINGLE = "conv"  # the handle's entry of cake_causal_conv1d_det_kcp
KEY_MULTI = "conv_multi"  # the handle's entry of cake_causal_conv1d_det_multi_kcp
NO_HANDLE = -1


class RecomputeHandleDetKcp:
    """Lets torch.utils.checkpoint's recompute of a KCP forward skip the forward halo exchange.

    Pass one handle per convolution call and micro-step (created outside the outermost checkpoint
    region, passed as an argument of the checkpointed function). The original forward exchanges as
    always and stores the received history rows (per tensor [D, W - 1, C_i], the call's width) in
    ``entries["conv"]`` (``"conv_multi"`` for the multi form); the recompute inside the backward
    reads them back, so y and the gradients are bitwise those of the same checkpoint without a
    handle. The backward still exchanges.

    A forward outside a backward that finds an entry raises (a handle reused across micro-steps);
    ``clear()`` makes the handle reusable. The exchange is a collective: every rank passes a handle
    for the same call or none.

    ``op_id``: the process-local int by which the torch custom ops find this handle; assigned once,
    at construction, from a per-process counter, and held in a weak registry (a dropped handle is
    forgotten). Under torch.compile every new handle is a new value of that int: the first new one
    causes one recompile, after which Dynamo treats the id as a dynamic int.
    """

    def __init__(self):
        self.entries: dict = {}
        self.op_id: int = HANDLES.register(self)

    def clear(self) -> None:
        """Forget the stored history rows (call between micro-steps to reuse the handle)."""
        self.entries.clear()

    def __repr__(self) -> str:
        return f"RecomputeHandleDetKcp(entries={sorted(self.entries)})"


# ------------------------------------------------------------------------------------ checks

def _check_fp32_param(pname, p, or_none, xname, x):
    """A KCP tap or bias: an FP32 tensor (TypeError) on x's device (ValueError)."""
    if not isinstance(p, torch.Tensor) or p.dtype != torch.float32:
        raise TypeError(f"{pname} must be an FP32 tensor{or_none} (the KCP contract), got "
                        f"{p.dtype if isinstance(p, torch.Tensor) else type(p).__name__}")
    if p.device != x.device:
        raise ValueError(f"{pname} is on {p.device} but {xname} is on {x.device}")


def _width_of(pname, w, C) -> int:
    """W of taps ``w`` that must be [C, W] with MIN_WIDTH <= W <= MAX_WIDTH (ValueError naming it)."""
    if w.dim() != 2 or w.shape[0] != C:
        raise ValueError(f"{pname} must be [C, W] = [{C}, W] with {MIN_WIDTH} <= W <= {MAX_WIDTH}, "
                         f"got shape {tuple(w.shape)}")
    W = w.shape[1]
    if not MIN_WIDTH <= W <= MAX_WIDTH:
        raise ValueError(f"{pname} has width W = {W} (shape {tuple(w.shape)}); the conv width must be "
                         f"{MIN_WIDTH} <= W <= {MAX_WIDTH}")
    return W


def _check_kcp(xs, weights, biases, ctx, backend, activation):
    """Validate a KCP call; returns (xs as [S, C_i] rows, contiguous taps and biases, backend,
    the context's plan of the call's width).

    All tensors of a call share one dtype and one width W (ValueError naming the widths).
    """
    if not isinstance(ctx, KcpContext):
        raise TypeError(f"ctx must be a KcpContext (from build_kcp_context), got {type(ctx).__name__}")
    checks.check_activation(activation)  # "silu" or None, else ValueError
    if len(xs) == 0:
        raise ValueError("need at least one tensor")
    if len(weights) != len(xs) or len(biases) != len(xs):
        raise ValueError(f"got {len(xs)} tensors, {len(weights)} weights and {len(biases)} biases; give one of each per tensor")
    S = ctx.plan.num_local_tokens
    multi = len(xs) > 1
    rows, ws, bs, widths = [], [], [], []
    for i, (x, w, b) in enumerate(zip(xs, weights, biases)):
        name = f"xs[{i}]" if multi else "x_local"
        checks.check_tensor(name, x, checks.X_DTYPES)
        if x.device != ctx.device:
            raise ValueError(f"{name} is on {x.device} but the KcpContext is on {ctx.device}")
        if not (x.dim() == 2 or (x.dim() == 3 and x.shape[0] == 1)):
            raise ValueError(f"{name} must be [S_local, C] or [1, S_local, C], got shape {tuple(x.shape)}")
        if x.shape[-2] != S:
            raise ValueError(f"{name} has {x.shape[-2]} rows but this rank holds S_local = {S} tokens of the context")
        C = x.shape[-1]
        if C % 8 != 0 or C == 0:
            raise ValueError(f"the channel count C must be a positive multiple of 8, got C = {C} for {name}")
        if x.dtype != xs[0].dtype:
            raise TypeError(f"all tensors of a multi call share one dtype: xs[0] is {xs[0].dtype}, {name} is {x.dtype}")
        wname = f"weights[{i}]" if multi else "weight"
        _check_fp32_param(wname, w, "", name, x)
        widths.append(_width_of(wname, w, C))
        if widths[-1] != widths[0]:
            raise ValueError(f"all tensors of a multi call share one conv width W: weights[0] has W = {widths[0]}, "
                             f"{wname} has W = {widths[-1]}")
        if b is not None:
            bname = f"biases[{i}]" if multi else "bias"
            _check_fp32_param(bname, b, " or None", name, x)
            if b.shape != (C,):
                raise ValueError(f"{bname} must be [C] = [{C}], got shape {tuple(b.shape)}")
        rows.append(rows_view(x, S, C))
        ws.append(w if w.is_contiguous() else w.contiguous())
        bs.append(b if b is None or b.is_contiguous() else b.contiguous())
    be = checks.resolve_backend(backend, ctx.device)
    return rows, ws, bs, be, ctx.plan_for_width(widths[0])


def _check_hists(hists, x_rows, plan, what="hists"):
    """History rows given by the caller: one [D, H, C_i] tensor per tensor, on x's device."""
    if len(hists) != len(x_rows):
        raise ValueError(f"got {len(hists)} {what} for {len(x_rows)} tensors")
    for i, (h, x_SC) in enumerate(zip(hists, x_rows)):
        want = (plan.num_segments, plan.halo_rows, x_SC.shape[1])
        if not isinstance(h, torch.Tensor):
            raise TypeError(f"{what}[{i}] must be a torch.Tensor, got {type(h).__name__}")
        if tuple(h.shape) != want:
            raise ValueError(f"{what}[{i}] must be [D, W - 1, C] = {list(want)} (the forward's history rows), "
                             f"got shape {tuple(h.shape)}")
        if h.device != x_SC.device:
            raise ValueError(f"{what}[{i}] is on {h.device} but its x is on {x_SC.device}")


def _check_dys(dys, xs, S):
    """The upstream gradients: one per tensor, each its x's shape and a valid dtype; as rows."""
    if len(dys) != len(xs):
        raise ValueError(f"got {len(dys)} gradients for {len(xs)} tensors")
    rows = []
    for i, (dy, x) in enumerate(zip(dys, xs)):
        name = f"dys[{i}]" if len(xs) > 1 else "dy"
        checks.check_tensor(name, dy, checks.X_DTYPES, x.device)
        if dy.shape != x.shape:
            raise ValueError(f"{name} must have the shape {tuple(x.shape)} of its x, got {tuple(dy.shape)}")
        rows.append(rows_view(dy, S, x.shape[-1]))
    return rows


# ---------------------------------------------------------------------------- 1. programs

def _offsets(widths):
    """Channel offset of each tensor in a buffer of all the layer's tensors side by side."""
    return list(itertools.accumulate(widths, initial=0))


def _gather_reference(out_KC, map_K, local_LC, recv_RC):
    """The halo gather of kernels/halo.py in torch ops (reference backend)."""
    out_KC.zero_()
    loc = map_K >= 0
    out_KC[loc] = local_LC[map_K[loc]].to(out_KC.dtype)
    rem = map_K <= -2
    if recv_RC is not None:
        out_KC[rem] = recv_RC[-2 - map_K[rem]].to(out_KC.dtype)
    return out_KC


def _gather(be, out_KC, map_K, local_LC, recv_RC=None):
    if be == "triton":
        return triton_halo_gather(out_KC, map_K, local_LC, recv_RC)
    return _gather_reference(out_KC, map_K, local_LC, recv_RC)


def _start_history(x_rows, ctx, plan, be):
    """Start ONE exchange of the x rows peers need (all tensors side by side; ``plan``'s H).

    One tensor whose messages are runs of consecutive rows sends slices of x itself; otherwise the
    rows are packed first (one gather per tensor). Returns (pending exchange, receive buffer
    [K_recv, C_sum]).
    """
    tables = plan.hist
    widths = [x.shape[1] for x in x_rows]
    x0 = x_rows[0]
    recv = torch.empty((tables.num_recv, sum(widths)), dtype=x0.dtype, device=x0.device)
    if len(x_rows) == 1 and tables.send_starts is not None and x0.is_contiguous():
        send = [x0[a:a + n] for a, (_, n) in zip(tables.send_starts, tables.sends)]
    else:
        send = torch.empty((tables.send_rows.shape[0], recv.shape[1]), dtype=x0.dtype, device=x0.device)
        for x_SC, off, C in zip(x_rows, _offsets(widths), widths):
            _gather(be, send if len(x_rows) == 1 else send[:, off:off + C], tables.send_rows, x_SC)
    return start_exchange(send, recv, tables, ctx.group, ctx.coalesce), recv


def _assemble(be, tables, local_rows, recv, dtype, num_segments, H):
    """Per tensor: its halo [D, H, C_i] from the local rows and the received ones (one gather)."""
    widths = [t.shape[1] for t in local_rows]
    halos = []
    for local, off, C in zip(local_rows, _offsets(widths), widths):
        halo = torch.empty((num_segments * H, C), dtype=dtype, device=local.device)
        part = None
        if recv.shape[0] > 0:
            part = recv if len(local_rows) == 1 else recv[:, off:off + C]
        _gather(be, halo, tables.map, local, part)
        halos.append(halo.view(-1, H, C))
    return halos


def _forward_program(xs, x_rows, weights, biases, ctx, plan, be, activation, hists=None):
    """(ys, hists): outputs of xs' shapes, and per tensor the history rows [D, H, C_i].

    ``plan``: the context's plan of the call's width (H = W - 1 = ``plan.halo_rows``). With
    ``hists`` given (a checkpoint recompute), no exchange happens.
    """
    S, cu, D, H = plan.num_local_tokens, plan.local_cu_seqlens, plan.num_segments, plan.halo_rows
    ys = [torch.empty(x.shape, dtype=x.dtype, device=x.device) for x in xs]
    y_rows = [y if y.dim() == 2 else y.view(x_SC.shape) for y, x_SC in zip(ys, x_rows)]
    if hists is not None or S == 0:
        if hists is None:
            hists = [x_SC.new_zeros((0, H, x_SC.shape[1])) for x_SC in x_rows]
        for x_SC, w, b, hist, y_SC in zip(x_rows, weights, biases, hists, y_rows):
            if S > 0:
                if be == "triton":
                    triton_forward(x_SC, w, b, cu, None, y_SC, hist_NHC=hist, activation=activation)
                else:
                    reference_forward(x_SC, w, b, cu, out_SC=y_SC, hist_NHC=hist, activation=activation)
        return ys, hists
    pending, recv = _start_history(x_rows, ctx, plan, be)
    if be == "triton":
        # Overlap: the exchange flies while the kernel computes every row as if each segment
        # started its document; then only the first H rows of continuing segments are rewritten.
        for x_SC, w, b, y_SC in zip(x_rows, weights, biases, y_rows):
            triton_forward(x_SC, w, b, cu, None, y_SC, activation=activation)
        pending.wait()
        hists = _assemble(be, plan.hist, x_rows, recv, x_rows[0].dtype, D, H)
        for x_SC, w, b, hist, y_SC in zip(x_rows, weights, biases, hists, y_rows):
            triton_forward_rows(x_SC, w, b, cu, hist, plan.fix_fwd_rows, y_SC, activation=activation)
        return ys, hists
    pending.wait()
    hists = _assemble(be, plan.hist, x_rows, recv, x_rows[0].dtype, D, H)
    for x_SC, w, b, hist, y_SC in zip(x_rows, weights, biases, hists, y_rows):
        reference_forward(x_SC, w, b, cu, out_SC=y_SC, hist_NHC=hist, activation=activation)
    return ys, hists


def _backward_program(dy_rows, xs, x_rows, weights, biases, hists, ctx, plan, be, activation,
                      dweight_dtype=torch.float32, compiled=False):
    """(dxs, dweights, dbiases): dweight/dbias are this rank's partial sums (None: no bias).

    ``plan``: the context's plan of the call's width (H = W - 1). compiled: called by the custom
    op (torch.compile; kernels/launch.py, ``TicketCounters``)."""
    S, cu, fut, D, H = plan.num_local_tokens, plan.local_cu_seqlens, plan.fut, plan.num_segments, plan.halo_rows
    W = H + 1
    widths = [x_SC.shape[1] for x_SC in x_rows]
    offsets = _offsets(widths)
    dev = x_rows[0].device
    one = len(x_rows) == 1
    # 1. g of the rows the future halos need (the first fut.num_send of them go to peers), all
    #    tensors side by side; the reference computes g, dweight and dbias of every row at once.
    g_buf = torch.empty((fut.g_rows.shape[0], sum(widths)), dtype=torch.float32, device=dev)
    ref_parts = []
    for x_SC, dy_SC, w, b, hist, off, C in zip(x_rows, dy_rows, weights, biases, hists, offsets, widths):
        g_FC = g_buf if one else g_buf[:, off:off + C]
        if be == "triton":
            triton_head_g(dy_SC, x_SC, w, b, cu, hist, fut.g_rows, g_FC, activation=activation)
        else:
            parts = reference_g_dw(dy_SC, x_SC, w, b, cu, hist_NHC=hist, activation=activation)
            ref_parts.append(parts)
            g_FC.copy_(parts[0].index_select(0, fut.g_rows))
    # 2. ONE future exchange for all tensors; on the Triton backend it flies during step 3.
    recv = torch.empty((fut.num_recv, g_buf.shape[1]), dtype=torch.float32, device=dev)
    pending = start_exchange(g_buf[:fut.num_send], recv, fut, ctx.group, ctx.coalesce)
    if be != "triton":
        pending.wait()
    # 3. dx (without the look-ahead on Triton) and the partial dweight/dbias of this rank.
    dxs, dws, dbs = [], [], []
    for i, (x, x_SC, dy_SC, w, b, hist) in enumerate(zip(xs, x_rows, dy_rows, weights, biases, hists)):
        C = widths[i]
        dx = torch.empty(x.shape, dtype=x.dtype, device=dev)
        dx_SC = dx if dx.dim() == 2 else dx.view(S, C)
        if S == 0:
            dw = torch.zeros((C, W), dtype=dweight_dtype, device=dev)
            db = torch.zeros((C,), dtype=dweight_dtype, device=dev) if b is not None else None
        elif be == "triton":
            dw = torch.empty((C, W), dtype=dweight_dtype, device=dev)
            db = torch.empty((C,), dtype=dweight_dtype, device=dev) if b is not None else None
            ws = torch.empty(backward_workspace_floats(S, C, width=W), dtype=torch.float32, device=dev)
            triton_backward(dy_SC, x_SC, w, b, cu, None, dx_SC, ws, dw, db, hist_NHC=hist,
                            tickets_in_workspace=compiled, activation=activation)
        else:
            g32, dw32, db32, w32, d_S = ref_parts[i]
            fut_i = _assemble(be, fut, [g_buf if one else g_buf[:, offsets[i]:offsets[i] + C]],
                              recv if one else recv[:, offsets[i]:offsets[i] + C], torch.float32, D, H)[0]
            dx_SC.copy_(reference_dx(g32, w32, d_S, cu, fut_NHC=fut_i))
            dw, db = dw32.to(dweight_dtype), (db32.to(dweight_dtype) if b is not None else None)
        dxs.append(dx)
        dws.append(dw)
        dbs.append(db)
    if be == "triton" and S > 0:
        pending.wait()
        futs = _assemble(be, fut, [g_buf if one else g_buf[:, off:off + C] for off, C in zip(offsets, widths)],
                         recv, torch.float32, D, H)
        for x_SC, dy_SC, w, b, hist, fut_i, dx in zip(x_rows, dy_rows, weights, biases, hists, futs, dxs):
            triton_dx_rows(dy_SC, x_SC, w, b, cu, hist, fut_i, plan.fix_bwd_rows,
                           dx if dx.dim() == 2 else dx.view(x_SC.shape), activation=activation)
    else:
        pending.wait()
    return dxs, dws, dbs


# ------------------------------------------------------------ the recompute-handle rules

def _in_backward() -> bool:
    """True while the autograd engine runs a backward on this thread (checkpoint recompute runs
    there, eager or compiled)."""
    return torch._C._current_graph_task_id() != -1


def _stored_histories(key, handle, x_rows, plan):
    """The history rows a checkpoint recompute reads back from the handle, or None (exchange).

    Raises RuntimeError (before any exchange, so no rank hangs) when the handle already holds
    ``key`` outside a backward (a handle reused across micro-steps or calls), or holds rows of
    other shapes than this call's [D, W - 1, C_i] (a handle passed to another call).
    """
    if handle is None or key not in handle.entries:
        return None
    if not _in_backward():
        raise RuntimeError(
            f"RecomputeHandleDetKcp already holds an entry {key!r} outside a backward: a handle is "
            f"reused across micro-steps or calls; create one per call and micro-step, or clear() it")
    stored = handle.entries[key]
    want = [(plan.num_segments, plan.halo_rows, x_SC.shape[1]) for x_SC in x_rows]
    if [tuple(h.shape) for h in stored] != want:
        raise RuntimeError(
            f"RecomputeHandleDetKcp entry {key!r} holds history rows of shapes {[tuple(h.shape) for h in stored]}, "
            f"but this call needs {want} ([D, W - 1, C] per tensor): the handle was filled by another call")
    return stored


def _forward_checked(xs, weights, biases, kctx, backend, handle, key, activation):
    """(ys, hists, backend) of a KCP call: validation, the recompute-handle rules, the forward
    program; ``backend`` is the resolved one ("triton" or "reference").

    No handle: the program with its exchange. A handle without ``key``: the same, and the received
    history rows are stored in ``handle.entries[key]``. A handle with ``key``, inside a backward
    (a checkpoint recompute): no exchange, the stored rows are used; outside a backward:
    RuntimeError. With a handle the returned hists are copies (the stored entry never aliases
    anything the caller or a compiler could write to).
    """
    x_rows, ws, bs, be, plan = _check_kcp(xs, weights, biases, kctx, backend, activation)
    stored = _stored_histories(key, handle, x_rows, plan)
    ys, hists = _forward_program(xs, x_rows, ws, bs, kctx, plan, be, activation, stored)
    if handle is not None:
        if stored is None:
            handle.entries[key] = hists
        hists = [h.clone() for h in hists]
    return ys, hists, be


def _backward_checked(dys, xs, weights, biases, hists, kctx, backend, activation, dweight_dtype=torch.float32,
                      compiled=False):
    """(dxs, dweights, dbiases) of a KCP call: validation, then the backward program."""
    x_rows, ws, bs, be, plan = _check_kcp(xs, weights, biases, kctx, backend, activation)
    _check_hists(hists, x_rows, plan)
    dy_rows = _check_dys(dys, xs, kctx.plan.num_local_tokens)
    return _backward_program(dy_rows, xs, x_rows, ws, bs, hists, kctx, plan, be, activation, dweight_dtype, compiled)


# --------------------------------------------------------- 2. custom ops (for torch.compile)

def _optional_biases(biases, has_bias):
    return [b if hb else None for b, hb in zip(biases, has_bias)]


@torch.library.custom_op("cakeconv::cake_causal_conv1d_det_kcp_forward", mutates_args=())
def forward_op(xs: List[Tensor], weights: List[Tensor], biases: List[Tensor], has_bias: List[bool],
               context_id: int, num_segments: int, handle_id: int, key: str, backend: str,
               activation: Optional[str] = "silu") -> List[Tensor]:
    """ys + hists: the KCP forward of n tensors with ONE halo exchange (the handle rules apply).

    A missing bias is a [0] FP32 placeholder with ``has_bias[i] = False``; ``num_segments`` (D)
    shapes the hists outputs [D, W - 1, C_i] in the fake implementation (W from the taps).
    """
    kctx = CONTEXTS.lookup(context_id)
    if num_segments != kctx.num_segments:
        raise ValueError(f"num_segments = {num_segments} but the KcpContext (op_id {context_id}) has "
                         f"D = {kctx.num_segments} local segments")
    handle = None if handle_id == NO_HANDLE else HANDLES.lookup(handle_id)
    ys, hists, _ = _forward_checked(list(xs), list(weights), _optional_biases(biases, has_bias), kctx, backend,
                                    handle, key, activation)
    return [*ys, *hists]


@forward_op.register_fake
def _forward_fake(xs, weights, biases, has_bias, context_id, num_segments, handle_id, key, backend, activation="silu"):
    return ([x.new_empty(x.shape) for x in xs]
            + [x.new_empty((num_segments, w.shape[-1] - 1, x.shape[-1])) for x, w in zip(xs, weights)])


@torch.library.custom_op("cakeconv::cake_causal_conv1d_det_kcp_backward", mutates_args=())
def backward_op(dys: List[Tensor], xs: List[Tensor], weights: List[Tensor], biases: List[Tensor],
                has_bias: List[bool], hists: List[Tensor], context_id: int, backend: str,
                activation: Optional[str] = "silu") -> List[Tensor]:
    """dxs + dweights + dbiases (FP32 partial sums; a [0] dbias where the bias is missing)."""
    kctx = CONTEXTS.lookup(context_id)
    dxs, dws, dbs = _backward_checked(list(dys), list(xs), list(weights), _optional_biases(biases, has_bias),
                                      list(hists), kctx, backend, activation, compiled=True)
    dbs = [w.new_empty((0,), dtype=torch.float32) if db is None else db for db, w in zip(dbs, weights)]
    return [*dxs, *dws, *dbs]


@backward_op.register_fake
def _backward_fake(dys, xs, weights, biases, has_bias, hists, context_id, backend, activation="silu"):
    return ([x.new_empty(x.shape) for x in xs]
            + [w.new_empty(w.shape, dtype=torch.float32) for w in weights]
            + [b.new_empty(b.shape, dtype=torch.float32) for b in biases])


def _check_operand_types(xs, weights, biases, kctx, handle, backend, activation):
    """Raise on operands the custom ops' schema cannot take (compiling only; eager validation
    names them anyway): with the eager messages where ``_check_kcp`` can name the operand."""
    if handle is not None and not isinstance(handle, RecomputeHandleDetKcp):
        raise TypeError(f"recompute_handle must be a RecomputeHandleDetKcp or None, got {type(handle).__name__}")
    checks.check_activation(activation)  # "silu" or None, else ValueError
    ok = (isinstance(kctx, KcpContext) and len(xs) > 0 and len(weights) == len(xs) and len(biases) == len(xs)
          and all(isinstance(t, Tensor) for t in (*xs, *weights))
          and all(b is None or isinstance(b, Tensor) for b in biases) and isinstance(backend, str))
    if not ok:
        _check_kcp(list(xs), list(weights), list(biases), kctx, backend, activation)
        names = lambda ts: [type(t).__name__ for t in ts]  # noqa: E731
        raise TypeError(f"KCP conv got operands it cannot take: xs {names(xs)}, weights {names(weights)}, "
                        f"biases {names(biases)}, backend {type(backend).__name__}")


# ``_forward_call`` and ``_backward_call`` are the one eager/compile wrapper of each custom op, the
# only code that asks whether torch.compile is tracing.

def _forward_call(xs, weights, biases, kctx, backend, handle, key, activation):
    """(ys, hists, eager): eager, the checked program, with ``eager`` = (the context, the resolved
    backend) for the backward; traced by torch.compile, the forward op and ``eager`` None (the
    backward op validates again when it runs)."""
    if torch.compiler.is_compiling():
        _check_operand_types(xs, weights, biases, kctx, handle, backend, activation)
        placed = [w.new_empty((0,), dtype=torch.float32) if b is None else b for b, w in zip(biases, weights)]
        out = forward_op(list(xs), list(weights), placed, [b is not None for b in biases], kctx.op_id,
                         kctx.num_segments, NO_HANDLE if handle is None else handle.op_id, key, backend, activation)
        return out[:len(xs)], out[len(xs):], None
    if handle is not None and not isinstance(handle, RecomputeHandleDetKcp):
        raise TypeError(f"recompute_handle must be a RecomputeHandleDetKcp or None, got {type(handle).__name__}")
    ys, hists, resolved = _forward_checked(xs, weights, biases, kctx, backend, handle, key, activation)
    return ys, hists, (kctx, resolved)


def _backward_call(fctx, dys):
    """(dxs, dweights, dbiases) of a saved KCP call (dbias None where the bias is missing): eager
    after an eager forward, the backward program on the forward's validation (only dy is new);
    traced by torch.compile, or after a traced forward, the backward op."""
    n = fctx.n
    saved = fctx.saved_tensors
    xs, weights, biases, hists = saved[:n], saved[n:2 * n], saved[2 * n:3 * n], saved[3 * n:]
    dys = [torch.zeros_like(x) if dy is None else dy for dy, x in zip(dys, xs)]
    if torch.compiler.is_compiling() or fctx.eager is None:
        placed = [w.new_empty((0,), dtype=torch.float32) if b is None else b for b, w in zip(biases, weights)]
        out = backward_op(dys, list(xs), list(weights), placed, fctx.has_bias, list(hists), fctx.context_id,
                          fctx.backend, fctx.activation)
        dbs = [db if hb else None for db, hb in zip(out[2 * n:], fctx.has_bias)]
        return list(out[:n]), list(out[n:2 * n]), dbs
    kctx, resolved = fctx.eager
    S = kctx.plan.num_local_tokens
    dy_rows = _check_dys(dys, xs, S)
    x_rows = [rows_view(x, S, x.shape[-1]) for x in xs]
    ws = [w if w.is_contiguous() else w.contiguous() for w in weights]
    bs = [b if b is None or b.is_contiguous() else b.contiguous() for b in biases]
    plan = kctx.plan_for_width(ws[0].shape[1])
    return _backward_program(dy_rows, list(xs), x_rows, ws, bs, list(hists), kctx, plan, resolved, fctx.activation)


# ------------------------------------------------------------------------- 3. entry points

def cake_causal_conv1d_det_multi_forward_kcp(xs, weights, ctx, biases=None, *, activation="silu", backend="auto",
                                             hists=None):
    """Forward of several tensors of one layer with ONE halo exchange (no autograd).

    ``ys[i][t] = act(biases[i] + sum_{k=0..W-1} weights[i][:, k] * xs[i][t - (W - 1) + k])`` per
    document of the context, rows of other fragments through the halo (module docstring).

    Args:
        xs: list of [S_local, C_i] or [1, S_local, C_i] local rows (one dtype), in ctx's order.
        weights: list of FP32 [C_i, W], one width 2 <= W <= 8 for all. biases: list of FP32 [C_i]
            or None (or None for all).
        ctx: the KcpContext. activation: "silu" (default) or None (the identity).
        hists: history rows [D, W - 1, C_i] from an earlier exchange (recompute); when given, no
            exchange happens.

    Returns:
        (ys, hists): outputs of xs' shapes and dtype, and the per-tensor history rows
        [D, W - 1, C_i].

    Raises:
        ValueError / TypeError: bad operands (a width outside 2..8, different widths, an unknown
            activation: named in the message), before any exchange.
    """
    xs, weights = list(xs), list(weights)
    biases = list(biases) if biases is not None else [None] * len(xs)
    x_rows, ws, bs, be, plan = _check_kcp(xs, weights, biases, ctx, backend, activation)
    if hists is not None:
        hists = list(hists)
        _check_hists(hists, x_rows, plan)
    return _forward_program(xs, x_rows, ws, bs, ctx, plan, be, activation, hists)


def cake_causal_conv1d_det_multi_backward_kcp(dys, xs, weights, ctx, biases=None, *, hists, activation="silu",
                                              backend="auto", dweight_dtype=torch.float32):
    """Backward of the multi form with ONE (future) halo exchange.

    ``g = dys[i] * act'(pre)`` (``g = dys[i]`` without activation), ``dx[t] = sum_k w[:, k] *
    g[t + W - 1 - k]`` with g rows of other fragments through the halo, and this rank's
    ``dw[:, k] = sum_t g[t] x[t - (W - 1) + k]``, ``db = sum_t g[t]``.

    Args:
        dys: gradients of the outputs (xs' shapes). hists: the forward's history rows
            [D, W - 1, C_i]. activation: the forward's ("silu" or None).

    Returns:
        (dxs, dweights, dbiases): dweight/dbias are this rank's partial sums (FP32 summed, returned
        in ``dweight_dtype``); the framework all-reduces them like any gradient. dbias entries are
        None where the bias is None.
    """
    xs, weights = list(xs), list(weights)
    biases = list(biases) if biases is not None else [None] * len(xs)
    return _backward_checked(list(dys), xs, weights, biases, list(hists), ctx, backend, activation, dweight_dtype)


def cake_causal_conv1d_det_forward_kcp(x_local, weight, ctx, bias=None, *, activation="silu", backend="auto",
                                       hist=None):
    """Single-tensor forward: (y, hist [D, W - 1, C]); see cake_causal_conv1d_det_multi_forward_kcp."""
    ys, hists = cake_causal_conv1d_det_multi_forward_kcp(
        [x_local], [weight], ctx, [bias], activation=activation, backend=backend,
        hists=None if hist is None else [hist])
    return ys[0], hists[0]


def cake_causal_conv1d_det_backward_kcp(dy, x_local, weight, ctx, bias=None, *, hist, activation="silu",
                                        backend="auto", dweight_dtype=torch.float32):
    """Single-tensor backward: (dx, dweight, dbias); see cake_causal_conv1d_det_multi_backward_kcp."""
    dxs, dws, dbs = cake_causal_conv1d_det_multi_backward_kcp(
        [dy], [x_local], [weight], ctx, [bias], hists=[hist], activation=activation, backend=backend,
        dweight_dtype=dweight_dtype)
    return dxs[0], dws[0], dbs[0]


# ----------------------------------------------------------------- 4. autograd Functions

def _save(fctx, xs, weights, biases, hists, kctx, backend, eager, activation):
    """What the backward needs: the operands, the history rows, and ``eager`` (``_forward_call``'s:
    the context itself and the validated backend after an eager forward; a traced graph holds only
    the context's id)."""
    fctx.n = len(xs)
    fctx.backend = backend
    fctx.activation = activation
    fctx.eager = eager
    fctx.has_bias = [b is not None for b in biases]
    fctx.context_id = kctx.op_id
    fctx.save_for_backward(*xs, *weights, *biases, *hists)


class CakeCausalConv1dDetMultiFunctionKcp(torch.autograd.Function):
    """KCP conv1d (+ SiLU) of n tensors of one layer: one exchange forward, one backward.

    ==============  =====================  ==============================================
    operand         shape                  notes
    ==============  =====================  ==============================================
    xs[i]           [S, C_i] | [1, S, C_i]  bf16/fp16/fp32, this rank's rows in ctx's order
    weights[i]      [C_i, W]               FP32, one width 2 <= W <= 8 for all tensors
    biases[i]       [C_i] or None          FP32
    ys[i]           xs[i]'s shape           xs' dtype
    hist (saved)    [D, W - 1, C_i]        x rows before each local segment
    ==============  =====================  ==============================================

    Forward: ``y = act(b + sum_k w[:, k] * x[t - (W - 1) + k])`` (act: SiLU, or the identity with
    activation None) with x rows before a segment's first token read from hist (exchanged).
    Backward: g (``dy * act'(pre)``) of the rows others need, one exchange of those FP32 g rows,
    then ``dx[t] = sum_k w[:, k] * g[t + W - 1 - k]`` with g rows past the segment read from fut,
    and the partial ``dw = sum_t g[t] x[t - (W - 1) + k]``, ``db = sum_t g[t]`` of this rank.

    ``apply(kctx, backend, handle, n, *xs, *weights, *biases[, activation])``: the activation
    ("silu" or None) may follow the 3n tensors (an autograd Function takes no keyword; without it,
    "silu"). Eager, the forward validates once and runs the programs; under torch.compile it calls
    the custom ops (module docstring), so both give the same bits and compile without a graph break.
    """

    @staticmethod
    def forward(ctx, kctx, backend, handle, n, *args):
        if len(args) not in (3 * n, 3 * n + 1):
            raise ValueError(f"apply takes n = {n} tensors, taps and biases (and optionally the activation) "
                             f"after n, got {len(args)} arguments")
        activation = args[3 * n] if len(args) == 3 * n + 1 else "silu"
        xs, weights, biases = list(args[:n]), list(args[n:2 * n]), list(args[2 * n:3 * n])
        ys, hists, eager = _forward_call(xs, weights, biases, kctx, backend, handle, KEY_MULTI, activation)
        _save(ctx, xs, weights, biases, hists, kctx, backend, eager, activation)
        return tuple(ys)

    @staticmethod
    def backward(ctx, *dys):
        dxs, dws, dbs = _backward_call(ctx, dys)
        extra = (None,) * (len(ctx.needs_input_grad) - 4 - 3 * ctx.n)  # the activation, when given
        return (None, None, None, None, *dxs, *dws, *dbs, *extra)


class CakeCausalConv1dDetFunctionKcp(torch.autograd.Function):
    """KCP conv1d (+ SiLU) of one tensor (the multi Function's programs with n = 1).

    Shapes and math as ``CakeCausalConv1dDetMultiFunctionKcp``; the recompute handle key is
    ``"conv"``. ``apply(x_local, weight, bias, kctx, backend, handle, activation="silu")`` gives
    bitwise the y and gradients of ``cake_causal_conv1d_det_kcp``, and those of the multi form's
    entry for the same tensor.
    """

    @staticmethod
    def forward(ctx, x_local, weight, bias, kctx, backend, handle, activation="silu"):
        ys, hists, eager = _forward_call([x_local], [weight], [bias], kctx, backend, handle, KEY_SINGLE, activation)
        _save(ctx, [x_local], [weight], [bias], hists, kctx, backend, eager, activation)
        return ys[0]

    @staticmethod
    def backward(ctx, dy):
        dxs, dws, dbs = _backward_call(ctx, (dy,))
        return (dxs[0], dws[0], dbs[0], None, None, None) + (None,) * (len(ctx.needs_input_grad) - 6)


# ------------------------------------------------------------------- 5. the public ops

def _needs_grad(tensors) -> bool:
    return torch.is_grad_enabled() and any(t is not None and getattr(t, "requires_grad", False) for t in tensors)


def cake_causal_conv1d_det_kcp(x_local, weight, ctx, *, bias=None, activation="silu", recompute_handle=None,
                               backend="auto"):
    """Autograd-enabled KCP causal conv1d (+ SiLU) of this rank's fragments, any width 2..8.

    For token t of document d (global ``cu_seqlens`` of the context), in FP32, with W =
    ``weight.shape[1]``: ``pre[t] = bias + sum_{k=0..W-1} weight[:, k] * x[t - (W - 1) + k]`` and
    ``y[t] = silu(pre[t])`` (``activation="silu"``) or ``pre[t]`` (``activation=None``), rows
    before the document's start read as zero, rounded once to x's dtype. The W - 1 rows before a
    fragment's first token that another fragment holds (on this or another rank, over as many
    fragments and ranks as it takes, never across a document boundary) come through the halo
    exchange, so the result is bitwise the single-rank op of the whole batch restricted to this
    rank's rows.

    Args:
        x_local: [S_local, C] or [1, S_local, C] (bf16, fp16 or fp32), this rank's rows in the
            context's local order (``ctx.shard(x_global)``); C a multiple of 8.
        weight: FP32 [C, W] taps, 2 <= W <= 8 (other dtypes raise TypeError; other widths
            ValueError naming W).
        ctx: the ``KcpContext`` of this batch (``build_kcp_context``).
        bias: optional FP32 [C].
        activation: "silu" (default) or None; other values raise ValueError naming the value.
        recompute_handle: optional ``RecomputeHandleDetKcp``; under torch.utils.checkpoint the
            recompute then reuses the forward's history rows instead of exchanging again. All ranks
            pass a handle for the same call or none.
        backend: "auto", "triton" or "reference".

    Returns:
        y of x_local's shape and dtype. Backward: dx of this rank's rows (bitwise the single-rank
        dx), and dweight/dbias as this rank's PARTIAL sums (FP32): the training framework reduces
        them over the data- and context-parallel group as it does for every parameter.

    Eager and ``torch.compile(fullgraph=True)`` give the same bits (compiled, the op is the custom
    op ``torch.ops.cakeconv.cake_causal_conv1d_det_kcp_forward``, with no graph break), also with a
    recompute handle under ``torch.utils.checkpoint`` inside or around the compiled code. Keep
    ``ctx`` alive until the backward has run (a compiled graph refers to it by its ``op_id`` only).
    The first call of a width other than 4 builds the context's exchange tables of that width (host
    work, once per width and context; ``KcpContext.plan_for_width``): make one eager call of each
    width before capturing a CUDA graph. The exchange is a collective: every rank must make the
    same KCP calls in the same order. A rank that raises before its exchange (bad input on that
    rank) leaves its peers waiting until the process group's timeout ends them with an error
    (docs/kcp.md, "When a rank fails").
    """
    if _needs_grad((x_local, weight, bias)):
        return CakeCausalConv1dDetFunctionKcp.apply(x_local, weight, bias, ctx, backend, recompute_handle, activation)
    return _forward_call([x_local], [weight], [bias], ctx, backend, recompute_handle, KEY_SINGLE, activation)[0][0]


def cake_causal_conv1d_det_multi_kcp(xs, weights, ctx, *, biases=None, activation="silu", recompute_handle=None,
                                     backend="auto"):
    """Several tensors of one layer (e.g. q, k, v, each with its own C and taps) in one call.

    One halo exchange in the forward and one in the backward serve all tensors (their boundary
    rows travel side by side along channels). The tensors share one width W (``weights[i]`` all
    [C_i, W]; different widths raise ValueError naming them) and the activation. Every output and
    gradient is bitwise the one of ``cake_causal_conv1d_det_kcp`` on that tensor alone. Arguments
    as there, as lists (one dtype for all xs); ``biases`` is None or a list with None entries
    allowed.

    Returns:
        tuple of outputs, one per tensor.
    """
    xs, weights = list(xs), list(weights)
    biases = list(biases) if biases is not None else [None] * len(xs)
    if len(weights) != len(xs) or len(biases) != len(xs):
        raise ValueError(f"got {len(xs)} tensors, {len(weights)} weights and {len(biases)} biases; give one of each per tensor")
    if _needs_grad((*xs, *weights, *biases)):
        return CakeCausalConv1dDetMultiFunctionKcp.apply(ctx, backend, recompute_handle, len(xs), *xs, *weights,
                                                         *biases, activation)
    return tuple(_forward_call(xs, weights, biases, ctx, backend, recompute_handle, KEY_MULTI, activation)[0])
