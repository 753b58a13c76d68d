"""Context-parallel (KCP) programs: halo exchange + the single-rank kernels on local segments.

Shape legend: S local rows, C channels (per tensor), D local segments, H = 3 halo rows,
K rows this rank sends in the history exchange, F rows it sends in the future exchange, n tensors.

A rank holds fragments of the packed batch (``KcpContext``). Its rows are cut into segments
(runs of consecutive tokens of one fragment and one document). For each segment d:

    hist[d, j] = x of the token 3 - j rows before its first token (zero outside the document)
    fut[d, j]  = FP32 g of the token j rows after its last token (zero outside the document)

Forward: ONE exchange brings ``hist`` (x rows of every tensor of the layer, concatenated along
channels) while the forward kernel computes every local row as if each segment started its
document; then a small kernel rewrites the first rows of the segments whose document started
elsewhere, reading hist. Backward: a head kernel computes g for the rows other fragments need
(``fut_rows``), ONE exchange brings ``fut`` while the backward kernel computes dx (without the
look-ahead halo) and the partial dweight/dbias, then a small kernel rewrites dx of the last rows of
the segments whose document goes on elsewhere. (On the reference backend the exchange simply
completes first.) The boundary rows thus go through the very arithmetic of the single-rank kernel on
the very same inputs: y and dx are bitwise the single-rank op's on this rank's tokens (same
backend). dweight/dbias are this rank's partial sums (FP32, fixed order within the rank); the
training framework reduces them over the data- and context-parallel group like every gradient.

Autograd: the public ops and the Functions below call the torch custom ops of kcp_custom_ops.py
(the context and the recompute handle travel as their ``op_id`` ints), whose real implementations
call ``forward_with_handle`` (the recompute-handle rules, then the forward program above; the
forward is overlapped with its exchange on Triton whenever it exchanges) and
``cake_causal_conv1d_det_multi_backward_kcp``. The saved state is x, the taps, the biases and the
received history rows [D, 3, C_i]: the backward never repeats the forward exchange.
"""

from __future__ import annotations

import torch

from .. import checks
from . import custom_ops as kcp_custom_ops
from .context import KcpContext, ObjectRegistry
from .exchange import start_halo_exchange
from ..ops import _rows
from ..reference import reference_dx, reference_forward, reference_g_dw
from ..kernels.launch import (
    backward_workspace_floats,
    triton_backward,
    triton_dx_rows,
    triton_forward,
    triton_forward_rows,
    triton_head_g,
)

__all__ = [
    "cake_causal_conv1d_det_forward_kcp",
    "cake_causal_conv1d_det_backward_kcp",
    "cake_causal_conv1d_det_multi_forward_kcp",
    "cake_causal_conv1d_det_multi_backward_kcp",
    "CakeCausalConv1dDetFunctionKcp",
    "CakeCausalConv1dDetMultiFunctionKcp",
    "RecomputeHandleDetKcp",
]

H = 3
HANDLES = ObjectRegistry("RecomputeHandleDetKcp")
KEY_SINGLE = "conv"  # the handle's entry of cake_causal_conv1d_det_kcp
KEY_MULTI = "conv_multi"  # the handle's entry of cake_causal_conv1d_det_multi_kcp


class RecomputeHandleDetKcp:
    """Lets torch.utils.checkpoint's recompute of a KCP forward skip the forward halo exchange.

    Pass one handle per convolution call and micro-step (created outside the outermost checkpoint
    region, passed as an argument of the checkpointed function). The original forward exchanges as
    always and stores the received history rows in ``entries["conv"]`` (``"conv_multi"`` for the
    multi form); the recompute inside the backward reads them back, so y and the gradients are
    bitwise those of the same checkpoint without a handle. The backward still exchanges.

    A forward outside a backward that finds an entry raises (a handle reused across micro-steps);
    ``clear()`` makes the handle reusable. The exchange is a collective: every rank passes a handle
    for the same call or none.

    ``op_id``: the process-local int by which the torch custom ops (kcp_custom_ops.py) find this
    handle (a custom op cannot take a Python object); assigned once, at construction, from a
    per-process counter, and held in a weak registry (a dropped handle is forgotten).
    Under torch.compile every new handle is a new value of that int: the first new one causes one
    recompile, after which Dynamo treats the id as a dynamic int.
    """

    def __init__(self):
        self.entries: dict = {}
        self.op_id: int = HANDLES.register(self)

    def clear(self) -> None:
        """Forget the stored history rows (call between micro-steps to reuse the handle)."""
        self.entries.clear()

    def __repr__(self) -> str:
        return f"RecomputeHandleDetKcp(entries={sorted(self.entries)})"


