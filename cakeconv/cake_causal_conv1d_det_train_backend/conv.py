"""The single-rank op: one ladder from the kernels' launchers up to the public function.

Shape legend: S packed tokens, C channels, W taps (2 <= W <= 8), H = W - 1, N documents,
B batch rows, T row length.

The math, per document ``[cu[d], cu[d+1])`` with the rows before ``cu[d]`` read as zero, in FP32
and rounded once to the output's dtype (``w[:, W - 1]`` multiplies the current token):

    pre[t]   = b + sum_{k<W} w[:, k] * x[t - H + k]
    y[t]     = pre[t] * sigmoid(pre[t])  (activation "silu")   or   pre[t]  (activation None)
    g[t]     = dy[t] * silu'(pre[t])     (activation "silu")   or   dy[t]   (activation None)
    dx[t]    = sum_k w[:, k] * g[t + H - k]
    dw[:, k] = sum_t g[t] * x[t - H + k]                 db    = sum_t g[t]   (one fixed order)

The ladder, bottom to top; each rung calls the one below:

1. ``_forward`` / ``_backward``: a validated call (its ``Plan``) computed into given buffers by the
   Triton launchers (kernels/launch.py) or the reference backend (reference.py).
2. ``forward_into_op`` / ``backward_into_op``: validation plus rung 1 as torch custom ops that
   write into given buffers (``torch.ops.cakeconv.cake_causal_conv1d_det_forward_into`` and
   ``..._backward_into``). ``torch.compile`` sees each as one opaque op (no graph break, the bits of
   eager), and the validation runs when the compiled graph runs.
3. ``run_forward`` / ``run_backward``: one wrapper per custom op, the only code that asks whether
   torch.compile is tracing. Eager: rung 1 on a Plan (validated once); traced: rung 2.
4. The entry points ``cake_causal_conv1d_det_train_forward`` / ``_backward``: argument checks, then
   rung 3.
5. ``CakeCausalConv1dDetFunction``: the one autograd Function, on rung 3. Eager, its backward
   reuses the forward's plan and checks only dy.
6. ``cake_causal_conv1d_det``: the public function (no autograd node when nothing needs a gradient).

Eager calls pay for no dispatcher round trip: the custom ops exist for the compiler only, and run
the same code (rungs 1 and the same checks), so eager and compiled results are bitwise equal.

Host cost: validation and the launchers' set-up depend only on the operands' metadata (shapes,
strides, dtypes, devices; the width is weight.shape[1]), the activation and cu_seqlens' values. A
``Plan`` holds their results per signature, so a training loop's later calls skip both: they look
the plan up (cu_seqlens' values are re-checked only when that tensor changed), allocate the
outputs and launch the prepared kernels with the tensors' addresses.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Optional

import torch
from torch import Tensor

from . import checks, compile_ahead
from .kernels.launch import (
    EarlyLaunch,
    _cuda_getDevice,
    backward_workspace_floats,
    optional_meta,
    prepare_backward,
    prepare_forward,
    recording_twins,
    triton_backward,
    triton_forward,
)
from .reference import reference_backward, reference_forward

_NEVER = threading.Event()  # never set: the plans of a recording with twins keep them

__all__ = [
    "CakeCausalConv1dDetFunction",
    "cake_causal_conv1d_det",
    "cake_causal_conv1d_det_train_forward",
    "cake_causal_conv1d_det_train_backward",
    "cake_causal_conv1d_det_train_forward_workspace_bytes",
    "cake_causal_conv1d_det_train_backward_workspace_bytes",
    "is_cake_causal_conv1d_det_train_supported",
]


# ------------------------------------------------------------------- rows, devices, grad dtype

def rows_view(t: Tensor, S: int, C: int) -> Tensor:
    """t as [S, C] rows with unit channel stride and a row stride that is a multiple of 8.

    A tensor that cannot be viewed so is copied: the one copy this library makes on its own, e.g.
    for a dy that arrives expanded or transposed.
    """
    if t.dim() == 2:
        r = t
    else:
        r = t.reshape(S, C)
    if r.stride(1) != 1 or r.stride(0) % 8 != 0:
        r = r.contiguous()
    return r


def _rows_out(t: Tensor, S: int, C: int) -> Tensor:
    """An output buffer as [S, C] rows (itself or a view), or a fresh [S, C] tensor copied back
    by the caller when it is not contiguous."""
    if not t.is_contiguous():
        return torch.empty((S, C), dtype=t.dtype, device=t.device)
    return t if t.dim() == 2 else t.view(S, C)


def _contiguous(t: Optional[Tensor]) -> Optional[Tensor]:
    """Taps and bias as the kernels index them (``w[c * W + k]``, ``b[c]``)."""
    return t if t is None or t.is_contiguous() else t.contiguous()


_SAME_DEVICE = contextlib.nullcontext()
_CONTIGUOUS = torch.contiguous_format


def _on_device(index: int):
    """A context that makes GPU ``index`` current for a launch (Triton launches on the current
    device); a no-op when it already is, or for the CPU (index -1: the interpreter)."""
    if index < 0 or index == _cuda_getDevice():
        return _SAME_DEVICE
    return torch.cuda.device(index)


def _grad_dtype(weight: Tensor, bias: Optional[Tensor]) -> torch.dtype:
    """dtype the dweight/dbias sums are written in: the weight's, or FP32 when the bias differs
    (then each is rounded once from FP32 to its own dtype)."""
    if bias is None or bias.dtype == weight.dtype:
        return weight.dtype
    return torch.float32


# ------------------------------------- plans: validation and launch set-up, cached per signature

class Plan:
    """What validation and the launch set-up derive from a call's operand metadata.

    Built once per ``signature`` (shapes, strides, dtypes and devices of x, weight, bias and
    cu_seqlens, the backend and the activation; the width W is weight.shape[1]) after
    ``checks.check_problem`` accepted the operands, and reused by later calls of the same
    signature: they skip validation (cu_seqlens' values are still checked, through that check's own
    cache per tensor identity and version) and the launchers' set-up.

    ``fwd``: the prepared forward launch when the fast path applies (Triton backend, S > 0, x's rows
    viewable without a copy, contiguous taps and bias), else None; ``backward_for`` gives the
    prepared backward per dy layout. Holds no tensor (a later call's cu_seqlens is its own).
    ``ready``: while the training step's full kernels compile in the background, the event that says
    they are done (``run_early_until``); its launches run their quick twins until then.
    """

    __slots__ = ("S", "C", "W", "activation", "seq_len", "backend", "dtype", "device_index", "gdt", "n_ws", "fwd",
                 "_bwd", "_layout", "ahead", "ready", "twins", "joined")

    def __init__(self, p: checks.Problem, x: Tensor, weight: Tensor, bias: Optional[Tensor], cu: Optional[Tensor]):
        self.S, self.C, self.seq_len, self.backend = p.S, p.C, p.seq_len, p.backend
        self.W, self.activation = p.W, p.activation
        self.dtype = x.dtype
        self.device_index = x.get_device()
        self.gdt = _grad_dtype(weight, bias)
        self.n_ws = backward_workspace_floats(p.S, p.C, p.W)
        self.fwd = None
        self._bwd: dict = {}
        self._layout = None
        self.ahead = False  # compile_ahead.before_training_step ran for this plan
        self.joined = False  # compile_ahead.join_running ran for this plan
        self.ready = self.twins = None
        if p.backend != "triton" or p.S == 0 or not weight.is_contiguous() or not (bias is None or bias.is_contiguous()):
            return
        x_stride = _row_stride(x, p.S, p.C)
        if x_stride is None:
            return
        # (x row stride, w dtype, b dtype, cu dtype, cu entries): what the backward's set-up needs too
        self._layout = (x_stride, weight.dtype, *optional_meta(bias, cu))
        self.fwd = self._prepare_forward()
        if recording_twins():  # (the compile ahead's recording of a step: its twins' launches too)
            self.run_early_until(_NEVER)

    def run_early_until(self, ready, twins=None) -> None:
        """Run the quick twins of this plan's launches (the forward's, the backward's prepared so far
        and later) until ``ready`` (a ``threading.Event``) is set (compile_ahead.py); ``twins``: an event
        set once the backward's twins are compiled (None: they are), which its launches wait for."""
        self.ready, self.twins = ready, twins
        if ready.is_set():
            return
        if self.fwd is not None:
            self.fwd.early = self._early(self._prepare_forward(quick=True))
        for launches, args in self._bwd.values():
            if launches:
                launches.early = self._early(self._prepare_backward(*args, quick=True), twins)

    def backward_for(self, dy: Tensor, x: Tensor, dw_dtype: torch.dtype, dx_stride: Optional[int] = None):
        """The prepared backward launches for this dy (checked here the first time its layout is
        seen; a bad dy raises) writing dx with rows ``dx_stride`` apart (None: contiguous, C) and
        dw / db of ``dw_dtype``; None when the general path must run (no fast path for this
        problem, or dy's rows need a copy)."""
        try:
            key = (dy.shape, dy.stride(), dy.dtype, dy.device, dw_dtype, dx_stride)
        except (AttributeError, TypeError):  # not a tensor: the check names it
            checks.check_dy(dy, x)
            raise
        found = self._bwd.get(key)
        if found is None:
            checks.check_dy(dy, x)
            launches, args = False, None
            dy_stride = _row_stride(dy, self.S, self.C) if self._layout is not None else None
            if dy_stride is not None:
                args = (dy_stride, dy.dtype, dw_dtype, dx_stride or self.C)
                launches = self._prepare_backward(*args)
                if self.ready is not None and not self.ready.is_set():
                    launches.early = self._early(self._prepare_backward(*args, quick=True), self.twins)
            found = self._bwd[key] = (launches, args)
        return found[0] or None

    def _early(self, quick_launch, compiled=None) -> EarlyLaunch:
        """``quick_launch`` run in its full launch's place until ``self.ready`` is set (once ``compiled``,
        an event, is set: its kernels are then in the cache)."""
        return EarlyLaunch(quick_launch, self.ready, self.device_index >= 0, compiled)

    def _prepare_forward(self, quick=False):
        x_stride, *rest = self._layout
        return prepare_forward(self.S, self.C, x_stride, self.C, self.dtype, *rest, self.seq_len, width=self.W,
                               activation=self.activation, quick=quick)

    def _prepare_backward(self, dy_stride, dy_dtype, dw_dtype, dx_stride, quick=False):
        x_stride, w_dtype, b_dtype, cu_dtype, n_cu = self._layout
        return prepare_backward(self.S, self.C, x_stride, dy_stride, dx_stride, self.dtype, dy_dtype, w_dtype,
                                b_dtype, cu_dtype, n_cu, self.seq_len, dw_dtype, width=self.W,
                                activation=self.activation, quick=quick)


