"""Dao-AILab's causal-conv1d API (``causal_conv1d_fn``, ``causal_conv1d_update``) on cakeconv.

causal-conv1d 1.7.0 (``pip install causal-conv1d``) is the depthwise causal convolution that
mamba_ssm and Hugging Face transformers' linear-attention layers call. This module has the same
two functions, with the same signatures and semantics, so that code written against it runs on
cakeconv's deterministic op by changing one import:

- ``causal_conv1d_fn(x, weight, bias=None, seq_idx=None, initial_states=None,
  return_final_states=False, final_states_out=None, activation=None)``;
- ``causal_conv1d_update(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None,
  conv_state_indices=None)``, the decode step;

- ``causal_conv1d_fwd_function(x, weight, bias, seq_idx, initial_states, final_states_out,
  silu_activation)`` and ``causal_conv1d_bwd_function(x, weight, bias, dout, seq_idx,
  initial_states, dfinal_states, dx, return_dinitial_states, silu_activation)``, the pair of
  ``causal_conv1d.cpp_functions`` that mamba_ssm's fused training paths call (Mamba2's
  ``mamba_split_conv1d_scan_combined``, Mamba1's ``mamba_inner_fn``), with their positional
  signatures: no autograd, the backward recomputes from x, writes ``dx`` in place when given and
  returns dweight / dbias in the taps' / bias' dtypes (``cakeconv.integrations.mamba_ssm.swap()``
  puts them where mamba_ssm reads them);

and, in plain PyTorch (written from causal-conv1d's documented semantics, not from its code),
``torch_causal_conv1d_fn``, ``torch_causal_conv1d_update`` and ``torch_causal_conv1d_bwd_function``
with the same signatures, which run
what neither cakeconv nor an installed causal-conv1d runs (e.g. anything on the CPU that cakeconv
does not compute). Importing this module does not import causal-conv1d.

Shape legend: B batch rows, D channels, T tokens per row, S = B * T, W taps, H = W - 1 history
columns, L conv-state columns, N documents.

The math (causal-conv1d's), for row b, channel d, token t, with x_b[t] = 0 for t < 0 (or the
``initial_states`` columns there):

    pre[b, d, t] = bias[d] + sum_{k=0..W-1} weight[d, k] * x[b, d, t - (W - 1) + k] * same(t - (W - 1) + k, t)
    y[b, d, t]   = silu(pre) if activation in ("silu", "swish") else pre

``weight[:, W - 1]`` multiplies the current token. Without ``seq_idx``, same() is 1. With
``seq_idx [B, T]``, same(s, t) is 1 when seq_idx[b, s] == seq_idx[b, t] (0 for s < 0 without
initial states), and y is 0 where seq_idx[b, t] < 0 (padding tokens).

What runs where: one rule. cakeconv runs the training op, that is every call of
``causal_conv1d_fn`` that carries no conv state (no ``initial_states``, ``return_final_states``
False) and whose operands its op takes (``cake_causal_conv1d_det``: bitwise repeatable y, dx,
dweight, dbias; FP32 arithmetic rounded once). The operands it takes:

- W from 2 to 8, run at its real width (dweight is the ``[D, W]`` gradient itself);
- ``activation`` None (the plain convolution), or "silu" / "swish" (causal-conv1d's two names of
  SiLU, fused);
- D a multiple of 8; x bf16, fp16 or fp32; weight and bias fp32, bf16 or fp16 (fp16 taps are
  widened to fp32, exactly; their gradient is rounded once back to fp16);
- x on a device cakeconv runs on (the CPU, or an NVIDIA GPU of compute capability >= 8.0).

Everything else is delegated: conv state (``initial_states``, ``return_final_states``, and the
decode step ``causal_conv1d_update``, which is always delegated: decoding is not the training op),
and operands outside that list (W = 1 or W > 8, D not a multiple of 8, fp64, a device cakeconv
does not run on). ``delegation_reason`` says, for given arguments, which rule sends a call away
(None: cakeconv runs it). A delegated call goes to causal-conv1d's own function when it is
installed, x is on a CUDA device and its kernels take the operands (W of 2-4, fp32/fp16/bf16, a
bias of the taps' dtype, its layout rules), else to ``torch_causal_conv1d_fn`` /
``torch_causal_conv1d_update`` (the same results up to FP32 rounding). Delegated calls keep
causal-conv1d's properties: its weight gradient is not bitwise repeatable.

Layouts. x may have causal-conv1d's channel-last layout (``x.stride(1) == 1``, e.g. the
``[B, D, T]`` view ``x_BTD.transpose(1, 2)`` of a token-major tensor, what transformers and
mamba_ssm pass): cakeconv reads it in place, no copy, and y has the same layout. Any other
layout (channel-first ``[B, D, T]`` contiguous) is copied to channel-last and y copied back to
contiguous, as causal-conv1d returns it (``seq_idx`` is taken in either layout; causal-conv1d takes
it channel-last only).

``seq_idx`` on the cakeconv path: each row is cut into documents where seq_idx changes between
neighbouring tokens (and at every row start), ``cu_seqlens_from_seq_idx``. This is causal-conv1d's
rule whenever each document's tokens are contiguous in its row and no id is negative (what
transformers' ``DataCollatorWithFlattening(return_seq_idx=True)`` and mamba_ssm produce). Other
ids are read as they come: an id that reappears after another id starts a new document (causal-
conv1d lets it read the earlier tokens of that id), and a negative id is an ordinary id (causal-
conv1d writes y = 0 there). ``check_seq_idx(seq_idx)`` tells the two kinds apart (it reads the
values: a host sync on the GPU). The boundaries are built on x's device without reading any
value on the host (no synchronisation), as B * T + 1 entries (documents past the last one are
empty), and are kept per ``seq_idx`` tensor while it lives and is not modified, so the layers of a
model that share one ``seq_idx`` build them once.

Errors: bad shapes, dtypes, devices or arguments raise ValueError / TypeError naming the value,
before any computation, on every path (an unknown ``activation`` raises ValueError, where
causal-conv1d raises NotImplementedError).
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

from .. import (cake_causal_conv1d_det, cake_causal_conv1d_det_train_backward,
                cake_causal_conv1d_det_train_forward)
from . import _operands
from ._operands import ACTIVATIONS, SILU_NAMES as SILU_ACTIVATIONS, cake_activation as _cake_activation
from ..cake_causal_conv1d_det_train_backend import checks

try:  # the CUDA build of torch: the current raw stream, cheaply
    from torch._C import _cuda_getCurrentRawStream
except ImportError:  # CPU build
    _cuda_getCurrentRawStream = None

__all__ = [
    "causal_conv1d_fn",
    "causal_conv1d_update",
    "torch_causal_conv1d_fn",
    "torch_causal_conv1d_update",
    "delegation_reason",
    "cu_seqlens_from_seq_idx",
    "check_seq_idx",
    "dao_causal_conv1d",
    "causal_conv1d_fwd_function",
    "causal_conv1d_bwd_function",
    "torch_causal_conv1d_bwd_function",
    "pair_delegation_reason",
    "dao_cpp_functions",
]

DAO_MAX_WIDTH = 4  # causal-conv1d's kernels take W = 2..4
X_DTYPES = (torch.bfloat16, torch.float16, torch.float32)  # what causal-conv1d's kernels take (_dao_takes)
PARAM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
CAKE_BACKENDS = ("auto", "triton", "reference")

# causal-conv1d's (causal_conv1d_fn, causal_conv1d_update), or () when it does not import; None: not tried.
_DAO = None


def dao_causal_conv1d():
    """causal-conv1d's ``(causal_conv1d_fn, causal_conv1d_update)``, or None when it does not import.

    Imported on first use and remembered (a failed import is not retried).
    """
    global _DAO
    if _DAO is None:
        try:
            from causal_conv1d import causal_conv1d_fn as fn, causal_conv1d_update as update
            _DAO = (fn, update)
        except (ImportError, OSError):  # not installed, or its extension does not load here
            _DAO = ()
    return _DAO or None



# ------------------------------------------------------------------------------------ checks

def _shape(t) -> object:
    return tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__


def _check_tensor(name: str, t, dims: tuple, device: torch.device) -> None:
    """t is a tensor of shape ``dims`` (None entries: any size) on ``device``."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    shape = t.shape
    ok = len(shape) == len(dims)
    for have, want in zip(shape, dims):
        ok = ok and (want is None or have == want)
    if not ok:
        want = ", ".join("*" if w is None else str(w) for w in dims)
        raise ValueError(f"{name} must have shape [{want}], got {tuple(shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but x is on {device}")


