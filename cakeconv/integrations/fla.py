"""flash-linear-attention's short convolution on cakeconv's deterministic op: module and function.

flash-linear-attention (``fla``, 0.6.0) builds the short convolutions of its layers (GatedDeltaNet,
KDA, DeltaNet, ...) from ``fla.modules.ShortConvolution``, an ``nn.Conv1d`` subclass, whose forward
calls the function ``fla.modules.causal_conv1d.causal_conv1d``. This module gives

- ``swap_short_convolutions(model)``: turns every ``ShortConvolution`` of a model into a
  ``CakeShortConvolution`` in place (the same module objects, so the parameters, their device,
  dtype, ``requires_grad`` and optimizer state, hooks and the training mode are all kept) and
  returns a ``SwapReport`` (each convolution: on cakeconv or why not; ``report.swapped`` counts
  those this call turned, 0 on a second call); ``unswap_short_convolutions(model)`` undoes it;
- ``CakeShortConvolution``: a subclass of ``ShortConvolution`` with the same constructor
  arguments (plus the keyword ``cake_backend``), the same parameters and state-dict keys
  (``weight`` ``[D, 1, W]``, ``bias`` ``[D]`` or none) and the same
  ``forward(x, residual=None, mask=None, cache=None, output_final_state=False, cu_seqlens=None,
  chunk_indices=None, **kwargs) -> (y, final_state)``. Checkpoints load in both directions;
- ``causal_conv1d``: FLA's function, with its signature and results, for model code that calls the
  function rather than the module (as code using FLA's context parallelism does).

Importing this module does not import ``fla``: the class is built from ``fla``'s on first use
(``cake_short_convolution_class``, or the attribute ``CakeShortConvolution``), and FLA's function
is imported when a call is delegated to it.

Shape legend: B batch rows, T tokens per row, S packed tokens (S_local: this rank's), D channels
(``hidden_size`` of the convolution), W taps (``kernel_size``), N sequences.

What runs where: one rule. cakeconv (bitwise deterministic forward and backward) runs the training
path, that is every call that carries no conv state and whose operands its op takes; every call
that carries state, and every call with other operands, runs FLA's own code. In detail, cakeconv
runs a call when ALL of these hold:

- W (``kernel_size``, the weight's last dimension) from 2 to 8, at its real width;
- ``activation`` None (the plain convolution), ``"silu"`` or ``"swish"`` (FLA's two names of SiLU,
  fused);
- no state: ``cache`` (module) / ``initial_state`` (function) is None and ``output_final_state``
  is False;
- ``cp_context`` is None or an FLA context (``fla.ops.cp.FLACPContext``) of layout
  ``contiguous`` or ``zigzag``;
- x is ``[B, T, D]`` (``cu_seqlens`` None: B sequences of T tokens) or ``[1, S, D]`` packed with
  ``cu_seqlens`` ([N + 1], int32/int64, on x's device), or ``[1, S_local, D]`` with a
  ``cp_context``;
- D is a multiple of 8, x is BF16/FP16/FP32, the weight is FP32 or BF16, and cakeconv runs on x's
  device (the CPU, or an NVIDIA GPU of compute capability >= 8.0).

Every other call is delegated unchanged to FLA's own code (``ShortConvolution.forward``, or
FLA's ``causal_conv1d``): decode steps and chunked prefill with a ``cache``, an
``initial_state``, ``output_final_state=True`` (as FLA's layers ask when ``use_cache`` is on, e.g.
in ``generate`` or in an eval-mode forward of an ``fla.models`` model, whose ``config.use_cache``
defaults to True), widths 1 or above 8, no weight, FP16 weights, x of other ranks (e.g.
``[B, T, H, K]``). ``delegation_reason`` (module) and ``causal_conv1d_delegation_reason``
(function) say, for given arguments, which rule sends a call to FLA (None: cakeconv runs it).

Context parallelism. With an FLA context, x is this rank's ``[1, S_local, D]`` rows in FLA's local
order, and the call runs ``cake_causal_conv1d_det_kcp`` on the ``KcpContext`` derived from the FLA
context (``kcp_context_from_fla``: its first use is a collective over the context's group, later
uses are cached), so one FLA context serves the convolution and FLA's CP ops of the layer (e.g.
``fla.ops.kda.chunk_kda(..., cp_context=ctx)``). As in FLA, ``cu_seqlens`` is then overridden by
the context. y and dx are bitwise the single-rank op's on this rank's tokens; dweight and dbias are
this rank's partial sums (the training framework reduces them as for every parameter). KCP takes
FP32 taps: a BF16 weight (or bias) is cast to FP32 inside, and autograd casts its gradient back. An
FLA context without a group is run as FLA does: one rank, on the context's local ``cu_seqlens``.

Math of the cakeconv path, per sequence (rows before the sequence's first token read as zero;
``weight[d, W - 1]`` multiplies the current token, as in ``nn.Conv1d``; the module's weight is
``[D, 1, W]``; act is SiLU, or the identity with ``activation=None``):

    y[t, d] = act(bias[d] + sum_{k=0..W-1} weight[d, k] * x[t - (W - 1) + k, d])   (FP32, rounded to x's dtype)
    y[t, d] = y[t, d] + residual[t, d]                                              (when residual is given)

``residual`` and ``mask`` are honoured as FLA does: ``mask`` (module only; [B, T], 1 keeps a
token, 0 zeroes it; not allowed with ``cu_seqlens``) multiplies x IN PLACE before the convolution
(``x.mul_(mask.unsqueeze(-1))``, as ``ShortConvolution.forward``), and ``residual`` (x's shape) is
added after the activation. FLA adds the residual in FP32 before its one rounding; here the
convolution's output is rounded to x's dtype first, then the residual is added (one more bf16
rounding, within bf16 tolerance of FLA). The final state returned is None.

GatedDeltaNet's q/k/v fusion: for ``[B, T, D]`` input without ``cu_seqlens`` or cache, FLA's
``GatedDeltaNet`` does not call its three convolutions; it concatenates their weights and calls
FLA's ``causal_conv1d`` once (``GatedDeltaNet._use_fused_qkv_conv``). ``swap_short_convolutions``
turns that fusion off on every module whose child convolutions it swapped (an instance attribute
``_use_fused_qkv_conv`` that returns False), so the three convolutions run through cakeconv one
after the other. Packed input (``cu_seqlens``) never takes the fused path.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .. import cake_causal_conv1d_det, cake_causal_conv1d_det_kcp
from . import _operands
from .report import SwapEntry, SwapReport
from ._operands import ACTIVATIONS, SILU_NAMES as SILU_ACTIVATIONS, cake_activation as _cake_activation
from .fla_kcp_context import FLA_CONTEXT_FIELDS, FLA_LAYOUTS, kcp_context_from_fla

# CakeShortConvolution is public too, but left out of __all__: it is built by importing fla, and
# `from cakeconv.integrations.fla import *` must work without fla.
__all__ = [
    "CakeShortConvolutionMixin",
    "cake_short_convolution_class",
    "causal_conv1d",
    "causal_conv1d_delegation_reason",
    "kcp_context_from_fla",
    "swap_short_convolutions",
    "unswap_short_convolutions",
]

CAKE_BACKENDS = ("auto", "triton", "reference")
FLA_CP_LAYOUTS = tuple(FLA_LAYOUTS)  # the FLA layouts kcp_context_from_fla derives

_FLA_HINT = ("cakeconv.integrations.fla needs flash-linear-attention (the `fla` package, 0.6.0): "
             "pip install flash-linear-attention==0.6.0 (it brings fla-core, einops and transformers)")

# base class -> its Cake subclass (built once per base).
_CLASSES: dict[type, type] = {}


def _fla_short_convolution() -> type:
    """``fla.modules.ShortConvolution``, imported on first use."""
    try:
        from fla.modules import ShortConvolution
    except ImportError as error:
        raise ImportError(_FLA_HINT) from error
    return ShortConvolution


def _fla_causal_conv1d():
    """``fla.modules.causal_conv1d.causal_conv1d``, imported on first use."""
    try:
        from fla.modules.causal_conv1d import causal_conv1d as fla_causal_conv1d
    except ImportError as error:
        raise ImportError(_FLA_HINT) from error
    return fla_causal_conv1d


def _is_fla_short_convolution(base: type) -> bool:
    return base.__name__ == "ShortConvolution" and base.__module__.split(".")[0] == "fla"


def _check_cake_backend(cake_backend) -> None:
    if not isinstance(cake_backend, str) or cake_backend not in CAKE_BACKENDS:
        raise ValueError(f"cake_backend must be one of {CAKE_BACKENDS}, got {cake_backend!r}")



def _width_activation_reason(W: int, activation) -> str | None:
    """Why a width W and an activation send a call to FLA, or None (cakeconv computes them)."""
    return _operands.width_activation_reason(W, activation, width_name="kernel_size")


def _cp_context_reason(cp_context) -> str | None:
    """Why a ``cp_context`` sends a call to FLA, or None (no context, or one cakeconv derives its own from)."""
    if cp_context is None:
        return None
    missing = [name for name in FLA_CONTEXT_FIELDS if not hasattr(cp_context, name)]
    if missing:
        return f"cp_context of type {type(cp_context).__name__} is not FLA's FLACPContext (no {', '.join(missing)})"
    if cp_context.layout not in FLA_CP_LAYOUTS:
        return f"cp_context layout {cp_context.layout!r} (cakeconv derives {' and '.join(FLA_CP_LAYOUTS)})"
    return None


def _input_reason(x, D: int, weight_dtype: torch.dtype) -> str | None:
    """Why x (of a convolution of D channels with taps of ``weight_dtype``) sends a call to FLA, or None."""
    if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != D:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        return f"x of shape {shape} (cakeconv takes [B, T, D] or [1, S, D], D = {D})"
    return _operands.operands_reason(D, x.dtype, weight_dtype, None, x.device)


def _fp32(t: torch.Tensor | None) -> torch.Tensor | None:
    """FP32 taps or bias for the KCP op (a differentiable cast; autograd casts the gradient back)."""
    return t if t is None or t.dtype == torch.float32 else t.float()


def _cake_conv(x_BTD, weight_DW, bias_D, residual, cu_seqlens, cp_context, activation, cake_backend):
    """The cakeconv path of the module and the function: y of x's shape and dtype (module docstring).

    ``weight_DW`` is ``[D, W]``; ``activation`` is FLA's (None, "silu" or "swish").

    Raises:
        ValueError: ``cu_seqlens`` or ``cp_context`` with a batch of more than one row, or a
            ``residual`` of the wrong shape. cakeconv's own checks follow.
    """
    B = x_BTD.shape[0]
    if B != 1 and (cu_seqlens is not None or cp_context is not None):
        what = "cp_context, x must be this rank's rows" if cp_context is not None else "cu_seqlens, x must be packed"
        raise ValueError(f"with {what} as [1, S, D]; got x of shape {tuple(x_BTD.shape)}")
    if residual is not None and (not isinstance(residual, torch.Tensor) or residual.shape != x_BTD.shape):
        shape = tuple(residual.shape) if isinstance(residual, torch.Tensor) else type(residual).__name__
        raise ValueError(f"residual must have x's shape {tuple(x_BTD.shape)}, got {shape}")
    act = _cake_activation(activation)
    if cp_context is None:
        y_BTD = cake_causal_conv1d_det(x_BTD, weight_DW, bias_D, cu_seqlens=cu_seqlens, activation=act,
                                       backend=cake_backend)
    elif cp_context.group is None:  # FLA runs a context without a group as one rank, on its local documents
        if cp_context.cu_seqlens is None:
            raise ValueError("the cp_context has neither a process group nor cu_seqlens")
        y_BTD = cake_causal_conv1d_det(x_BTD, weight_DW, bias_D, cu_seqlens=cp_context.cu_seqlens.to(x_BTD.device),
                                       activation=act, backend=cake_backend)
    else:
        kcp_context = kcp_context_from_fla(cp_context, device=x_BTD.device)
        y_BTD = cake_causal_conv1d_det_kcp(x_BTD, _fp32(weight_DW), kcp_context, bias=_fp32(bias_D),
                                           activation=act, backend=cake_backend)
    if residual is not None:
        if residual.dtype == y_BTD.dtype:
            y_BTD = y_BTD + residual
        else:
            y_BTD = (y_BTD.float() + residual.float()).to(y_BTD.dtype)
    return y_BTD


def _no_fused_qkv_conv(*args, **kwargs) -> bool:
    """Stands in for ``GatedDeltaNet._use_fused_qkv_conv`` after a swap: never fuse q/k/v.

    A module-level function (not a lambda) so that a swapped model still pickles and deep-copies.
    """
    return False


class CakeShortConvolutionMixin:
    """The routing of ``CakeShortConvolution``: cakeconv for the training path, FLA otherwise.

    Not used alone: ``cake_short_convolution_class(base)`` puts it in front of ``base`` (FLA's
    ``ShortConvolution``, or a class with its constructor, attributes and forward signature), so
    ``super().forward`` is the base's forward. See the module docstring for the rules and the math.

    Attributes:
        cake_backend: the ``backend`` given to ``cake_causal_conv1d_det``: "auto" (Triton on CUDA,
            the PyTorch reference on the CPU), "triton" or "reference". FLA's own ``backend``
            attribute is kept and used by the delegated calls.
    """

    cake_backend: str = "auto"

    def __init__(self, hidden_size: int, kernel_size: int, bias: bool = False, activation: str | None = "silu",
                 backend: str | None = "triton", device=None, dtype=None, *, cake_backend: str = "auto", **kwargs):
        """ShortConvolution's arguments, passed through to it, and ``cake_backend``.

        Args:
            hidden_size: D, the channels (input = output, one group per channel).
            kernel_size: W; W = 2..8 run through cakeconv (other widths are delegated).
            bias: whether the convolution has a ``[D]`` bias.
            activation: "silu"/"swish" (SiLU) or None (no activation); all three run on cakeconv.
            backend: FLA's backend for the delegated calls ("triton" or "cuda"; ``FLA_CONV_BACKEND``
                overrides it, as in FLA).
            device, dtype: of the parameters (``weight`` ``[D, 1, W]``, ``bias`` ``[D]``).
            cake_backend: "auto", "triton" or "reference", for the cakeconv path.
            **kwargs: passed to ShortConvolution (e.g. the deprecated ``use_fast_conv1d``).

        Raises:
            ValueError: an unknown ``cake_backend`` (ShortConvolution raises its own for the rest).
        """
        _check_cake_backend(cake_backend)
        super().__init__(hidden_size, kernel_size, bias=bias, activation=activation, backend=backend, device=device,
                         dtype=dtype, **kwargs)
        self.cake_backend = cake_backend

    def extra_repr(self) -> str:
        """ShortConvolution's, plus ``cake_backend=...``."""
        return f"{super().extra_repr()}, cake_backend={self.cake_backend}"

    def delegation_reason(self, x, residual=None, mask=None, cache=None, output_final_state=False, cu_seqlens=None,
                          chunk_indices=None, **kwargs) -> str | None:
        """Why ``forward`` with these arguments goes to FLA's code, or None when cakeconv runs it.

        Takes ``forward``'s arguments. Only the rules of the module docstring are checked here;
        user errors (e.g. ``mask`` with ``cu_seqlens``) are raised by ``forward``.
        """
        D = self.in_channels
        reason = _width_activation_reason(self.kernel_size[0], self.activation)
        if reason is not None:
            return reason
        if cache is not None:
            return "a cache is given (decode step or chunked prefill)"
        if output_final_state:
            return "output_final_state = True"
        reason = _cp_context_reason(kwargs.get("cp_context"))
        if reason is not None:
            return reason
        if (self.groups != D or self.out_channels != D or tuple(self.stride) != (1,)
                or tuple(self.dilation) != (1,) or self.padding_mode != "zeros"):
            return f"not a depthwise stride-1 causal convolution ({self!r})"
        return _input_reason(x, D, self.weight.dtype)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                cache: torch.Tensor | None = None, output_final_state: bool = False,
                cu_seqlens: torch.Tensor | None = None, chunk_indices: torch.Tensor | None = None,
                **kwargs) -> tuple[torch.Tensor, torch.Tensor | None]:
        """ShortConvolution's forward: cakeconv on the training path, FLA's code for the rest.

        Args:
            x: [B, T, D], or [1, S, D] packed with ``cu_seqlens``.
            residual: optional, x's shape; added after the activation.
            mask: optional [B, T] (1 keeps a token, 0 zeroes it); multiplies x in place, as FLA.
                Not with ``cu_seqlens``.
            cache: [N, D, W] state of a decode step (delegated to FLA).
            output_final_state: return the [N, D, W] final state (delegated to FLA).
            cu_seqlens: [N + 1] int32/int64 sequence boundaries on x's device, or None.
            chunk_indices: FLA's precomputed chunk table; unused by cakeconv, passed on when
                delegating.
            **kwargs: ``cp_context``: an FLA context (``fla.ops.cp.FLACPContext``): x is this rank's
                ``[1, S_local, D]`` rows and the call runs KCP (module docstring); others (e.g.
                ``cu_seqlens_cpu``) are passed on when delegating and ignored by the cakeconv path.

        Returns:
            (y, final_state): y of x's shape and dtype; final_state None on the cakeconv path.

        Raises:
            ValueError: on the cakeconv path, ``mask`` with ``cu_seqlens`` (as FLA), ``cu_seqlens``
                or ``cp_context`` with a batch of more than one row, or a ``mask`` / ``residual``
                of the wrong shape. cakeconv's own checks follow (``cu_seqlens`` values, dtypes,
                devices; an FLA context that the ranks do not share, from ``kcp_context_from_fla``).
        """
        reason = self.delegation_reason(x, residual=residual, mask=mask, cache=cache,
                                        output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                                        chunk_indices=chunk_indices, **kwargs)
        if reason is not None:
            return super().forward(x, residual=residual, mask=mask, cache=cache,
                                   output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                                   chunk_indices=chunk_indices, **kwargs)
        return self._cake_forward(x, residual, mask, cu_seqlens, kwargs.get("cp_context")), None

    def _cake_forward(self, x_BTD, residual, mask, cu_seqlens, cp_context):
        B, T, D = x_BTD.shape
        if mask is not None:
            if cu_seqlens is not None:
                raise ValueError("`mask` and `cu_seqlens` cannot be provided at the same time")
            if not isinstance(mask, torch.Tensor) or tuple(mask.shape) != (B, T):
                shape = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
                raise ValueError(f"mask must be [B, T] = [{B}, {T}] for x of shape {tuple(x_BTD.shape)}, got {shape}")
            x_BTD = x_BTD.mul_(mask.unsqueeze(-1))  # in place, as ShortConvolution.forward
        weight_DW = self.weight.reshape(D, self.kernel_size[0])  # a view of the [D, 1, W] parameter
        return _cake_conv(x_BTD, weight_DW, self.bias, residual, cu_seqlens, cp_context, self.activation,
                          self.cake_backend)