def _row_stride(t: Tensor, S: int, C: int) -> Optional[int]:
    """The row stride of t viewed as [S, C] rows without a copy (unit channel stride, row stride a
    multiple of 8), or None when ``rows_view`` would copy."""
    r = rows_view(t, S, C)
    return r.stride(0) if r.data_ptr() == t.data_ptr() else None


def signature(x, weight, bias, cu_seqlens, backend, activation="silu") -> tuple:
    """The operand metadata and activation a Plan depends on (the width is in weight.shape);
    AttributeError / TypeError for non-tensors."""
    return (x.shape, x.stride(), x.dtype, x.device, weight.shape, weight.stride(), weight.dtype, weight.device,
            None if bias is None else (bias.shape, bias.stride(), bias.dtype, bias.device),
            None if cu_seqlens is None else (cu_seqlens.shape, cu_seqlens.stride(), cu_seqlens.dtype, cu_seqlens.device),
            backend, activation)


_plans: dict = {}
_MAX_PLANS = 512


def plan_for(x, weight, bias, cu_seqlens, backend, activation="silu") -> Plan:
    """The call's Plan: from the cache, or validated (raising TypeError / ValueError) and built."""
    try:
        sig = signature(x, weight, bias, cu_seqlens, backend, activation)
        plan = _plans.get(sig)
    except (AttributeError, TypeError):  # not tensors, or an unhashable backend / activation: validation names it
        sig = plan = None
    if plan is not None:
        if cu_seqlens is not None:
            checks.check_cu_values(cu_seqlens, plan.S)
        return plan
    plan = Plan(checks.check_problem(x, weight, bias, cu_seqlens, backend, activation), x, weight, bias, cu_seqlens)
    if sig is not None:
        if len(_plans) >= _MAX_PLANS:
            _plans.clear()
        _plans[sig] = plan
    return plan