def _check_activation(activation) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be None, 'silu' or 'swish', got {activation!r}")


def _check_index(name: str, t, dims: tuple, device: torch.device) -> None:
    _check_tensor(name, t, dims, device)
    if t.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be int32 or int64, got {t.dtype}")


def _check_fn_args(x, weight, bias, seq_idx, initial_states, return_final_states, final_states_out,
                   activation) -> None:
    """Validate ``causal_conv1d_fn``'s arguments from their metadata (no value is read)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 3:
        raise ValueError(f"x must be [B, D, T], got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got {x.dtype}")
    B, D, T = x.shape
    _check_tensor("weight", weight, (D, None), x.device)
    W = weight.shape[1]
    if W < 1:
        raise ValueError(f"weight must be [D, W] with W >= 1, got shape {tuple(weight.shape)}")
    if bias is not None:
        _check_tensor("bias", bias, (D,), x.device)
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
    _check_activation(activation)
    if seq_idx is not None:
        _check_index("seq_idx", seq_idx, (B, T), x.device)
        if return_final_states:
            raise ValueError("return_final_states=True cannot be combined with seq_idx (as in causal-conv1d)")
    if initial_states is not None:
        _check_tensor("initial_states", initial_states, (B, D, W - 1), x.device)
    if return_final_states and final_states_out is not None:
        _check_tensor("final_states_out", final_states_out, (B, D, W - 1), x.device)


def delegation_reason(x, weight, bias=None, seq_idx=None, initial_states=None, return_final_states=False,
                      final_states_out=None, activation=None) -> str | None:
    """Why ``causal_conv1d_fn`` with these (valid) arguments is delegated, or None when cakeconv runs it.

    Takes ``causal_conv1d_fn``'s arguments; the rules are the module docstring's.
    """
    if initial_states is not None:
        return "initial_states given"
    if return_final_states:
        return "return_final_states = True"
    return (_operands.width_activation_reason(weight.shape[1], activation)
            or _operands.operands_reason(x.shape[1], x.dtype, weight.dtype, None if bias is None else bias.dtype,
                                         x.device, widened_taps=(torch.float16,)))


# ----------------------------------------------------------------------- seq_idx -> cu_seqlens

def check_seq_idx(seq_idx: torch.Tensor) -> None:
    """Raise ValueError unless cakeconv reads ``seq_idx [B, T]`` as causal-conv1d does.

    That is: no id is negative, and in each row the tokens of one id are contiguous (no id comes
    back after another). Reads the values (a host synchronisation when on the GPU).
    """
    if not isinstance(seq_idx, torch.Tensor) or seq_idx.dim() != 2:
        raise ValueError(f"seq_idx must be a [B, T] tensor, got {_shape(seq_idx)}")
    ids_BT = seq_idx.detach().to("cpu", torch.int64)
    negative = torch.nonzero(ids_BT < 0)
    if negative.shape[0]:
        b, t = negative[0].tolist()
        raise ValueError(f"seq_idx[{b}, {t}] = {ids_BT[b, t].item()} < 0: causal-conv1d writes 0 at such padding "
                         f"tokens, cakeconv reads them as a document")
    for b in range(ids_BT.shape[0]):
        runs = torch.unique_consecutive(ids_BT[b])
        if torch.unique(runs).numel() != runs.numel():
            raise ValueError(f"seq_idx row {b} has an id whose tokens are not contiguous (runs "
                             f"{runs.tolist()[:16]}...): causal-conv1d lets its tokens read each other across "
                             f"other ids, cakeconv does not")


# seq_idx id -> (weakref to seq_idx, its version, raw stream, cu): the boundaries of live seq_idx tensors.
_CU_CACHE: dict = {}
_MAX_CU_ENTRIES = 64


def _build_cu(seq_idx_BT: torch.Tensor) -> torch.Tensor:
    """int32 [S + 1]: cu[d] = first token of the d-th run of equal ids in row-major order, S past the last."""
    B, T = seq_idx_BT.shape
    S = B * T
    new_BT = torch.ones((B, T), dtype=torch.bool, device=seq_idx_BT.device)
    if T > 1:
        torch.ne(seq_idx_BT[:, 1:], seq_idx_BT[:, :-1], out=new_BT[:, 1:])
    run_S = torch.cumsum(new_BT.view(S), 0, dtype=torch.int32)  # 1 + the document of each token
    targets_N1 = torch.arange(1, S + 2, dtype=torch.int32, device=seq_idx_BT.device)
    return torch.searchsorted(run_S, targets_N1, out_int32=True)  # first token whose document is >= d


def cu_seqlens_from_seq_idx(seq_idx: torch.Tensor) -> torch.Tensor:
    """Document boundaries of ``seq_idx [B, T]`` as cakeconv reads it: int32 ``cu [B * T + 1]``.

    A document starts at every row start and wherever seq_idx differs from the token before; the
    tokens are taken row after row (S = B * T). ``cu[d]`` is the first token of document d, and
    ``cu[d] = S`` for d at or past the number of documents (empty documents, allowed by the op).

    Built on seq_idx's device from its values there, with no host synchronisation, and recorded as
    valid for S tokens (cakeconv then copies none of it to the host). Kept per seq_idx tensor while
    it lives and is not modified in place (and per CUDA stream), so calls that share one seq_idx
    get the same tensor; not kept while a CUDA graph is captured or under torch.compile (built
    every time then; under torch.compile the op then checks the new boundaries on the host, one
    synchronisation per call).
    """
    if torch.compiler.is_compiling():
        return _build_cu(seq_idx)
    on_gpu = seq_idx.is_cuda
    if on_gpu and torch.cuda.is_current_stream_capturing():
        return _build_cu(seq_idx)
    stream = _cuda_getCurrentRawStream(seq_idx.get_device()) if on_gpu else 0
    key = id(seq_idx)
    entry = _CU_CACHE.get(key)
    if entry is not None and entry[0]() is seq_idx and entry[1] == seq_idx._version and entry[2] == stream:
        return entry[3]
    cu_N1 = _build_cu(seq_idx)
    checks.mark_cu_values_valid(cu_N1, seq_idx.numel())
    if len(_CU_CACHE) >= _MAX_CU_ENTRIES:
        _CU_CACHE.clear()
    # The entry leaves with its tensor (a later tensor may get the same id).
    _CU_CACHE[key] = (weakref.ref(seq_idx, lambda _ref, key=key: _CU_CACHE.pop(key, None)), seq_idx._version,
                      stream, cu_N1)
    return cu_N1


# ------------------------------------------------------------------------- the cakeconv path

def _channel_last(x_BDT: torch.Tensor) -> bool:
    """causal-conv1d's test: channels adjacent in memory and tokens not (its channel-last kernels)."""
    return x_BDT.stride(1) == 1 and x_BDT.stride(2) > 1