def _in_backward() -> bool:
    """True while the autograd engine runs a backward (checkpoint recompute happens there)."""
    return torch._C._current_graph_task_id() != -1


# --------------------------------------------------------------------------------------- checks

def _check_fp32_param(pname, p, shape, shape_text, or_none, xname, x):
    """A KCP tap or bias: an FP32 tensor on x's device with ``shape`` (TypeError, then ValueError)."""
    if not isinstance(p, torch.Tensor) or p.dtype != torch.float32:
        raise TypeError(f"{pname} must be an FP32 tensor{or_none} (the KCP contract), got "
                        f"{p.dtype if isinstance(p, torch.Tensor) else type(p).__name__}")
    if p.device != x.device:
        raise ValueError(f"{pname} is on {p.device} but {xname} is on {x.device}")
    if tuple(p.shape) != shape:
        want = ", ".join(str(n) for n in shape)
        raise ValueError(f"{pname} must be {shape_text} = [{want}], got shape {tuple(p.shape)}")


def _check_kcp(xs, weights, biases, ctx, backend):
    """Validate a KCP call; returns (xs as [S, C] rows, resolved backend)."""
    if not isinstance(ctx, KcpContext):
        raise TypeError(f"ctx must be a KcpContext (from build_kcp_context), got {type(ctx).__name__}")
    if len(xs) == 0:
        raise ValueError("need at least one tensor")
    if len(weights) != len(xs) or len(biases) != len(xs):
        raise ValueError(f"got {len(xs)} tensors, {len(weights)} weights and {len(biases)} biases; give one of each per tensor")
    S = ctx.num_local_tokens
    rows = []
    for i, (x, w, b) in enumerate(zip(xs, weights, biases)):
        name = f"xs[{i}]" if len(xs) > 1 else "x_local"
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
        _check_fp32_param(f"weights[{i}]" if len(xs) > 1 else "weight", w, (C, 4), "[C, 4]", "", name, x)
        if b is not None:
            _check_fp32_param(f"biases[{i}]" if len(xs) > 1 else "bias", b, (C,), "[C]", " or None", name, x)
        rows.append(_rows(x, S, C))
    return rows, checks.resolve_backend(backend, ctx.device)


# ------------------------------------------------------------------------------------- programs

def _split_channels(buf_NC, widths):
    """Per-tensor contiguous [D, H, C_i] views of a [D*H, sum C_i] halo buffer."""
    out, off = [], 0
    for C in widths:
        out.append(buf_NC[:, off:off + C].contiguous().view(-1, H, C))
        off += C
    return out


def start_history_exchange(x_rows, ctx):
    """Start ONE history exchange for all tensors; ``.wait()`` gives the [D*H, sum C_i] buffer."""
    vals_KC = torch.cat([x.index_select(0, ctx.hist_rows) for x in x_rows], 1)
    return start_halo_exchange(vals_KC, ctx.hist_exchange_compact, ctx.num_slots, ctx.group)


def exchange_history(x_rows, ctx):
    """ONE history exchange for all tensors; returns per tensor hist [D, H, C_i] (x's dtype)."""
    return _split_channels(start_history_exchange(x_rows, ctx).wait(), [x.shape[1] for x in x_rows])


def cake_causal_conv1d_det_multi_forward_kcp(xs, weights, ctx, biases=None, *, backend="auto", hists=None):
    """Forward of several tensors of one layer with ONE halo exchange.

    Args:
        xs: list of [S_local, C_i] or [1, S_local, C_i] local rows (one dtype), in ctx's order.
        weights: list of FP32 [C_i, 4]. biases: list of FP32 [C_i] or None (or None for all).
        ctx: the KcpContext. hists: history rows from an earlier exchange (recompute); when given,
            no exchange happens.

    Returns:
        (ys, hists): outputs of xs' shapes and dtype, and the per-tensor history rows [D, 3, C_i].
    """
    biases = list(biases) if biases is not None else [None] * len(xs)
    x_rows, be = _check_kcp(list(xs), list(weights), biases, ctx, backend)
    return _forward_rows(list(xs), x_rows, list(weights), biases, ctx, be, hists)