def cake_short_convolution_class(base: type | None = None) -> type:
    """The ``CakeShortConvolution`` class: ``CakeShortConvolutionMixin`` in front of ``base``.

    Args:
        base: the class to build on; None (the usual) means ``fla.modules.ShortConvolution``,
            imported here. Another class must be an ``nn.Conv1d`` subclass with ShortConvolution's
            constructor, ``activation`` attribute and forward signature (tests use a stand-in).

    Returns:
        The subclass, built once per base and cached. For FLA's class it is named
        ``CakeShortConvolution`` and is also this module's attribute of that name (so pickling a
        swapped model works); for another base ``Cake<BaseName>``.

    Raises:
        ImportError: ``base`` None and flash-linear-attention is not installed.
        TypeError: ``base`` is not an ``nn.Conv1d`` subclass.
    """
    if base is None:
        base = _fla_short_convolution()
    if not (isinstance(base, type) and issubclass(base, nn.Conv1d)):
        raise TypeError(f"base must be a subclass of torch.nn.Conv1d (FLA's ShortConvolution), got {base!r}")
    if issubclass(base, CakeShortConvolutionMixin):
        return base
    cls = _CLASSES.get(base)
    if cls is None:
        name = "CakeShortConvolution" if _is_fla_short_convolution(base) else f"Cake{base.__name__}"
        doc = (f"{base.__name__} whose training path runs cakeconv's deterministic op; every other call "
               f"runs {base.__name__}.forward. See cakeconv.integrations.fla.")
        cls = type(name, (CakeShortConvolutionMixin, base), {"__module__": __name__, "__qualname__": name,
                                                              "__doc__": doc})
        _CLASSES[base] = cls
        if name == "CakeShortConvolution":
            globals()[name] = cls
    return cls