def _in_layout_of_x(t_BTD: torch.Tensor, x_BDT: torch.Tensor) -> torch.Tensor:
    """A [B, T, D] result as causal-conv1d returns it for x: the channel-last [B, D, T] view when x is
    channel-last (or has one token), else a contiguous [B, D, T] copy."""
    t_BDT = t_BTD.transpose(1, 2)
    return t_BDT if _channel_last(x_BDT) or x_BDT.shape[2] == 1 else t_BDT.contiguous()


def _cake_taps(weight_DW: torch.Tensor) -> torch.Tensor:
    """Taps as cakeconv's op takes them: fp16 widened to fp32 (exact; autograd, or the caller, rounds
    dweight back to fp16 once)."""
    return weight_DW.float() if weight_DW.dtype == torch.float16 else weight_DW


def _cake_fn(x_BDT, weight_DW, bias_D, seq_idx_BT, activation, backend):
    """y [B, D, T] = act(conv) on cakeconv's op at the real width W, in x's layout (module docstring)."""
    B, D, T = x_BDT.shape
    x_BTD = x_BDT.transpose(1, 2)  # a view; rows of D channels
    if not (_channel_last(x_BDT) or T == 1):
        x_BTD = x_BTD.contiguous()
    weight_DW = _cake_taps(weight_DW)
    act = _cake_activation(activation)
    if seq_idx_BT is None:
        y_BTD = cake_causal_conv1d_det(x_BTD, weight_DW, bias_D, activation=act, backend=backend)
    else:
        cu_N1 = cu_seqlens_from_seq_idx(seq_idx_BT)
        y_SD = cake_causal_conv1d_det(x_BTD.reshape(B * T, D), weight_DW, bias_D, cu_seqlens=cu_N1,
                                      activation=act, backend=backend)
        y_BTD = y_SD.view(B, T, D)
    return _in_layout_of_x(y_BTD, x_BDT)