# ------------------------------------------------------------ 1. a validated call -> buffers

def _forward(plan: Plan, x: Tensor, weight: Tensor, bias: Optional[Tensor], cu_seqlens: Optional[Tensor],
             y: Tensor) -> None:
    """y <- act(conv(x)) for a validated call (its plan: width and activation); y has x's shape and dtype."""
    if plan.fwd is not None and y.is_contiguous():  # the fast path: launch set-up done, no views
        with _on_device(plan.device_index):
            plan.fwd.run(x, weight, bias, cu_seqlens, y)
        return
    S, C = plan.S, plan.C
    if S == 0:
        return
    x_SC = rows_view(x, S, C)
    y_SC = _rows_out(y, S, C)
    w_CW, b_C = _contiguous(weight), _contiguous(bias)
    if plan.backend == "triton":
        with _on_device(plan.device_index):
            triton_forward(x_SC, w_CW, b_C, cu_seqlens, plan.seq_len, y_SC, activation=plan.activation)
    else:
        reference_forward(x_SC, w_CW, b_C, cu_seqlens, plan.seq_len, out_SC=y_SC, activation=plan.activation)
    if not y.is_contiguous():
        y.copy_(y_SC.view(y.shape))


def _backward(plan: Plan, launches, dy: Tensor, x: Tensor, weight: Tensor, bias: Optional[Tensor],
              cu_seqlens: Optional[Tensor], dx: Tensor, ws_F: Optional[Tensor], dw_CW: Tensor, db_C: Optional[Tensor],
              compiled: bool = False, dx_strided: bool = False) -> None:
    """dx, dw_CW [C, W] and db_C (if not None; dw's dtype) for a validated call (its plan: width and
    activation) and dy: ``launches`` is ``plan.backward_for(dy, x, dw_CW.dtype)``, which checked dy.

    ws_F: FP32 workspace of ``backward_workspace_floats(S, C, W)`` elements (Triton; None: allocated).
    compiled: called by the custom op (torch.compile): the one-group kernel's ticket counters come
    from the workspace (kernels/launch.py, ``TicketCounters``).
    dx_strided: ``launches`` were prepared for dx's own row stride (a dx that is not contiguous but
    whose rows are viewable in place, e.g. a slice of a wider gradient): written in place.
    """
    S, C = plan.S, plan.C
    if launches is not None and (dx_strided or dx.is_contiguous()):  # the fast path: set-up done, no views
        if ws_F is None:
            ws_F = dw_CW.new_empty(plan.n_ws, dtype=torch.float32)
        with _on_device(plan.device_index):
            launches.run(dy, x, weight, bias, cu_seqlens, dx, ws_F, dw_CW, db_C, tickets_in_workspace=compiled)
        return
    if S == 0:
        dw_CW.zero_()
        if db_C is not None:
            db_C.zero_()
        return
    x_SC = rows_view(x, S, C)
    dy_SC = rows_view(dy, S, C)
    dx_SC = _rows_out(dx, S, C)
    w_CW, b_C = _contiguous(weight), _contiguous(bias)
    if plan.backend == "triton":
        if ws_F is None:
            ws_F = dw_CW.new_empty(plan.n_ws, dtype=torch.float32)
        with _on_device(plan.device_index):
            triton_backward(dy_SC, x_SC, w_CW, b_C, cu_seqlens, plan.seq_len, dx_SC, ws_F, dw_CW, db_C,
                            tickets_in_workspace=compiled, activation=plan.activation)
    else:
        dx32, dw32, db32, _ = reference_backward(dy_SC, x_SC, w_CW, b_C, cu_seqlens, plan.seq_len,
                                                 activation=plan.activation)
        dx_SC.copy_(dx32)
        dw_CW.copy_(dw32)
        if db_C is not None:
            db_C.copy_(db32)
    if not dx.is_contiguous():
        dx.copy_(dx_SC.view(dx.shape))