def _forward_rows(xs, x_rows, weights, biases, ctx, be, hists):
    """The forward program on validated operands (x_rows: xs as [S, C_i]; be: resolved backend)."""
    cu = ctx.local_cu_seqlens
    ys = [torch.empty(x.shape, dtype=x.dtype, device=x.device) for x in xs]
    y_rows = [y.view(x_SC.shape) for y, x_SC in zip(ys, x_rows)]
    S = ctx.num_local_tokens
    if hists is None and be == "triton":
        # Overlap: the exchange flies while the kernel computes every row as if each segment
        # started its document; then only the first rows of continuing segments are rewritten.
        pending = start_history_exchange(x_rows, ctx)
        for x_SC, w, b, y_SC in zip(x_rows, weights, biases, y_rows):
            if S > 0:
                triton_forward(x_SC, w, b, cu, None, y_SC)
        hists = _split_channels(pending.wait(), [x.shape[1] for x in x_rows])
        for x_SC, w, b, hist, y_SC in zip(x_rows, weights, biases, hists, y_rows):
            if S > 0:
                triton_forward_rows(x_SC, w, b, cu, hist, ctx.fix_fwd_rows, y_SC)
        return ys, hists
    if hists is None:
        hists = exchange_history(x_rows, ctx)
    for x_SC, w, b, hist, y_SC in zip(x_rows, weights, biases, hists, y_rows):
        if S > 0:
            if be == "triton":
                triton_forward(x_SC, w, b, cu, None, y_SC, hist_NHC=hist)
            else:
                reference_forward(x_SC, w, b, cu, out_SC=y_SC, hist_NHC=hist)
    return ys, hists


def cake_causal_conv1d_det_multi_backward_kcp(dys, xs, weights, ctx, biases=None, *, hists,
                                              backend="auto", dweight_dtype=torch.float32):
    """Backward of the multi form with ONE (future) halo exchange.

    Args:
        dys: gradients of the outputs (xs' shapes). hists: the forward's history rows.

    Returns:
        (dxs, dweights, dbiases): dweight/dbias are this rank's partial sums (FP32 summed, returned
        in ``dweight_dtype``); the framework all-reduces them like any gradient. dbias entries are
        None where the bias is None.
    """
    biases = list(biases) if biases is not None else [None] * len(xs)
    x_rows, be = _check_kcp(list(xs), list(weights), biases, ctx, backend)
    S = ctx.num_local_tokens
    dy_rows = []
    for i, (dy, x) in enumerate(zip(dys, xs)):
        checks.check_tensor(f"dys[{i}]", dy, checks.X_DTYPES, x.device)
        if tuple(dy.shape) != tuple(x.shape):
            raise ValueError(f"dys[{i}] must have the shape {tuple(x.shape)} of its x, got {tuple(dy.shape)}")
        dy_rows.append(_rows(dy, S, x.shape[-1]))
    cu = ctx.local_cu_seqlens
    fut_rows = ctx.fut_rows
    # 1. g of the rows other fragments look ahead into (same arithmetic as the main kernel).
    g_sends, ref_parts = [], []
    for x_SC, dy_SC, w, b, hist in zip(x_rows, dy_rows, weights, biases, hists):
        if be == "triton":
            g_FC = torch.empty((fut_rows.numel(), x_SC.shape[1]), dtype=torch.float32, device=x_SC.device)
            if S > 0:
                triton_head_g(dy_SC, x_SC, w, b, cu, hist, fut_rows, g_FC)
        else:
            # g, dweight and dbias need no look-ahead: computed once; only dx waits for fut.
            parts = reference_g_dw(dy_SC, x_SC, w, b, cu, hist_NHC=hist)
            ref_parts.append(parts)
            g_FC = parts[0].index_select(0, fut_rows)
        g_sends.append(g_FC)
    # 2. ONE future exchange for all tensors; on the Triton backend it flies during step 3.
    pending = start_halo_exchange(torch.cat(g_sends, 1), ctx.fut_exchange, ctx.num_slots, ctx.group)
    widths = [x.shape[1] for x in x_rows]
    futs = None if be == "triton" else _split_channels(pending.wait(), widths)
    # 3. dx and the partial dweight/dbias of this rank.
    dxs, dws, dbs = [], [], []
    for i, (x, x_SC, dy_SC, w, b, hist) in enumerate(zip(xs, x_rows, dy_rows, weights, biases, hists)):
        C = x_SC.shape[1]
        dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        dw = torch.zeros((C, 4), dtype=dweight_dtype, device=x.device)
        db = torch.zeros((C,), dtype=dweight_dtype, device=x.device) if b is not None else None
        if S > 0:
            dx_SC = dx.view(S, C)
            if be == "triton":
                # Without the look-ahead halo: the last rows of continued segments are redone below.
                ws = torch.empty(backward_workspace_floats(S, C), dtype=torch.float32, device=x.device)
                triton_backward(dy_SC, x_SC, w, b, cu, None, dx_SC, ws, dw, db, hist_NHC=hist)
            else:
                g32, dw32, db32, w32, d_S = ref_parts[i]
                dx_SC.copy_(reference_dx(g32, w32, d_S, cu, fut_NHC=futs[i]))
                dw.copy_(dw32)
                if db is not None:
                    db.copy_(db32)
        dxs.append(dx)
        dws.append(dw)
        dbs.append(db)
    if be == "triton":
        futs = _split_channels(pending.wait(), widths)
        for x_SC, dy_SC, w, b, hist, fut, dx in zip(x_rows, dy_rows, weights, biases, hists, futs, dxs):
            if S > 0:
                triton_dx_rows(dy_SC, x_SC, w, b, cu, hist, fut, ctx.fix_bwd_rows, dx.view(x_SC.shape))
    return dxs, dws, dbs