def causal_conv1d_fn(x, weight, bias=None, seq_idx=None, initial_states=None, return_final_states=False,
                     final_states_out=None, activation=None, *, backend="auto"):
    """causal-conv1d 1.7.0's ``causal_conv1d_fn``, on cakeconv's deterministic op where it applies.

    Args:
        x: [B, D, T], bf16, fp16 or fp32; channel-last (``x.stride(1) == 1``) is read in place.
        weight: [D, W] (``conv1d.weight.squeeze(1)``); weight[:, W - 1] multiplies the current token.
        bias: optional [D].
        seq_idx: optional int32/int64 [B, T] on x's device: tokens read only earlier tokens of
            their own id (module docstring for how cakeconv reads it).
        initial_states: optional [B, D, W - 1], the columns before token 0 (delegated).
        return_final_states: also return the last W - 1 columns, [B, D, W - 1] (delegated).
        final_states_out: optional [B, D, W - 1] buffer for them.
        activation: None, "silu" or "swish".
        backend: cakeconv's backend for the calls it runs: "auto", "triton" or "reference".

    Returns:
        y [B, D, T] in x's dtype (and the final states when ``return_final_states``).

    Raises:
        ValueError, TypeError: bad arguments (the message names the value), on every path.
    """
    _check_fn_args(x, weight, bias, seq_idx, initial_states, return_final_states, final_states_out, activation)
    if backend not in CAKE_BACKENDS:
        raise ValueError(f"backend must be one of {CAKE_BACKENDS}, got {backend!r}")
    if delegation_reason(x, weight, bias, seq_idx, initial_states, return_final_states, final_states_out,
                         activation) is None:
        return _cake_fn(x, weight, bias, seq_idx, activation, backend)
    dao = dao_causal_conv1d() if x.is_cuda else None
    if dao is None or not _dao_takes(x, weight, bias, seq_idx is not None or initial_states is not None
                                     or return_final_states):
        return torch_causal_conv1d_fn(x, weight, bias, seq_idx, initial_states, return_final_states,
                                      final_states_out, activation)
    return dao[0](x, weight, bias, _int32(seq_idx), initial_states, return_final_states, final_states_out, activation)


def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None,
                         conv_state_indices=None):
    """causal-conv1d 1.7.0's ``causal_conv1d_update`` (one decode step; updates ``conv_state`` in place).

    Always delegated: to causal-conv1d's function when installed and x is on a CUDA device, else to
    ``torch_causal_conv1d_update`` (see it for the arguments). Arguments are validated first.
    """
    _check_update_args(x, conv_state, weight, bias, activation, cache_seqlens, conv_state_indices)
    dao = dao_causal_conv1d() if x.is_cuda else None
    if dao is None or not (_dao_takes(x, weight, bias) and conv_state.dtype == x.dtype):
        return torch_causal_conv1d_update(x, conv_state, weight, bias, activation, cache_seqlens, conv_state_indices)
    return dao[1](x, conv_state, weight, bias, activation, _int32(cache_seqlens), _int32(conv_state_indices))


