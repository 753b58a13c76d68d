"""Single-rank entry points: validation, dispatch to a backend, caller-provided buffers.

Shape legend: S packed tokens, C channels, W = 4 taps, N documents.

The ladder, bottom to top: ``triton_launch`` / ``reference`` compute into given buffers;
``cake_causal_conv1d_det_train_forward`` / ``_backward`` validate, view the operands as [S, C] rows
and allocate what the caller did not give; ``CakeCausalConv1dDetFunction`` (function.py) saves
x, the taps, the bias and cu_seqlens and calls them.
"""

from __future__ import annotations

import torch

from . import checks
from .reference import reference_backward, reference_forward
from .kernels.launch import backward_workspace_floats, triton_backward, triton_forward


def _rows(t: torch.Tensor, S: int, C: int) -> torch.Tensor:
    """t as [S, C] rows with unit channel stride and a row stride that is a multiple of 8.

    A tensor that cannot be viewed so is copied (``.reshape`` / ``.contiguous``): the one copy this
    library makes on its own, e.g. for a dy that arrives transposed.
    """
    r = t.reshape(S, C)
    if r.stride(1) != 1 or r.stride(0) % 8 != 0:
        r = r.contiguous()
    return r


def is_cake_causal_conv1d_det_train_supported(device_or_tensor) -> bool:
    """True on the CPU (reference backend) and on NVIDIA GPUs of compute capability >= 8.0.

    Tuned and measured on the H200 (sm_90); other GPUs of capability 8.0 or newer run the same
    Triton kernels untuned.
    """
    if isinstance(device_or_tensor, torch.Tensor):
        device = device_or_tensor.device
    else:
        device = torch.device(device_or_tensor)
    if device.type == "cpu":
        return True
    if device.type == "cuda" and torch.cuda.is_available():
        major, _ = torch.cuda.get_device_capability(device)
        return major >= 8
    return False


def cake_causal_conv1d_det_train_forward_workspace_bytes(S: int, C: int, **_ignored) -> int:
    """Bytes of workspace the forward needs: 0 (it writes only y). Kept for a uniform API."""
    if S < 0 or C < 0:
        raise ValueError(f"S and C must be >= 0, got S = {S}, C = {C}")
    return 0


def cake_causal_conv1d_det_train_backward_workspace_bytes(S: int, C: int, **_ignored) -> int:
    """Bytes of the backward workspace for S tokens and C channels.

    It holds the FP32 dweight/dbias partials (5 * C floats per 64-token leaf, the most any
    configuration writes, plus one group sum per 8192 tokens) and room for the returned dweight
    and dbias (FP32-sized), so that a call given a workspace allocates nothing.
    """
    if S < 0 or C < 0:
        raise ValueError(f"S and C must be >= 0, got S = {S}, C = {C}")
    return 4 * backward_workspace_floats(S, C) + 4 * 5 * C


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


def cake_causal_conv1d_det_train_forward(x, weight, bias=None, cu_seqlens=None, *, out=None,
                                         workspace=None, backend="auto"):
    """y = silu(causal_conv1d(x)) per document (no autograd). See cake_causal_conv1d_det.

    Args:
        x: [S, C], [1, S, C] or [B, T, C]; bf16, fp16 or fp32; C a multiple of 8.
        weight: [C, 4] fp32 or bf16 taps (weight[:, 3] multiplies the current token).
        bias: optional [C].
        cu_seqlens: optional int32/int64 [N + 1] document boundaries on x's device.
        out: optional buffer of x's shape and dtype that receives y (then nothing is allocated).
        workspace: accepted for symmetry with the backward; the forward needs none.
        backend: "auto", "triton" or "reference".

    Returns:
        y of x's shape and dtype (``out`` itself when given).
    """
    p = checks.check_problem(x, weight, bias, cu_seqlens, backend)
    if out is not None:
        checks.check_like("out", out, x.shape, x.dtype, x.device)
    if workspace is not None and not isinstance(workspace, torch.Tensor):
        raise TypeError(f"workspace must be a torch.Tensor or None, got {type(workspace).__name__}")
    y = out if out is not None else torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if p.S == 0:
        return y
    x_SC = _rows(x, p.S, p.C)
    y_SC = y.view(p.S, p.C) if y.is_contiguous() else torch.empty((p.S, p.C), dtype=x.dtype, device=x.device)
    if p.backend == "triton":
        triton_forward(x_SC, weight, bias, p.cu_seqlens, p.seq_len, y_SC)
    else:
        reference_forward(x_SC, weight, bias, p.cu_seqlens, p.seq_len, out_SC=y_SC)
    if y_SC.data_ptr() != y.data_ptr() or not y.is_contiguous():
        y.copy_(y_SC.view(y.shape))
    return y