# ------------------------------------------------------- 2. custom ops (for torch.compile)

@torch.library.custom_op("cakeconv::cake_causal_conv1d_det_forward_into", mutates_args=("y",))
def forward_into_op(x: Tensor, weight: Tensor, bias: Optional[Tensor], cu_seqlens: Optional[Tensor],
                    backend: str, y: Tensor, activation: Optional[str] = "silu") -> None:
    """y <- act(causal_conv1d(x)) per document (W = weight.shape[1] taps; act SiLU or, for activation
    None, the identity), validated first (see ``cake_causal_conv1d_det``)."""
    plan = plan_for(x, weight, bias, cu_seqlens, backend, activation)
    checks.check_like("out", y, x.shape, x.dtype, x.device)
    _forward(plan, x, weight, bias, cu_seqlens, y)


@forward_into_op.register_fake
def _forward_into_fake(x, weight, bias, cu_seqlens, backend, y, activation="silu"):
    return None


@torch.library.custom_op("cakeconv::cake_causal_conv1d_det_backward_into",
                         mutates_args=("dx", "workspace", "dweight", "dbias"))
def backward_into_op(dy: Tensor, x: Tensor, weight: Tensor, bias: Optional[Tensor], cu_seqlens: Optional[Tensor],
                     backend: str, dx: Tensor, workspace: Tensor, dweight: Tensor, dbias: Tensor,
                     activation: Optional[str] = "silu") -> None:
    """dx, dweight [C, W] and dbias [C] (a [0] placeholder without bias) into the given buffers, for
    W = weight.shape[1] taps and the activation ("silu" or None).

    workspace: FP32, at least ``backward_workspace_floats(S, C, W)`` elements.
    """
    plan = plan_for(x, weight, bias, cu_seqlens, backend, activation)
    launches = plan.backward_for(dy, x, dweight.dtype)
    _backward(plan, launches, dy, x, weight, bias, cu_seqlens, dx, workspace, dweight, dbias if bias is not None else None,
              compiled=True)


@backward_into_op.register_fake
def _backward_into_fake(dy, x, weight, bias, cu_seqlens, backend, dx, workspace, dweight, dbias, activation="silu"):
    return None


# ------------------------------------------- 3. one eager/compile wrapper per custom op
# ``run_forward`` and ``run_backward`` are the only places that ask whether torch.compile is
# tracing: eager calls run rung 1 on a Plan (validated once; the autograd Function hands the
# forward's plan to the backward), traced calls the custom op of rung 2. Everything above them
# (entry points, the autograd Function, the public op) is the same code in both worlds.

def _schema_types_ok(x, weight, bias, cu_seqlens, backend, activation) -> bool:
    """True when the operands fit the custom ops' schema (tensors, None where optional, a str, and
    a str or None for the activation)."""
    return (isinstance(x, torch.Tensor) and isinstance(weight, torch.Tensor)
            and (bias is None or isinstance(bias, torch.Tensor))
            and (cu_seqlens is None or isinstance(cu_seqlens, torch.Tensor))
            and isinstance(backend, str) and (activation is None or isinstance(activation, str)))