def _dao_takes(x, weight, bias, channel_last_only=False) -> bool:
    """Whether causal-conv1d 1.7.0's kernels take these operands (else its checks would raise):
    W of 2-4, fp32/fp16/bf16 x and taps, a bias of the taps' dtype, and for the channel-last layout
    (the only one with seq_idx or states) D and the strides multiples of 8."""
    if not (2 <= weight.shape[1] <= DAO_MAX_WIDTH and x.dtype in X_DTYPES and weight.dtype in PARAM_DTYPES):
        return False
    if bias is not None and bias.dtype != weight.dtype:
        return False
    if x.dim() == 2:  # a decode step's [B, D]
        return True
    if _channel_last(x):
        return x.shape[1] % 8 == 0 and x.stride(0) % 8 == 0 and x.stride(2) % 8 == 0
    return not channel_last_only


def _int32(t):
    """An index tensor as causal-conv1d takes it (int32, contiguous), or None."""
    return None if t is None else t.to(torch.int32).contiguous()


# --------------------------------------- causal-conv1d's cpp_functions pair (mamba_ssm's fused paths)

# causal-conv1d's (causal_conv1d_fwd_function, causal_conv1d_bwd_function), or () when they do not import.
_DAO_PAIR = None


def dao_cpp_functions():
    """causal-conv1d's ``(causal_conv1d_fwd_function, causal_conv1d_bwd_function)`` from
    ``causal_conv1d.cpp_functions``, or None when they do not import (remembered, not retried)."""
    global _DAO_PAIR
    if _DAO_PAIR is None:
        try:
            from causal_conv1d.cpp_functions import causal_conv1d_bwd_function as bwd
            from causal_conv1d.cpp_functions import causal_conv1d_fwd_function as fwd
            _DAO_PAIR = (fwd, bwd)
        except (ImportError, OSError):
            _DAO_PAIR = ()
    return _DAO_PAIR or None


def pair_delegation_reason(x, weight, bias=None, initial_states=None, final_states_out=None, dfinal_states=None,
                           return_dinitial_states=False) -> str | None:
    """Why a call of ``causal_conv1d_fwd_function`` / ``causal_conv1d_bwd_function`` with these (valid)
    arguments is delegated, or None when cakeconv runs it (the rule of ``delegation_reason``)."""
    if initial_states is not None:
        return "initial_states given"
    if final_states_out is not None:
        return "final_states_out given"
    if dfinal_states is not None:
        return "dfinal_states given"
    if return_dinitial_states:
        return "return_dinitial_states = True"
    return delegation_reason(x, weight, bias, activation="silu")


def _check_pair_args(x, weight, bias, seq_idx, initial_states, final_states_out, silu_activation) -> None:
    """Validate the pair's common arguments from their metadata (no value is read)."""
    _check_fn_args(x, weight, bias, seq_idx, initial_states, False, None, None)
    if final_states_out is not None:
        _check_tensor("final_states_out", final_states_out, (x.shape[0], x.shape[1], weight.shape[1] - 1), x.device)
    if not isinstance(silu_activation, bool):
        raise TypeError(f"silu_activation must be a bool, got {type(silu_activation).__name__}")


def _rows_of(t_BDT: torch.Tensor, seq_idx) -> torch.Tensor:
    """A [B, D, T] tensor as the op's rows: the [B, T, D] view, or [B * T, D] with seq_idx
    (a view when the layout allows, else a copy)."""
    t_BTD = t_BDT.transpose(1, 2)
    if seq_idx is None:
        return t_BTD
    return t_BTD.reshape(t_BTD.shape[0] * t_BTD.shape[1], t_BTD.shape[2])


def causal_conv1d_fwd_function(x, weight, bias, seq_idx, initial_states, final_states_out, silu_activation, *,
                               backend="auto"):
    """causal-conv1d 1.7.0's ``causal_conv1d_fwd_function`` (what mamba_ssm's fused paths call), on cakeconv.

    The forward of ``causal_conv1d_fn`` without autograd, with causal-conv1d's positional
    signature: y = act(conv(x)) of the module docstring, act SiLU when ``silu_activation`` else
    the identity. cakeconv runs it unless ``pair_delegation_reason`` names a reason (conv state,
    or operands outside the op's); then causal-conv1d's own function runs it when it imports and
    x is on a CUDA device and its kernels take the operands, else ``torch_causal_conv1d_fn``.

    Args:
        x: [B, D, T]; mamba_ssm passes the channel-last view ``xBC.transpose(1, 2)`` of a slice of
            its [B, T, *] projection (``x.stride(1) == 1``, a row stride that is a multiple of 8):
            read in place.
        weight: [D, W]; bias: [D] or None.
        seq_idx: int32 [B, T] or None (module docstring for how cakeconv reads it).
        initial_states: [B, D, W - 1] or None; final_states_out: [B, D, W - 1] buffer or None
            (either one delegates the call).
        silu_activation: bool.
        backend: cakeconv's backend: "auto", "triton" or "reference".

    Returns:
        y [B, D, T] in x's dtype: channel-last when x is (causal-conv1d's ``empty_like(x)``),
        contiguous otherwise.
    """
    _check_pair_args(x, weight, bias, seq_idx, initial_states, final_states_out, silu_activation)
    if backend not in CAKE_BACKENDS:
        raise ValueError(f"backend must be one of {CAKE_BACKENDS}, got {backend!r}")
    activation = "silu" if silu_activation else None
    if pair_delegation_reason(x, weight, bias, initial_states, final_states_out) is not None:
        pair = dao_cpp_functions() if x.is_cuda else None
        states = seq_idx is not None or initial_states is not None or final_states_out is not None
        if pair is not None and _dao_takes(x, weight, bias, states):  # its kernels take those channel-last only
            return pair[0](x, weight, bias, _int32(seq_idx), initial_states, final_states_out, silu_activation)
        out = torch_causal_conv1d_fn(x, weight, bias, seq_idx, initial_states, final_states_out is not None,
                                     final_states_out, activation)
        return out[0] if final_states_out is not None else out
    B, D, T = x.shape
    cu_N1 = None if seq_idx is None else cu_seqlens_from_seq_idx(seq_idx)
    y_rows = cake_causal_conv1d_det_train_forward(_rows_of(x, seq_idx), _cake_taps(weight), bias, cu_N1,
                                                  activation=activation, backend=backend)
    return _in_layout_of_x(y_rows.view(B, T, D), x)