def __getattr__(name: str):
    """``CakeShortConvolution`` is built (importing ``fla``) on first access."""
    if name == "CakeShortConvolution":
        return cake_short_convolution_class()
    for cls in _CLASSES.values():
        if cls.__name__ == name:
            return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _module_reason(module: nn.Module) -> str | None:
    """Why every call of a swapped convolution goes to FLA whatever its input, or None (its
    training calls run cakeconv): the parts of the rule that its parameters fix."""
    W = module.weight.shape[-1]
    reason = _width_activation_reason(W, getattr(module, "activation", None))
    if reason is None:
        reason = _operands.operands_reason(module.weight.shape[0], torch.float32, module.weight.dtype, None,
                                           module.weight.device)
    return None if reason is None or reason.startswith("cakeconv does not run on") else reason


def _swap_entry(name: str, module: nn.Module, newly: bool, fusion_off: bool) -> SwapEntry:
    reason = _module_reason(module)
    if reason is not None:
        return SwapEntry(name, type(module).__name__, False, f"swapped, but every call goes to FLA: {reason}", newly)
    why = "class changed; its training calls (no cache, no final state) run cakeconv"
    if not newly:
        why = "already a " + type(module).__name__ + "; its training calls run cakeconv"
    if fusion_off:
        why += "; the parent's fused q/k/v conv is turned off"
    return SwapEntry(name, type(module).__name__, True, why, newly)