def cake_causal_conv1d_det_train_backward(dy, x, weight, bias=None, cu_seqlens=None, *, dx=None,
                                          workspace=None, dweight_dtype=torch.float32, backend="auto"):
    """(dx, dweight, dbias) of y = silu(causal_conv1d(x)); dbias is None when bias is None.

    The pre-activation is recomputed from x (nothing from the forward is needed). dweight and
    dbias are summed in FP32 in one fixed order (bitwise reproducible, independent of tuning) and
    returned in ``dweight_dtype``. Given ``dx`` (x's shape and dtype) and a ``workspace`` of
    ``cake_causal_conv1d_det_train_backward_workspace_bytes(S, C)`` bytes, the call allocates
    nothing on the Triton backend; dweight and dbias are then views into the workspace (clone
    them before the workspace is reused, e.g. by a later CUDA-graph replay).
    """
    p = checks.check_problem(x, weight, bias, cu_seqlens, backend)
    checks.check_tensor("dy", dy, checks.X_DTYPES, x.device)
    if tuple(dy.shape) != tuple(x.shape):
        raise ValueError(f"dy must have x's shape {tuple(x.shape)}, got {tuple(dy.shape)}")
    if dweight_dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"dweight_dtype must be torch.float32, bfloat16 or float16, got {dweight_dtype}")
    if dx is not None:
        checks.check_like("dx", dx, x.shape, x.dtype, x.device)
    S, C = p.S, p.C
    nbytes = cake_causal_conv1d_det_train_backward_workspace_bytes(S, C)
    if workspace is not None:
        _check_workspace(workspace, nbytes, x.device)
        ws_F = workspace.view(-1).view(torch.uint8)[:nbytes].view(torch.float32)
        n_ws = backward_workspace_floats(S, C)
        dw_CW = ws_F[n_ws:n_ws + 4 * C].view(torch.uint8)[: 4 * C * _size(dweight_dtype)].view(dweight_dtype).view(C, 4)
        db_C = None
        if bias is not None:
            db_C = ws_F[n_ws + 4 * C:n_ws + 5 * C].view(torch.uint8)[: C * _size(dweight_dtype)].view(dweight_dtype)
    else:
        ws_F = None
        dw_CW = torch.empty((C, 4), dtype=dweight_dtype, device=x.device)
        db_C = torch.empty((C,), dtype=dweight_dtype, device=x.device) if bias is not None else None
    dx_out = dx if dx is not None else torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if S == 0:
        dw_CW.zero_()
        if db_C is not None:
            db_C.zero_()
        return dx_out, dw_CW, db_C
    x_SC = _rows(x, S, C)
    dy_SC = _rows(dy, S, C)
    dx_SC = dx_out.view(S, C) if dx_out.is_contiguous() else torch.empty((S, C), dtype=x.dtype, device=x.device)
    if p.backend == "triton":
        if ws_F is None:
            ws_F = torch.empty(backward_workspace_floats(S, C), dtype=torch.float32, device=x.device)
        triton_backward(dy_SC, x_SC, weight, bias, p.cu_seqlens, p.seq_len, dx_SC, ws_F, dw_CW, db_C)
    else:
        dx32, dw32, db32, _ = reference_backward(dy_SC, x_SC, weight, bias, p.cu_seqlens, p.seq_len)
        dx_SC.copy_(dx32)
        dw_CW.copy_(dw32)
        if db_C is not None:
            db_C.copy_(db32)
    if dx_SC.data_ptr() != dx_out.data_ptr() or not dx_out.is_contiguous():
        dx_out.copy_(dx_SC.view(dx_out.shape))
    return dx_out, dw_CW, db_C


def _size(dtype) -> int:
    return torch.finfo(dtype).bits // 8