def causal_conv1d_bwd_function(x, weight, bias, dout, seq_idx, initial_states, dfinal_states, dx,
                               return_dinitial_states, silu_activation, *, backend="auto"):
    """causal-conv1d 1.7.0's ``causal_conv1d_bwd_function`` (what mamba_ssm's fused paths call), on cakeconv.

    The gradients of ``causal_conv1d_fwd_function`` for ``dout`` = dL/dy: (dx, dweight, dbias,
    dinitial_states), with causal-conv1d's positional signature. On cakeconv, dweight and dbias are
    bitwise repeatable (summed in FP32 in one fixed order, returned in the weight's and the bias'
    dtypes; causal-conv1d's default mode sums them with atomics). The pre-activation is recomputed
    from x. Delegated as ``causal_conv1d_fwd_function`` (also for ``dfinal_states`` or
    ``return_dinitial_states``); the PyTorch fallback differentiates ``torch_causal_conv1d_fn``.

    Args:
        x, weight, bias, seq_idx, initial_states, silu_activation: the forward's.
        dout: [B, D, T], dL/dy (any layout; mamba_ssm passes a channel-last view).
        dfinal_states: [B, D, W - 1] gradient of the final states, or None.
        dx: None, or a [B, D, T] buffer of x's dtype that receives dx in place (mamba_ssm passes a
            channel-last view into its input gradient); it is returned.
        return_dinitial_states: also return the initial states' gradient.
        backend: cakeconv's backend: "auto", "triton" or "reference".

    Returns:
        (dx, dweight, dbias, dinitial_states): dweight in the weight's dtype, dbias in the bias'
        dtype (None without bias), dinitial_states None unless asked for.
    """
    _check_pair_args(x, weight, bias, seq_idx, initial_states, None, silu_activation)
    _check_tensor("dout", dout, tuple(x.shape), x.device)
    if dx is not None:
        _check_tensor("dx", dx, tuple(x.shape), x.device)
        if dx.dtype != x.dtype:
            raise TypeError(f"dx must have x's dtype {x.dtype}, got {dx.dtype}")
    if dfinal_states is not None:
        _check_tensor("dfinal_states", dfinal_states, (x.shape[0], x.shape[1], weight.shape[1] - 1), x.device)
    if backend not in CAKE_BACKENDS:
        raise ValueError(f"backend must be one of {CAKE_BACKENDS}, got {backend!r}")
    activation = "silu" if silu_activation else None
    if pair_delegation_reason(x, weight, bias, initial_states, None, dfinal_states, return_dinitial_states) is not None:
        pair = dao_cpp_functions() if x.is_cuda else None
        states = (seq_idx is not None or initial_states is not None or dfinal_states is not None
                  or return_dinitial_states)
        if pair is not None and _dao_takes(x, weight, bias, states):  # its kernels take those channel-last only
            return pair[1](x, weight, bias, dout, _int32(seq_idx), initial_states, dfinal_states, dx,
                           return_dinitial_states, silu_activation)
        return torch_causal_conv1d_bwd_function(x, weight, bias, dout, seq_idx, initial_states, dfinal_states, dx,
                                                return_dinitial_states, silu_activation)
    B, D, T = x.shape
    cu_N1 = None if seq_idx is None else cu_seqlens_from_seq_idx(seq_idx)
    x_rows = _rows_of(x, seq_idx)
    dx_rows = None
    if dx is not None:
        try:  # write into dx's memory: its rows must be a view of it
            dx_rows = dx.transpose(1, 2) if seq_idx is None else dx.transpose(1, 2).view(x_rows.shape)
        except RuntimeError:
            dx_rows = None
    dx_out, dw_DW, db_D = cake_causal_conv1d_det_train_backward(
        _rows_of(dout, seq_idx), x_rows, _cake_taps(weight), bias, cu_N1, dx=dx_rows, dweight_dtype=weight.dtype,
        activation=activation, backend=backend)
    if dx is None:
        dx = _in_layout_of_x(dx_out.view(B, T, D), x)
    elif dx_rows is None:
        dx.copy_(dx_out.view(B, T, D).transpose(1, 2))
    if db_D is not None and db_D.dtype != bias.dtype:
        db_D = db_D.to(bias.dtype)
    return dx, dw_DW, db_D, None