def _check_schema_types(x, weight, bias, cu_seqlens, backend, activation) -> None:
    """Raise the validation error that names an operand the custom ops' schema cannot take."""
    if not _schema_types_ok(x, weight, bias, cu_seqlens, backend, activation):
        checks.check_problem(x, weight, bias, cu_seqlens, backend, activation)
        raise TypeError(f"cake_causal_conv1d_det got operands of types {type(x).__name__}, "
                        f"{type(weight).__name__}, {type(bias).__name__}, {type(cu_seqlens).__name__}, "
                        f"{type(backend).__name__}, {type(activation).__name__}")


def run_forward(x, weight, bias, cu_seqlens, backend, activation, out=None, plan=None, training=False):
    """(y, plan): y = act(conv(x)) written into ``out`` (x's shape and dtype) or a new contiguous
    tensor. Eager: rung 1 on ``plan`` (validated here when None), which is returned for the
    backward; ``training`` (a backward follows): the first call of a problem compiles its training
    step's kernels side by side first (compile_ahead.py). Traced by torch.compile: the custom op
    ``forward_into_op`` (validated when the graph runs), and None for the plan."""
    if torch.compiler.is_compiling():
        _check_schema_types(x, weight, bias, cu_seqlens, backend, activation)
        y = out if out is not None else torch.empty_like(x, memory_format=torch.contiguous_format)
        forward_into_op(x, weight, bias, cu_seqlens, backend, y, activation)
        return y, None
    if plan is None:
        plan = plan_for(x, weight, bias, cu_seqlens, backend, activation)
    if out is not None:
        checks.check_like("out", out, x.shape, x.dtype, x.device)
        y = out
    else:
        y = torch.empty_like(x, memory_format=_CONTIGUOUS)
    if training and not plan.ahead:
        compile_ahead.before_training_step(plan)
    elif not training and not plan.joined:
        compile_ahead.join_running(plan)
    _forward(plan, x, weight, bias, cu_seqlens, y)
    return y, plan


def _workspace_views(workspace, n_ws, C, W, dweight_dtype, has_bias):
    """(ws_F, dw_CW, db_C) carved from a caller's workspace: bytes [0, 4 n_ws) the FP32 partials, then
    dweight at byte 4 n_ws and dbias at 4 n_ws + 4 W C (FP32-sized slots, whatever dweight_dtype)."""
    ws_U = workspace if workspace.dim() == 1 and workspace.dtype == torch.uint8 else workspace.view(-1).view(torch.uint8)
    at, size = 4 * n_ws, dweight_dtype.itemsize
    if dweight_dtype == torch.float32:  # one FP32 view; dw and db are strided views of it (fewer ops per call)
        ws_F = ws_U[:at + 4 * (W + 1) * C].view(torch.float32)
        o = ws_F.storage_offset() + n_ws
        dw_CW = ws_F.as_strided((C, W), (W, 1), o)
        db_C = ws_F.as_strided((C,), (1,), o + W * C) if has_bias else None
        return ws_F, dw_CW, db_C
    ws_F = ws_U[:at].view(torch.float32)
    dw_CW = ws_U[at:at + W * C * size].view(dweight_dtype).view(C, W)
    db_C = None
    if has_bias:
        at_b = at + 4 * W * C
        db_C = ws_U[at_b:at_b + C * size].view(dweight_dtype)
    return ws_F, dw_CW, db_C


def _gradient_buffers(weight, C, W, dweight_dtype, has_bias):
    """(dw_CW, db_C) newly allocated: one allocation for both with a bias."""
    if has_bias:
        dwb = weight.new_empty((W + 1) * C, dtype=dweight_dtype)
        return dwb[:W * C].view(C, W), dwb[W * C:]
    return torch.empty_like(weight, dtype=dweight_dtype, memory_format=_CONTIGUOUS), None


