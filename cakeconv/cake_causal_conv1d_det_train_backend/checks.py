"""Input validation of the public entry points (runs once per call, before any kernel launch).

Bad user input raises ValueError (wrong shape, value, device, backend) or TypeError (wrong dtype or
type), with the offending value in the message. ``cu_seqlens`` values are checked on the host when
they are on the CPU, or on the GPU when no CUDA graph is being captured (one small copy; a tensor
already checked and not modified since is not copied again: the check is cached per tensor
identity and version, so a training loop that reuses its ``cu_seqlens`` pays for it once).
"""

from __future__ import annotations

import operator
import weakref

import torch

from .constants import ACTIVATIONS, INTERPRET, MAX_WIDTH, MIN_WIDTH

BACKENDS = ("auto", "triton", "reference")
X_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
W_DTYPES = (torch.float32, torch.bfloat16)
B_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_TOKENS = 2**31 - 1  # the kernels index rows with int32


class Problem:
    """A validated call: x viewed as [S, C] rows, its segments, its width and activation, and the
    backend to run.

    Attributes: S, C, W (taps, weight.shape[1]), activation ("silu" or None), cu_seqlens
    (int32/int64 [N + 1] on x's device, or None), seq_len (uniform document length when cu_seqlens
    is None), backend ("triton" or "reference").
    """

    __slots__ = ("S", "C", "W", "activation", "cu_seqlens", "seq_len", "backend")

    def __init__(self, S, C, W, activation, cu_seqlens, seq_len, backend):
        self.S = S
        self.C = C
        self.W = W
        self.activation = activation
        self.cu_seqlens = cu_seqlens
        self.seq_len = seq_len
        self.backend = backend


def check_activation(activation):
    """The activation of a call: "silu" (SiLU after the conv) or None (the conv alone), returned as
    given; any other value (e.g. "relu", "swish", 1) raises ValueError naming it."""
    if activation is None or (isinstance(activation, str) and activation == "silu"):
        return activation
    raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")


def check_width(W, name: str = "width") -> int:
    """A convolution width W (taps per channel): an integer with MIN_WIDTH <= W <= MAX_WIDTH (2..8),
    returned as an int; anything else raises ValueError naming it (as ``name``)."""
    try:
        value = operator.index(W)  # numpy / torch integers too; floats and bools are refused
    except TypeError:
        value = None
    if isinstance(W, bool) or value is None or not MIN_WIDTH <= value <= MAX_WIDTH:
        raise ValueError(f"{name} must be an int from {MIN_WIDTH} to {MAX_WIDTH}, got {name}={W!r}")
    return value


def check_weight_shape(weight, C: int) -> int:
    """weight is [C, W] with 2 <= W <= 8 (ValueError naming the shape and W otherwise); returns W."""
    shape = tuple(weight.shape)
    if len(shape) != 2 or shape[0] != C:
        raise ValueError(f"weight must be [C, W] = [{C}, W] with {MIN_WIDTH} <= W <= {MAX_WIDTH}, got shape {shape}")
    W = shape[1]
    if not MIN_WIDTH <= W <= MAX_WIDTH:
        raise ValueError(f"weight must be [C, W] with {MIN_WIDTH} <= W <= {MAX_WIDTH} taps, got shape {shape} "
                         f"(W = {W})")
    return W


_capability: dict = {}


def _cuda_capability_major(device: torch.device) -> int:
    index = device.index if device.index is not None else torch.cuda.current_device()
    major = _capability.get(index)
    if major is None:
        major = torch.cuda.get_device_capability(index)[0]
        _capability[index] = major
    return major


def resolve_backend(backend, device: torch.device) -> str:
    """Map "auto" to "triton" (CUDA) or "reference" (CPU); check the choice is runnable."""
    if backend == "auto":
        return "triton" if device.type == "cuda" else "reference"
    if backend == "reference":
        return backend
    if backend != "triton":
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if device.type == "cuda":
        major = _cuda_capability_major(device)
        if major < 8:
            raise ValueError(
                f"backend='triton' needs an NVIDIA GPU of compute capability 8.0 or newer, "
                f"got {torch.cuda.get_device_name(device)} (sm_{major}x)")
    elif device.type == "cpu":
        if not INTERPRET:
            raise ValueError(
                "backend='triton' on CPU tensors needs TRITON_INTERPRET=1 set before the first "
                "import of triton; use backend='reference' (or 'auto') for CPU tensors")
    else:
        raise ValueError(f"backend='triton' does not run on device {device}")
    return backend