def torch_causal_conv1d_bwd_function(x, weight, bias, dout, seq_idx, initial_states, dfinal_states, dx,
                                     return_dinitial_states, silu_activation):
    """``causal_conv1d_bwd_function`` in plain PyTorch: autograd through ``torch_causal_conv1d_fn``.

    The same arguments and results as ``causal_conv1d_bwd_function`` (without ``backend``);
    FP32 arithmetic; dinitial_states is the gradient of the given initial states (of zero
    columns when none were given).
    """
    activation = "silu" if silu_activation else None
    want_final = dfinal_states is not None
    with torch.enable_grad():
        x_in = x.detach().requires_grad_(True)
        w_in = weight.detach().requires_grad_(True)
        b_in = None if bias is None else bias.detach().requires_grad_(True)
        init = initial_states
        if init is None and return_dinitial_states:
            init = x.new_zeros((x.shape[0], x.shape[1], weight.shape[1] - 1))
        init_in = None if init is None else init.detach().requires_grad_(return_dinitial_states)
        out = torch_causal_conv1d_fn(x_in, w_in, b_in, seq_idx, init_in, want_final, None, activation)
        outputs = out if want_final else (out,)
        grads_out = (dout, dfinal_states) if want_final else (dout,)
        inputs = [x_in, w_in] + ([b_in] if b_in is not None else []) + ([init_in] if return_dinitial_states else [])
        grads = torch.autograd.grad(outputs, inputs, grads_out, allow_unused=True)
    dx_new, dweight = grads[0], grads[1]
    dbias = grads[2] if b_in is not None else None
    dinit = grads[-1] if return_dinitial_states else None
    if dx is None:
        dx = _in_layout_of(x, dx_new)
    else:
        dx.copy_(dx_new)
    return dx, dweight.to(weight.dtype), None if dbias is None else dbias.to(bias.dtype), dinit


# ------------------------------------------------------------------ the PyTorch implementations

def _accumulate_dtype(*tensors) -> torch.dtype:
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32


def _taps_sum(window_BDK, weight_DW, bias_D, T, same_BWT=None):
    """pre[b, d, t] = bias[d] + sum_k weight[d, k] * window[b, d, t + k] (* same[b, k, t]), k ascending."""
    B, D, _ = window_BDK.shape
    acc = window_BDK.dtype
    pre_BDT = window_BDK.new_zeros((B, D, T)) if bias_D is None else bias_D.to(acc)[None, :, None].expand(B, D, T)
    w_DW = weight_DW.to(acc)
    for k in range(weight_DW.shape[1]):
        tap_BDT = w_DW[:, k, None] * window_BDK[:, :, k:k + T]
        if same_BWT is not None:
            tap_BDT = torch.where(same_BWT[:, None, k, :], tap_BDT, 0.0)  # skipped, as causal-conv1d does
        pre_BDT = pre_BDT + tap_BDT
    return pre_BDT


def _in_layout_of(x_BDT: torch.Tensor, y_BDT: torch.Tensor) -> torch.Tensor:
    """y (any layout) copied into a tensor with x's strides, as causal-conv1d allocates its output."""
    out_BDT = torch.empty_like(x_BDT)
    return out_BDT.copy_(y_BDT)


def torch_causal_conv1d_fn(x, weight, bias=None, seq_idx=None, initial_states=None, return_final_states=False,
                           final_states_out=None, activation=None):
    """``causal_conv1d_fn`` in plain PyTorch (autograd through every input), FP32 arithmetic.

    The math of the module docstring, exactly (seq_idx as causal-conv1d reads it, any W >= 1),
    computed in FP32 (float64 if an input is float64) and rounded once to x's dtype. y has x's
    strides; the final states are ``[B, D, W - 1]`` channel-last when allocated here.
    """
    _check_fn_args(x, weight, bias, seq_idx, initial_states, return_final_states, final_states_out, activation)
    B, D, T = x.shape
    H = weight.shape[1] - 1
    acc = _accumulate_dtype(x, weight, bias, initial_states)
    head_BDH = x.new_zeros((B, D, H), dtype=acc) if initial_states is None else initial_states.to(acc)
    window_BDK = torch.cat([head_BDH, x.to(acc)], dim=2)  # column j is token j - H
    same_BWT = None
    if seq_idx is not None:
        ids_BT = seq_idx.long()
        head_id = ids_BT[:, :1] if initial_states is not None else torch.full_like(ids_BT[:, :1], -1)
        ids_BK = torch.cat([head_id.expand(B, H), ids_BT], dim=1)
        same_BWT = torch.stack([ids_BK[:, k:k + T] == ids_BT for k in range(H + 1)], dim=1)
    pre_BDT = _taps_sum(window_BDK, weight, bias, T, same_BWT)
    if seq_idx is not None:
        pre_BDT = torch.where((seq_idx < 0)[:, None, :], 0.0, pre_BDT)  # padding tokens
    y_BDT = F.silu(pre_BDT) if activation in SILU_ACTIVATIONS else pre_BDT
    out_BDT = _in_layout_of(x, y_BDT.to(x.dtype))
    if not return_final_states:
        return out_BDT
    last_BDH = window_BDK[:, :, window_BDK.shape[2] - H:].to(x.dtype)
    if final_states_out is None:
        final_states_out = x.new_empty((B, H, D)).transpose(1, 2)
    return out_BDT, final_states_out.copy_(last_BDH)