def cake_causal_conv1d_det_forward_kcp(x_local, weight, ctx, bias=None, *, backend="auto", hist=None):
    """Single-tensor forward: (y, hist [D, 3, C]); see cake_causal_conv1d_det_multi_forward_kcp."""
    ys, hists = cake_causal_conv1d_det_multi_forward_kcp(
        [x_local], [weight], ctx, [bias], backend=backend, hists=None if hist is None else [hist])
    return ys[0], hists[0]


def cake_causal_conv1d_det_backward_kcp(dy, x_local, weight, ctx, bias=None, *, hist, backend="auto",
                                        dweight_dtype=torch.float32):
    """Single-tensor backward: (dx, dweight, dbias); see cake_causal_conv1d_det_multi_backward_kcp."""
    dxs, dws, dbs = cake_causal_conv1d_det_multi_backward_kcp(
        [dy], [x_local], [weight], ctx, [bias], hists=[hist], backend=backend, dweight_dtype=dweight_dtype)
    return dxs[0], dws[0], dbs[0]


# ------------------------------------------------------------------------------------- autograd

def _stored_histories(key, handle):
    """The history rows a checkpoint recompute reads back from the handle, or None (exchange).

    Raises RuntimeError (before any exchange, so no rank hangs) when the handle already holds
    ``key`` outside a backward: a handle reused across micro-steps or calls.
    """
    if handle is None or key not in handle.entries:
        return None
    if not _in_backward():
        raise RuntimeError(
            f"RecomputeHandleDetKcp already holds an entry {key!r} outside a backward: a handle is "
            f"reused across micro-steps or calls; create one per call and micro-step, or clear() it")
    return handle.entries[key]


def forward_with_handle(xs, weights, biases, ctx, backend, handle, key):
    """(ys, hists): the KCP forward of an autograd call, with the recompute-handle rules (SPEC 5).

    No handle: the forward program with its exchange (overlapped with the kernel on Triton).
    A handle without ``key``: the same, and the received history rows are stored in
    ``handle.entries[key]``. A handle with ``key``, inside a backward (a checkpoint recompute): no
    exchange, the stored rows are used. Outside a backward: RuntimeError. The rows a stored entry
    holds are bitwise the exchanged ones, so y and every gradient are those of the run without a
    handle. With a handle the returned hists are copies (a custom op's outputs must be fresh
    tensors; the stored entry never aliases anything the caller or a compiler could write to).
    """
    x_rows, be = _check_kcp(xs, weights, biases, ctx, backend)
    stored = _stored_histories(key, handle)
    ys, hists = _forward_rows(xs, x_rows, weights, biases, ctx, be, stored)
    if handle is not None:
        if stored is None:
            handle.entries[key] = hists
        hists = [h.clone() for h in hists]
    return ys, hists