def run_backward(dy, x, weight, bias, cu_seqlens, backend, activation, dweight_dtype, dx=None, workspace=None,
                 plan=None):
    """(dx, dweight, dbias): the backward into ``dx`` and a ``workspace`` when given (dweight and dbias
    are then views into it), else new buffers. Eager: rung 1 on ``plan`` (validated here when None;
    dy is checked on its first layout); a dx whose rows are a slice of a wider tensor is written in
    place; the first call of a problem compiles its training step's kernels side by side first
    (compile_ahead.py). Traced by torch.compile: the custom op ``backward_into_op`` (validated when
    the graph runs)."""
    if torch.compiler.is_compiling():
        C, W = x.shape[-1], weight.shape[-1]
        S = x.numel() // C if C else 0
        n_ws = backward_workspace_floats(S, C, W)
        if workspace is not None:
            ws_F, dw_CW, db_C = _workspace_views(workspace, n_ws, C, W, dweight_dtype, bias is not None)
        else:  # separate buffers: the op's mutated arguments must not alias each other
            ws_F = torch.empty(n_ws, dtype=torch.float32, device=x.device)
            dw_CW = torch.empty_like(weight, dtype=dweight_dtype, memory_format=_CONTIGUOUS)
            db_C = weight.new_empty(C, dtype=dweight_dtype) if bias is not None else None
        dx_out = dx if dx is not None else torch.empty_like(x, memory_format=_CONTIGUOUS)
        db = db_C if db_C is not None else dw_CW.new_empty((0,))
        backward_into_op(dy, x, weight, bias, cu_seqlens, backend, dx_out, ws_F, dw_CW, db, activation)
        return dx_out, dw_CW, db_C
    if plan is None:
        plan = plan_for(x, weight, bias, cu_seqlens, backend, activation)
    launches = plan.backward_for(dy, x, dweight_dtype)  # checks dy
    C, W = plan.C, plan.W
    dx_strided = False
    if dx is not None:
        checks.check_like("dx", dx, x.shape, x.dtype, x.device)
        if launches is not None and not dx.is_contiguous():  # rows of a wider tensor: written in place
            S_dx = dx.numel() // C if C else 0
            dx_stride = _row_stride(dx, S_dx, C) if S_dx else None
            if dx_stride is not None:
                launches = plan.backward_for(dy, x, dweight_dtype, dx_stride)
                dx_strided = launches is not None
    if workspace is not None:
        _check_workspace(workspace, cake_causal_conv1d_det_train_backward_workspace_bytes(plan.S, C, width=W), x.device)
        ws_F, dw_CW, db_C = _workspace_views(workspace, plan.n_ws, C, W, dweight_dtype, bias is not None)
    else:
        ws_F = None
        dw_CW, db_C = _gradient_buffers(weight, C, W, dweight_dtype, bias is not None)
    dx_out = dx if dx is not None else torch.empty_like(x, memory_format=_CONTIGUOUS)
    if not plan.ahead:
        compile_ahead.before_training_step(plan)
    _backward(plan, launches, dy, x, weight, bias, cu_seqlens, dx_out, ws_F, dw_CW, db_C, dx_strided=dx_strided)
    return dx_out, dw_CW, db_C


# ------------------------------------------------------------------------- 4. entry points

def is_cake_causal_conv1d_det_train_supported(device_or_tensor) -> bool:
    """True on the CPU (reference backend) and on NVIDIA GPUs of compute capability >= 8.0.

    Tuned and measured on the H200 (sm_90); other GPUs of capability 8.0 or newer run the same
    Triton kernels untuned.

    Raises:
        TypeError: the argument is neither a tensor nor a device (or device string).
        ValueError: a string or int that names no device (e.g. "notadevice").
    """
    if isinstance(device_or_tensor, torch.Tensor):
        device = device_or_tensor.device
    elif isinstance(device_or_tensor, (torch.device, str, int)):
        try:
            device = torch.device(device_or_tensor)
        except RuntimeError as exc:  # torch's message for a string it cannot parse
            raise ValueError(f"{device_or_tensor!r} is not a device: {exc}") from None
    else:
        raise TypeError(f"expected a torch.Tensor, torch.device or device string, got {type(device_or_tensor).__name__}")
    if device.type == "cpu":
        return True
    if device.type == "cuda" and torch.cuda.is_available():
        major, _ = torch.cuda.get_device_capability(device)
        return major >= 8
    return False


def cake_causal_conv1d_det_train_forward_workspace_bytes(S: int, C: int, *, width: int = 4, **_ignored) -> int:
    """Bytes of workspace the forward needs: 0 for every width (it writes only y). Kept for a
    uniform API.

    Raises:
        ValueError: S or C negative, or a width outside 2..8 (the message names it).
    """
    if S < 0 or C < 0:
        raise ValueError(f"S and C must be >= 0, got S = {S}, C = {C}")
    checks.check_width(width)
    return 0


def cake_causal_conv1d_det_train_backward_workspace_bytes(S: int, C: int, *, width: int = 4, **_ignored) -> int:
    """Bytes of the backward workspace for S tokens, C channels and W = ``width`` taps (2..8).

    It holds the FP32 dweight/dbias partials ((W + 1) * C floats per leaf of 64 tokens, 128 from
    W = 5 on: the most any configuration writes, plus one group sum per 8192 tokens) and room for
    the returned dweight ([C, W]) and dbias ([C]), FP32-sized, so that a call given a workspace
    allocates nothing. The activation does not change the size.

    Raises:
        ValueError: S or C negative, or a width outside 2..8 (the message names it).
    """
    if S < 0 or C < 0:
        raise ValueError(f"S and C must be >= 0, got S = {S}, C = {C}")
    W = checks.check_width(width)
    return 4 * backward_workspace_floats(S, C, W) + 4 * (W + 1) * C