def check_tensor(name, t, dtypes, device=None):
    """``t`` is a tensor of one of ``dtypes`` (TypeError) on ``device`` if given (ValueError)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name} dtype must be one of {[str(d) for d in dtypes]}, got {t.dtype}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device} but x is on {device}")


_checked_cu: dict = {}


def _cu_values_checked(cu: torch.Tensor, S: int) -> bool:
    entry = _checked_cu.get(id(cu))
    return entry is not None and entry[0]() is cu and entry[1] == cu._version and entry[2] == S


def check_cu_values(cu: torch.Tensor, S: int) -> None:
    """cu[0] == 0, non-decreasing, cu[-1] == S (skipped while a CUDA graph is being captured)."""
    if _cu_values_checked(cu, S):
        return
    if cu.is_cuda and torch.cuda.is_current_stream_capturing():
        return
    v = cu.detach().to("cpu", torch.int64)
    if v[0].item() != 0:
        raise ValueError(f"cu_seqlens must start at 0, got cu_seqlens[0] = {v[0].item()}")
    steps = v[1:] - v[:-1]
    if bool((steps < 0).any()):
        i = int(torch.nonzero(steps < 0)[0].item())
        raise ValueError(
            f"cu_seqlens must be non-decreasing, got cu_seqlens[{i}] = {v[i].item()} > "
            f"cu_seqlens[{i + 1}] = {v[i + 1].item()}")
    if v[-1].item() != S:
        raise ValueError(f"cu_seqlens must end at the number of tokens S = {S}, got cu_seqlens[-1] = {v[-1].item()}")
    mark_cu_values_valid(cu, S)


def mark_cu_values_valid(cu: torch.Tensor, S: int) -> None:
    """Record ``cu`` as checked for S tokens, as ``check_cu_values`` does after reading it.

    Also for boundaries this package built on the device and that are valid by construction
    (``cakeconv.integrations.dao`` builds them from ``seq_idx``): later calls then copy nothing to
    the host. The record lasts while the tensor lives and is not modified.
    """
    if len(_checked_cu) > 256:
        _checked_cu.clear()
    key = id(cu)
    # The entry leaves with its tensor (a later tensor may get the same id).
    _checked_cu[key] = (weakref.ref(cu, lambda _ref, key=key: _checked_cu.pop(key, None)), cu._version, S)


def check_problem(x, weight, bias, cu_seqlens, backend, activation="silu") -> Problem:
    """Validate a call's operands and activation; returns the Problem (shapes, width, activation,
    segments, resolved backend)."""
    check_tensor("x", x, X_DTYPES)
    shape = x.shape
    if len(shape) == 2:
        S = shape[0]
    elif len(shape) == 3:
        S = shape[0] * shape[1]
    else:
        raise ValueError(f"x must be [S, C], [1, S, C] or [B, T, C], got shape {tuple(shape)}")
    C = shape[-1]
    if C % 8 != 0 or C == 0:
        raise ValueError(f"the channel count C must be a positive multiple of 8, got C = {C}")
    if S > MAX_TOKENS:
        raise ValueError(f"x has S = {S} tokens; at most {MAX_TOKENS} (2**31 - 1) are supported")
    if len(shape) == 3 and shape[0] != 1 and cu_seqlens is not None:
        raise ValueError(
            f"x of shape {tuple(shape)} is [B, T, C] with B = {shape[0]} equal-length documents; "
            f"cu_seqlens must be None then (pack to [1, S, C] or [S, C] for varlen)")
    device = x.device
    check_tensor("weight", weight, W_DTYPES, device)
    W = check_weight_shape(weight, C)
    if bias is not None:
        check_tensor("bias", bias, B_DTYPES, device)
        if bias.shape != (C,):
            raise ValueError(f"bias must be [C] = [{C}], got shape {tuple(bias.shape)}")
    activation = check_activation(activation)
    if not isinstance(backend, str):
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    seq_len = None
    if cu_seqlens is not None:
        if not isinstance(cu_seqlens, torch.Tensor):
            raise TypeError(f"cu_seqlens must be a torch.Tensor or None, got {type(cu_seqlens).__name__}")
        if cu_seqlens.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"cu_seqlens must be int32 or int64, got {cu_seqlens.dtype}")
        if cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 1:
            raise ValueError(f"cu_seqlens must be 1-D with at least one element, got shape {tuple(cu_seqlens.shape)}")
        if cu_seqlens.device != device:
            raise ValueError(f"cu_seqlens is on {cu_seqlens.device} but x is on {device}")
        if not cu_seqlens.is_contiguous():  # the kernels read cu[d] at offset d
            raise ValueError(f"cu_seqlens must be contiguous, got stride {cu_seqlens.stride()} "
                             f"(pass cu_seqlens.contiguous())")
        check_cu_values(cu_seqlens, S)
    else:
        seq_len = shape[1] if len(shape) == 3 else S
    return Problem(S, C, W, activation, cu_seqlens, seq_len, resolve_backend(backend, device))


def check_dy(dy, x) -> None:
    """The upstream gradient of a backward: x's shape, one of the x dtypes, on x's device."""
    check_tensor("dy", dy, X_DTYPES, x.device)
    if dy.shape != x.shape:
        raise ValueError(f"dy must have x's shape {tuple(x.shape)}, got {tuple(dy.shape)}")


def check_like(name, t, ref_shape, dtype, device):
    """A caller-provided output buffer: right type, shape, dtype and device."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if tuple(t.shape) != tuple(ref_shape):
        raise ValueError(f"{name} must have shape {tuple(ref_shape)}, got {tuple(t.shape)}")
    if t.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype}, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but x is on {device}")