def swap_short_convolutions(model: nn.Module, *, cake_backend: str = "auto",
                            base_class: type | None = None) -> SwapReport:
    """Turn every ``ShortConvolution`` of ``model`` into a ``CakeShortConvolution``, in place.

    Each module keeps its identity: its class is changed (``module.__class__``), nothing is copied,
    so its parameters (values, device, dtype, ``requires_grad``), optimizer state, hooks and
    training mode stay as they were, and ``model.state_dict()`` is unchanged. A module whose
    q/k/v convolutions were swapped and that fuses them by reading their weights
    (``GatedDeltaNet._use_fused_qkv_conv``) gets that fusion turned off (module docstring).

    Only modules whose class is exactly ``ShortConvolution`` are swapped. A subclass of it
    (another library's variant) is left alone, since its forward may differ. Modules already
    swapped are not changed again (their ``cake_backend`` neither). ``unswap_short_convolutions``
    undoes the swap.

    Args:
        model: any ``nn.Module`` (a layer, an ``fla.models`` model, or a ShortConvolution itself).
        cake_backend: "auto", "triton" or "reference", for the swapped modules' cakeconv calls.
        base_class: the class to look for; None means ``fla.modules.ShortConvolution``.

    Returns:
        A ``SwapReport`` with one entry per convolution of the model (its name in
        ``named_modules``): swapped by this call, swapped before, swapped but fixed to FLA by its
        parameters (e.g. ``kernel_size`` 9, FP16 weights), or a subclass left unswapped.
        ``report.swapped`` counts the modules this call changed (0 on a second call). A
        ``CakeconvSwapWarning`` names the convolutions left off cakeconv.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``, or ``base_class`` not an ``nn.Conv1d`` subclass.
        ValueError: an unknown ``cake_backend``.
        ImportError: ``base_class`` None and flash-linear-attention is not installed.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    _check_cake_backend(cake_backend)
    base = _fla_short_convolution() if base_class is None else base_class
    cls = cake_short_convolution_class(base)
    if base is cls:
        raise TypeError(f"base_class must be the class to replace, not the Cake class {cls.__qualname__}")
    found = []  # (name, module, newly swapped) of the convolutions, or (name, module, None): a variant left alone
    for name, module in model.named_modules():
        if type(module) is base:
            module.__class__ = cls
            module.cake_backend = cake_backend
            found.append((name, module, True))
        elif isinstance(module, CakeShortConvolutionMixin):
            found.append((name, module, False))
        elif isinstance(module, base):
            found.append((name, module, None))
    fused_off = set()
    for module in model.modules():
        fuses = callable(getattr(type(module), "_use_fused_qkv_conv", None))
        if fuses and any(isinstance(child, CakeShortConvolutionMixin) for child in module.children()):
            module._use_fused_qkv_conv = _no_fused_qkv_conv
            fused_off.update(id(child) for child in module.children())
    entries = []
    for name, module, newly in found:
        if newly is None:
            entries.append(SwapEntry(name, type(module).__name__, False,
                                     f"a subclass of {base.__qualname__}, left unswapped (its forward may differ)"))
        else:
            entries.append(_swap_entry(name, module, newly, id(module) in fused_off))
    report = SwapReport("fla", tuple(entries))
    report.warn_if_unreached()
    return report


def unswap_short_convolutions(model: nn.Module) -> SwapReport:
    """Undo ``swap_short_convolutions``: every ``CakeShortConvolution`` of ``model`` becomes its base
    class again (same module objects), and the fused q/k/v conv of their parents is turned back on.

    Returns:
        A ``SwapReport`` with one entry per module restored (``on_cakeconv`` False).

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    entries = []
    for name, module in model.named_modules():
        if module.__dict__.get("_use_fused_qkv_conv") is _no_fused_qkv_conv:
            del module._use_fused_qkv_conv
        if not isinstance(module, CakeShortConvolutionMixin):
            continue
        base = next(b for b, c in _CLASSES.items() if c is type(module)) if type(module) in _CLASSES.values() else None
        if base is None:
            entries.append(SwapEntry(name, type(module).__name__, True, "not a class built by the swap; left as it is"))
            continue
        module.__class__ = base
        module.__dict__.pop("cake_backend", None)
        entries.append(SwapEntry(name, base.__name__, False, f"restored to {base.__qualname__}", newly_swapped=True))
    return SwapReport("fla", tuple(entries), action="unswap")