def _check_update_args(x, conv_state, weight, bias, activation, cache_seqlens, conv_state_indices) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() not in (2, 3):
        raise ValueError(f"x must be [B, D] or [B, D, T], got shape {tuple(x.shape)}")
    B, D = x.shape[:2]
    _check_tensor("weight", weight, (D, None), x.device)
    W = weight.shape[1]
    _check_tensor("conv_state", conv_state, (None if conv_state_indices is not None else B, D, None), x.device)
    if conv_state.shape[2] < W - 1 or W < 1:
        raise ValueError(f"conv_state must have at least W - 1 = {W - 1} columns, got shape {tuple(conv_state.shape)}")
    if bias is not None:
        _check_tensor("bias", bias, (D,), x.device)
    _check_activation(activation)
    if cache_seqlens is not None:
        _check_index("cache_seqlens", cache_seqlens, (B,), x.device)
    if conv_state_indices is not None:
        _check_index("conv_state_indices", conv_state_indices, (B,), x.device)


def _state_windows(x_BDT, state_BDL, H, cache_seqlens):
    """(the H history columns read before x, the new L-column state) of each row's state."""
    B, D, T = x_BDT.shape
    L = state_BDL.shape[2]
    x_s = x_BDT.to(state_BDL.dtype)
    if cache_seqlens is None:  # a shift register: the last L columns of [state, x]
        return state_BDL[:, :, L - H:], torch.cat([state_BDL, x_s], dim=2)[:, :, -L:]
    # a circular buffer: column (cache_seqlens + j) % L holds token j; history ends just before it
    start_B1 = cache_seqlens.long()[:, None] % L
    read_BH = (start_B1 + torch.arange(-H, 0, device=x_BDT.device)) % L
    hist_BDH = state_BDL.gather(2, read_BH[:, None, :].expand(B, D, H))
    keep = min(T, L)  # later tokens overwrite earlier ones: only the last L are written
    write_BK = (start_B1 + torch.arange(T - keep, T, device=x_BDT.device)) % L
    new_BDL = state_BDL.scatter(2, write_BK[:, None, :].expand(B, D, keep), x_s[:, :, T - keep:])
    return hist_BDH, new_BDL


def torch_causal_conv1d_update(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None,
                               conv_state_indices=None):
    """``causal_conv1d_update`` in plain PyTorch: T new tokens after the state's history, FP32 arithmetic.

    Args:
        x: [B, D] (one token) or [B, D, T].
        conv_state: [B, D, L] (or [E, D, L] with ``conv_state_indices``), L >= W - 1, x's dtype;
            updated in place to the last L columns seen.
        weight, bias, activation: as ``causal_conv1d_fn``.
        cache_seqlens: optional int [B]: the state is a circular buffer and token 0 goes to column
            ``cache_seqlens % L``.
        conv_state_indices: optional int [B]: row b uses state ``conv_state[indices[b]]``; a
            negative index is a padding row (y = 0, no state touched).

    Returns:
        y of x's shape and dtype.
    """
    _check_update_args(x, conv_state, weight, bias, activation, cache_seqlens, conv_state_indices)
    one_token = x.dim() == 2
    x_BDT = x.unsqueeze(-1) if one_token else x
    T = x_BDT.shape[2]
    H = weight.shape[1] - 1
    rows_B = None
    if conv_state_indices is None:
        state_BDL = conv_state
    else:
        rows_B = conv_state_indices.long()
        state_BDL = conv_state[rows_B.clamp(min=0)]
    hist_BDH, new_BDL = _state_windows(x_BDT, state_BDL, H, cache_seqlens)
    acc = _accumulate_dtype(x, weight, bias)
    window_BDK = torch.cat([hist_BDH.to(acc), x_BDT.to(acc)], dim=2)
    pre_BDT = _taps_sum(window_BDK, weight, bias, T)
    y_BDT = (F.silu(pre_BDT) if activation in SILU_ACTIVATIONS else pre_BDT).to(x.dtype)
    if rows_B is None:
        conv_state.copy_(new_BDL)
    else:
        live_B = rows_B >= 0
        conv_state[rows_B[live_B]] = new_BDL[live_B]  # boolean indexing: a host sync on the GPU
        y_BDT = torch.where(live_B[:, None, None], y_BDT, 0.0)
    return y_BDT.squeeze(-1) if one_token else y_BDT