class CakeCausalConv1dDetMultiFunctionKcp(torch.autograd.Function):
    """KCP conv1d + SiLU of n tensors of one layer: one exchange forward, one backward.

    ==============  =====================  ==============================================
    operand         shape                  notes
    ==============  =====================  ==============================================
    xs[i]           [S, C_i] | [1, S, C_i]  bf16/fp16/fp32, this rank's rows in ctx's order
    weights[i]      [C_i, 4]               FP32
    biases[i]       [C_i] or None          FP32
    ys[i]           xs[i]'s shape           xs' dtype
    hist (saved)    [D, 3, C_i]            x rows before each local segment
    ==============  =====================  ==============================================

    Forward: ``y = silu(b + sum_k w[:, k] * x[t - 3 + k])`` with x rows before a segment's first
    token read from hist (exchanged). Backward: g of the rows others need, one exchange of those
    FP32 g rows, then ``dx[t] = sum_k w[:, k] * g[t + 3 - k]`` with g rows past the segment read
    from fut, and the partial ``dw = sum_t g[t] x[t - 3 + k]``, ``db = sum_t g[t]`` of this rank.

    ``apply(kctx, backend, handle, n, *xs, *weights, *biases)``. The forward and backward call the
    torch custom ops ``cakeconv::cake_causal_conv1d_det_kcp_forward`` / ``..._backward``
    (kcp_custom_ops.py) and save and read the state through the same helpers as the op's registered
    autograd formula, so ``apply`` gives bitwise the y and gradients of
    ``cake_causal_conv1d_det_multi_kcp`` (which calls the op directly). Both compile under
    ``torch.compile(fullgraph=True)`` without a graph break. The saved state is xs, the taps, the
    biases and the received history rows: the backward never repeats the forward exchange.
    """

    KEY = KEY_MULTI

    @staticmethod
    def forward(ctx, kctx, backend, handle, n, *args):
        xs, weights, biases = list(args[:n]), list(args[n:2 * n]), list(args[2 * n:3 * n])
        op_args = kcp_custom_ops.op_arguments(xs, weights, biases, kctx, handle,
                                              KEY_MULTI, backend)
        out = kcp_custom_ops.forward_op(*op_args)
        kcp_custom_ops.save_state(ctx, op_args, out[n:], kctx)
        return tuple(out[:n])

    @staticmethod
    def backward(ctx, *dys):
        dxs, dws, dbs = kcp_custom_ops.gradients(ctx, dys)
        return (None, None, None, None, *dxs, *dws, *dbs)


class CakeCausalConv1dDetFunctionKcp(torch.autograd.Function):
    """KCP conv1d + SiLU of one tensor (the multi Function's programs with n = 1).

    Shapes and math as ``CakeCausalConv1dDetMultiFunctionKcp``; the recompute handle key is
    ``"conv"``. ``apply(x_local, weight, bias, kctx, backend, handle)`` gives bitwise the y and
    gradients of ``cake_causal_conv1d_det_kcp`` (the same custom ops and helpers), and those of the
    multi form's entry for the same tensor.
    """

    KEY = KEY_SINGLE

    @staticmethod
    def forward(ctx, x_local, weight, bias, kctx, backend, handle):
        op_args = kcp_custom_ops.op_arguments([x_local], [weight], [bias], kctx, handle,
                                              KEY_SINGLE, backend)
        out = kcp_custom_ops.forward_op(*op_args)
        kcp_custom_ops.save_state(ctx, op_args, out[1:], kctx)
        return out[0]

    @staticmethod
    def backward(ctx, dy):
        dxs, dws, dbs = kcp_custom_ops.gradients(ctx, (dy,))
        return dxs[0], dws[0], dbs[0], None, None, None