def causal_conv1d_delegation_reason(x, weight=None, bias=None, residual=None, initial_state=None,
                                    output_final_state=False, activation=None, backend="triton", cu_seqlens=None,
                                    cu_seqlens_cpu=None, chunk_indices=None, cp_context=None, **kwargs) -> str | None:
    """Why ``causal_conv1d`` with these arguments goes to FLA's function, or None when cakeconv runs it.

    Takes ``causal_conv1d``'s arguments (without ``cake_backend``). Only the rules of the module
    docstring are checked here; user errors are raised by ``causal_conv1d``.
    """
    if weight is None:
        return "no weight (cakeconv is the convolution)"
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        shape = tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__
        return f"weight of shape {shape} (cakeconv takes taps [D, W])"
    reason = _width_activation_reason(weight.shape[-1], activation)
    if reason is not None:
        return reason
    if initial_state is not None:
        return "an initial_state is given"
    if output_final_state:
        return "output_final_state = True"
    reason = _cp_context_reason(cp_context)
    if reason is not None:
        return reason
    return _input_reason(x, weight.shape[0], weight.dtype)


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                  residual: torch.Tensor | None = None, initial_state: torch.Tensor | None = None,
                  output_final_state: bool | None = False, activation: str | None = None,
                  backend: str | None = "triton", cu_seqlens: torch.Tensor | None = None,
                  cu_seqlens_cpu: torch.Tensor | None = None, chunk_indices: torch.Tensor | None = None,
                  cp_context=None, *, cake_backend: str = "auto",
                  **kwargs) -> tuple[torch.Tensor, torch.Tensor | None]:
    """FLA's ``fla.modules.causal_conv1d.causal_conv1d``: cakeconv on the training path, FLA's for the rest.

    The same arguments and results as FLA 0.6.0's function, plus the keyword ``cake_backend``. See
    the module docstring for which calls run cakeconv, the math, and context parallelism.

    Args:
        x: [B, T, D]; [1, S, D] packed with ``cu_seqlens``; with ``cp_context``, this rank's
            [1, S_local, D] rows in the context's local order.
        weight: [D, W] taps, 2 <= W <= 8 on the cakeconv path (FP32 or BF16 there);
            ``weight[:, W - 1]`` multiplies the current token.
        bias: optional [D].
        residual: optional, x's shape; added after the activation.
        initial_state, output_final_state: FLA's state input and output (delegated to FLA).
        activation: None (no activation, FLA's default), "silu" or "swish"; all three run on cakeconv.
        backend: FLA's backend for the delegated calls ("triton", "cuda" or "mix").
        cu_seqlens: [N + 1] int32/int64 sequence boundaries on x's device, or None. With a
            ``cp_context`` it is overridden by the context, as in FLA.
        cu_seqlens_cpu, chunk_indices: FLA's precomputed tables; passed on when delegating,
            unused by cakeconv.
        cp_context: an FLA context (``fla.ops.cp.build_cp_context(cu_seqlens, group, ...)``,
            layout "contiguous" or "zigzag"): the call runs ``cake_causal_conv1d_det_kcp`` on
            ``kcp_context_from_fla(cp_context)`` (the first call for a context is a collective over
            its group; every rank must make it). The same context serves FLA's CP ops.
        cake_backend: "auto", "triton" or "reference", for the cakeconv path.
        **kwargs: passed on when delegating (e.g. ``seq_idx`` of FLA's "mix" backend).

    Returns:
        (y, final_state): y of x's shape and dtype; final_state None on the cakeconv path. With a
        ``cp_context``, dweight and dbias are this rank's partial sums.

    Raises:
        ValueError: an unknown ``cake_backend``; on the cakeconv path, ``cu_seqlens`` or
            ``cp_context`` with a batch of more than one row, a ``residual`` of the wrong shape,
            then cakeconv's own checks (``cu_seqlens`` values, dtypes, devices; FLA contexts of the
            ranks that do not describe one batch).
        ImportError: a delegated call without flash-linear-attention installed.
    """
    _check_cake_backend(cake_backend)
    reason = causal_conv1d_delegation_reason(x, weight, bias, residual, initial_state, output_final_state,
                                             activation, backend, cu_seqlens, cu_seqlens_cpu, chunk_indices,
                                             cp_context, **kwargs)
    if reason is not None:
        return _fla_causal_conv1d()(x, weight=weight, bias=bias, residual=residual, initial_state=initial_state,
                                    output_final_state=output_final_state, activation=activation, backend=backend,
                                    cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu,
                                    chunk_indices=chunk_indices, cp_context=cp_context, **kwargs)
    return _cake_conv(x, weight, bias, residual, cu_seqlens, cp_context, activation, cake_backend), None