def _check_workspace(workspace, nbytes, device):
    if not isinstance(workspace, torch.Tensor):
        raise TypeError(f"workspace must be a torch.Tensor, got {type(workspace).__name__}")
    if workspace.device != device:
        raise ValueError(f"workspace is on {workspace.device} but x is on {device}")
    if not workspace.is_contiguous():
        raise ValueError("workspace must be contiguous")
    have = workspace.numel() * workspace.element_size()
    if have < nbytes:
        raise ValueError(f"workspace has {have} bytes, the backward needs {nbytes} "
                         f"(cake_causal_conv1d_det_train_backward_workspace_bytes)")
    if workspace.data_ptr() % 16 != 0:
        raise ValueError("workspace must be 16-byte aligned")


_GRAD_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def cake_causal_conv1d_det_train_forward(x, weight, bias=None, cu_seqlens=None, *, out=None,
                                         workspace=None, activation="silu", backend="auto"):
    """y = act(causal_conv1d(x)) per document (no autograd). See ``cake_causal_conv1d_det``.

    For token t of a document, W = weight.shape[1], rows before the document read as zero:
    ``pre[t] = bias + sum_{k<W} weight[:, k] * x[t - (W - 1) + k]``; y = silu(pre) (activation
    "silu") or y = pre (activation None), in FP32, rounded once to x's dtype.

    Args:
        x: [S, C], [1, S, C] or [B, T, C]; bf16, fp16 or fp32; C a multiple of 8.
        weight: [C, W] fp32 or bf16 taps, 2 <= W <= 8 (weight[:, W - 1] multiplies the current token).
        bias: optional [C].
        cu_seqlens: optional int32/int64 [N + 1] document boundaries on x's device.
        out: optional buffer of x's shape and dtype that receives y (then nothing is allocated).
        workspace: accepted for symmetry with the backward; the forward needs none.
        activation: "silu" (default) or None (the conv alone).
        backend: "auto", "triton" or "reference".

    Returns:
        y of x's shape and dtype (``out`` itself when given).

    Raises:
        TypeError, ValueError: bad operands, a width outside 2..8 or an unknown activation (the
            message names the value), before any kernel launch.
    """
    if workspace is not None and not isinstance(workspace, torch.Tensor):
        raise TypeError(f"workspace must be a torch.Tensor or None, got {type(workspace).__name__}")
    return run_forward(x, weight, bias, cu_seqlens, backend, activation, out)[0]


def cake_causal_conv1d_det_train_backward(dy, x, weight, bias=None, cu_seqlens=None, *, dx=None,
                                          workspace=None, dweight_dtype=torch.float32, activation="silu",
                                          backend="auto"):
    """(dx, dweight, dbias) of y = act(causal_conv1d(x)); dbias is None when bias is None.

    With W = weight.shape[1], H = W - 1 and g = dy * silu'(pre) (activation "silu") or g = dy
    (activation None), per document: ``dx[t] = sum_k weight[:, k] * g[t + H - k]``,
    ``dweight[:, k] = sum_t g[t] * x[t - H + k]`` ([C, W]), ``dbias = sum_t g[t]``.

    The pre-activation is recomputed from x (nothing from the forward is needed). dweight and
    dbias are summed in FP32 in one fixed order (bitwise reproducible, independent of tuning) and
    returned in ``dweight_dtype``. Given ``dx`` (x's shape and dtype) and a ``workspace`` of
    ``cake_causal_conv1d_det_train_backward_workspace_bytes(S, C, width=W)`` bytes, the call
    allocates nothing on the Triton backend; dweight and dbias are then views into the workspace
    (clone them before the workspace is reused, e.g. by a later CUDA-graph replay). Two exceptions,
    made once and kept: with 5 or more short documents, the first call with a ``cu_seqlens`` tensor
    builds its per-token document index (4 bytes per token, kept while that tensor lives, reused by
    every later call and by a CUDA graph captured after it; both entry points); and the first
    backward on a stream allocates the dweight tree's ticket counters for that stream (at least 256
    bytes; under CUDA-graph capture the counters come from the workspace: nothing is allocated).

    ``activation`` ("silu" or None) must be the forward's; the other arguments are the forward's
    (see ``cake_causal_conv1d_det_train_forward``).
    """
    if dweight_dtype not in _GRAD_DTYPES:
        raise TypeError(f"dweight_dtype must be torch.float32, bfloat16 or float16, got {dweight_dtype}")
    return run_backward(dy, x, weight, bias, cu_seqlens, backend, activation, dweight_dtype, dx, workspace)


# --------------------------------------------------------------------- 5. autograd Function

class CakeCausalConv1dDetFunction(torch.autograd.Function):
    """Packed depthwise causal conv1d of W taps (2 <= W <= 8) + optional SiLU, deterministic backward.

    ==========  ===========================  =============================================
    operand     shape                        dtype
    ==========  ===========================  =============================================
    x           [S, C] | [1, S, C] | [B,T,C]  bf16 / fp16 / fp32
    weight      [C, W]                       fp32 / bf16 (w[:, W - 1] multiplies token t)
    bias        [C] or None                  fp32 / bf16 / fp16
    cu          [N + 1] or None              int32 / int64, on x's device
    activation  "silu" or None               (None: no activation)
    y           x's shape                    x's dtype
    ==========  ===========================  =============================================

    Forward, per document [cu[d], cu[d+1]) with rows before cu[d] read as zero, in FP32, H = W - 1:
        pre[t] = b + sum_k w[:, k] * x[t - H + k]
        y[t]   = pre[t] * sigmoid(pre[t])   ("silu")   or   pre[t]   (None)
    Backward (pre recomputed from the saved x; nothing else of size S * C is saved):
        g[t]  = dy[t] * silu'(pre[t])   ("silu")   or   dy[t]   (None)
        dx[t] = sum_k w[:, k] * g[t + H - k]              (g of the same document only)
        dw    = sum_t g[t] * x[t - H + k],  db = sum_t g[t]   (FP32, one fixed order)
    dweight ([C, W]) and dbias are returned in the weight's and the bias's dtype, each rounded once
    from FP32.

    ``apply(x, weight, bias, cu_seqlens, backend, activation="silu")``. Eager, the forward validates
    once and the backward reuses that validation (checking only dy); under torch.compile both call
    the custom ops of rung 2 through rung 3 (module docstring), which validate when the graph runs.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, cu_seqlens, backend, activation="silu"):
        y, ctx.plan = run_forward(x, weight, bias, cu_seqlens, backend, activation, training=True)
        ctx.save_for_backward(x, weight, bias, cu_seqlens)
        ctx.backend = backend
        ctx.activation = activation
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, bias, cu_seqlens = ctx.saved_tensors
        gdt = _grad_dtype(weight, bias) if ctx.plan is None else ctx.plan.gdt
        dx, dw, db = run_backward(dy, x, weight, bias, cu_seqlens, ctx.backend, ctx.activation, gdt, plan=ctx.plan)
        if dw.dtype != weight.dtype:
            dw = dw.to(weight.dtype)
        if db is not None and db.dtype != bias.dtype:
            db = db.to(bias.dtype)
        return dx, dw, db, None, None, None


# ------------------------------------------------------------------------ 6. the public op

def cake_causal_conv1d_det(x, weight, bias=None, *, cu_seqlens=None, activation="silu", backend="auto"):
    """Autograd-enabled packed depthwise causal conv1d of W taps (2 <= W <= 8) + SiLU (or no
    activation), bitwise deterministic.

    For token t of document [cu[d], cu[d+1]) (rows before cu[d] read as zero), W = weight.shape[1]:
    ``pre[t] = bias + sum_{k=0..W-1} weight[:, k] * x[t - (W - 1) + k]`` (``weight[:, W - 1]``
    multiplies the current token) and ``y[t] = silu(pre[t])`` (activation "silu", the default) or
    ``y[t] = pre[t]`` (activation None), computed in FP32 and rounded once to x's dtype; the same as
    torch's ``conv1d(groups=C)`` with W - 1 rows of left zero padding per document, then the
    activation.

    Args:
        x: [S, C] or [1, S, C] packed tokens (with ``cu_seqlens``), or [B, T, C] (B documents of
            T tokens; ``cu_seqlens`` must then be None). bf16, fp16 or fp32; C a multiple of 8.
        weight: [C, W] fp32 or bf16 taps, 2 <= W <= 8.
        bias: optional [C].
        cu_seqlens: contiguous int32/int64 [N + 1] on x's device, cu[0] = 0 <= ... <= cu[N] = S;
            empty documents allowed. None: one document per batch row.
        activation: "silu" (default) or None.
        backend: "auto" (Triton on CUDA, reference on CPU), "triton" or "reference".

    Returns:
        y with x's shape and dtype. y, dx, dweight and dbias are bitwise identical on every call
        with the same inputs, device and library version, in eager and under torch.compile (where
        the op is the custom ops ``torch.ops.cakeconv.cake_causal_conv1d_det_forward_into`` /
        ``..._backward_into``, opaque to the compiler).

    Raises:
        TypeError, ValueError: bad operands, a width outside 2..8 or an activation other than
            "silu" / None (the message names the offending value), before any kernel launch;
            under torch.compile when the compiled graph runs.
    """
    if torch.is_grad_enabled() and (getattr(x, "requires_grad", False) or getattr(weight, "requires_grad", False)
                                    or (bias is not None and getattr(bias, "requires_grad", False))):
        return CakeCausalConv1dDetFunction.apply(x, weight, bias, cu_seqlens, backend, activation)
    return cake_causal_conv1d_det_train_forward(x, weight, bias, cu_seqlens, activation=activation, backend=backend)
