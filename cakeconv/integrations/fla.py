"""flash-linear-attention's ``ShortConvolution`` on cakeconv's deterministic op, in one call.

flash-linear-attention (``fla``, 0.6.0) builds the short convolutions of its layers (GatedDeltaNet,
KDA, DeltaNet, ...) from ``fla.modules.ShortConvolution``, an ``nn.Conv1d`` subclass. This module
gives

- ``swap_short_convolutions(model)``: turns every ``ShortConvolution`` of a model into a
  ``CakeShortConvolution`` in place (the same module objects, so the parameters, their device,
  dtype, ``requires_grad`` and optimizer state, hooks and the training mode are all kept) and
  returns how many it turned; a second call finds none left and returns 0;
- ``CakeShortConvolution``: a subclass of ``ShortConvolution`` with the same constructor
  arguments (plus the keyword ``cake_backend``), the same parameters and state-dict keys
  (``weight`` ``[D, 1, W]``, ``bias`` ``[D]`` or none) and the same
  ``forward(x, residual=None, mask=None, cache=None, output_final_state=False, cu_seqlens=None,
  chunk_indices=None, **kwargs) -> (y, final_state)``. Checkpoints load in both directions.

Importing this module does not import ``fla``: the class is built from ``fla``'s on first use
(``cake_short_convolution_class``, or the attribute ``CakeShortConvolution``).

Shape legend: B batch rows, T tokens per row, S packed tokens, D channels (``hidden_size`` of the
convolution), W taps (``kernel_size``), N sequences.

What runs where. A call goes through ``cake_causal_conv1d_det`` (bitwise deterministic forward
and backward) when it is the training path, that is when ALL of these hold:

- ``kernel_size == 4`` and ``activation`` is ``"silu"`` or ``"swish"`` (the op fuses SiLU);
- ``cache is None`` and ``output_final_state`` is False, and no ``cp_context`` (FLA's context
  parallelism) is passed;
- x is ``[B, T, D]`` (``cu_seqlens`` None: B sequences of T tokens) or ``[1, S, D]`` packed with
  ``cu_seqlens`` ([N + 1], int32/int64, on x's device);
- D is a multiple of 8, x is BF16/FP16/FP32, the weight is FP32 or BF16, and cakeconv runs on x's
  device (the CPU, or an NVIDIA GPU of compute capability >= 8.0).

Every other call is delegated unchanged to ``ShortConvolution.forward``, FLA's own code: decode
steps and chunked prefill with a ``cache``, ``output_final_state=True`` (as FLA's layers ask when
``use_cache`` is on, e.g. in ``generate`` or in an eval-mode forward of an ``fla.models`` model,
whose ``config.use_cache`` defaults to True), other widths, ``activation=None``, FP16 weights,
x of other ranks (e.g. ``[B, T, H, K]``), FLA's context parallelism. ``delegation_reason`` says,
for given arguments, which rule sends a call to FLA (None: cakeconv runs it).

Math of the cakeconv path, per sequence (rows before the sequence's first token read as zero;
``weight[d, 0, W - 1]`` multiplies the current token, as in ``nn.Conv1d``):

    y[t, d] = silu(bias[d] + sum_{k=0..3} weight[d, 0, k] * x[t - 3 + k, d])      (FP32, rounded to x's dtype)
    y[t, d] = y[t, d] + residual[t, d]                                            (when residual is given)

``residual`` and ``mask`` are honoured as FLA does: ``mask`` ([B, T], 1 keeps a token, 0 zeroes
it; not allowed with ``cu_seqlens``) multiplies x IN PLACE before the convolution
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

import warnings

import torch
import torch.nn as nn

from .. import cake_causal_conv1d_det, is_cake_causal_conv1d_det_train_supported

# CakeShortConvolution is public too, but left out of __all__: it is built by importing fla, and
# `from cakeconv.integrations.fla import *` must work without fla.
__all__ = [
    "CakeShortConvolutionMixin",
    "cake_short_convolution_class",
    "swap_short_convolutions",
]

KERNEL_SIZE = 4
SILU_ACTIVATIONS = ("silu", "swish")
CAKE_BACKENDS = ("auto", "triton", "reference")
X_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
WEIGHT_DTYPES = (torch.float32, torch.bfloat16)

_FLA_HINT = ("cakeconv.integrations.fla needs flash-linear-attention (the `fla` package, 0.6.0): "
             "pip install flash-linear-attention==0.6.0 (it brings fla-core, einops and transformers)")

# base class -> its Cake subclass (built once per base).
_CLASSES: dict[type, type] = {}
# device -> whether cakeconv runs there (is_cake_causal_conv1d_det_train_supported, asked once).
_SUPPORTED_DEVICES: dict[torch.device, bool] = {}


def _fla_short_convolution() -> type:
    """``fla.modules.ShortConvolution``, imported on first use."""
    try:
        from fla.modules import ShortConvolution
    except ImportError as error:
        raise ImportError(_FLA_HINT) from error
    return ShortConvolution


def _is_fla_short_convolution(base: type) -> bool:
    return base.__name__ == "ShortConvolution" and base.__module__.split(".")[0] == "fla"


def _check_cake_backend(cake_backend) -> None:
    if not isinstance(cake_backend, str) or cake_backend not in CAKE_BACKENDS:
        raise ValueError(f"cake_backend must be one of {CAKE_BACKENDS}, got {cake_backend!r}")


def _device_supported(device: torch.device) -> bool:
    supported = _SUPPORTED_DEVICES.get(device)
    if supported is None:
        supported = bool(is_cake_causal_conv1d_det_train_supported(device))
        _SUPPORTED_DEVICES[device] = supported
    return supported


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
            kernel_size: W; only W = 4 runs through cakeconv (other widths are delegated).
            bias: whether the convolution has a ``[D]`` bias.
            activation: "silu"/"swish" (cakeconv path) or None (always delegated).
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
        W = self.kernel_size[0]
        D = self.in_channels
        if W != KERNEL_SIZE:
            return f"kernel_size = {W} (cakeconv implements W = 4)"
        if self.activation not in SILU_ACTIVATIONS:
            return f"activation = {self.activation!r} (cakeconv fuses SiLU)"
        if cache is not None:
            return "a cache is given (decode step or chunked prefill)"
        if output_final_state:
            return "output_final_state = True"
        if kwargs.get("cp_context") is not None:
            return "FLA context parallelism (cp_context)"
        if (self.groups != D or self.out_channels != D or tuple(self.stride) != (1,)
                or tuple(self.dilation) != (1,) or self.padding_mode != "zeros"):
            return f"not a depthwise stride-1 causal convolution ({self!r})"
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != D:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            return f"x of shape {shape} (cakeconv takes [B, T, D] or [1, S, D], D = {D})"
        if D % 8 != 0:
            return f"D = {D} is not a multiple of 8"
        if x.dtype not in X_DTYPES:
            return f"x dtype {x.dtype}"
        if self.weight.dtype not in WEIGHT_DTYPES:
            return f"weight dtype {self.weight.dtype} (cakeconv takes FP32 or BF16 taps)"
        if not _device_supported(x.device):
            return f"cakeconv does not run on {x.device}"
        return None

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
            **kwargs: passed on when delegating (``cp_context`` is delegated; others such as
                ``cu_seqlens_cpu`` are ignored by the cakeconv path).

        Returns:
            (y, final_state): y of x's shape and dtype; final_state None on the cakeconv path.

        Raises:
            ValueError: on the cakeconv path, ``mask`` with ``cu_seqlens`` (as FLA), ``cu_seqlens``
                with a batch of more than one row, or a ``mask`` / ``residual`` of the wrong shape.
                cakeconv's own checks follow (``cu_seqlens`` values, dtypes, devices).
        """
        reason = self.delegation_reason(x, residual=residual, mask=mask, cache=cache,
                                        output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                                        chunk_indices=chunk_indices, **kwargs)
        if reason is not None:
            return super().forward(x, residual=residual, mask=mask, cache=cache,
                                   output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                                   chunk_indices=chunk_indices, **kwargs)
        return self._cake_forward(x, residual, mask, cu_seqlens), None

    def _cake_forward(self, x_BTD, residual, mask, cu_seqlens):
        B, T, D = x_BTD.shape
        if mask is not None:
            if cu_seqlens is not None:
                raise ValueError("`mask` and `cu_seqlens` cannot be provided at the same time")
            if not isinstance(mask, torch.Tensor) or tuple(mask.shape) != (B, T):
                shape = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
                raise ValueError(f"mask must be [B, T] = [{B}, {T}] for x of shape {tuple(x_BTD.shape)}, got {shape}")
            x_BTD = x_BTD.mul_(mask.unsqueeze(-1))  # in place, as ShortConvolution.forward
        if cu_seqlens is not None and B != 1:
            raise ValueError(f"with cu_seqlens, x must be packed as [1, S, D]; got x of shape {tuple(x_BTD.shape)}")
        if residual is not None and (not isinstance(residual, torch.Tensor) or residual.shape != x_BTD.shape):
            shape = tuple(residual.shape) if isinstance(residual, torch.Tensor) else type(residual).__name__
            raise ValueError(f"residual must have x's shape {tuple(x_BTD.shape)}, got {shape}")
        weight_DW = self.weight.reshape(D, KERNEL_SIZE)  # a view of the [D, 1, 4] parameter
        y_BTD = cake_causal_conv1d_det(x_BTD, weight_DW, self.bias, cu_seqlens=cu_seqlens, backend=self.cake_backend)
        if residual is not None:
            if residual.dtype == y_BTD.dtype:
                y_BTD = y_BTD + residual
            else:
                y_BTD = (y_BTD.float() + residual.float()).to(y_BTD.dtype)
        return y_BTD


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


def swap_short_convolutions(model: nn.Module, *, cake_backend: str = "auto", base_class: type | None = None) -> int:
    """Turn every ``ShortConvolution`` of ``model`` into a ``CakeShortConvolution``, in place.

    Each module keeps its identity: its class is changed (``module.__class__``), nothing is copied,
    so its parameters (values, device, dtype, ``requires_grad``), optimizer state, hooks and
    training mode stay as they were, and ``model.state_dict()`` is unchanged. A module whose
    q/k/v convolutions were swapped and that fuses them by reading their weights
    (``GatedDeltaNet._use_fused_qkv_conv``) gets that fusion turned off (module docstring).

    Only modules whose class is exactly ``ShortConvolution`` are swapped. A subclass of it
    (another library's variant) is left alone with a warning, since its forward may differ.
    Modules already swapped are not counted again, so a second call returns 0 (their
    ``cake_backend`` is not changed either).

    Args:
        model: any ``nn.Module`` (a layer, an ``fla.models`` model, or a ShortConvolution itself).
        cake_backend: "auto", "triton" or "reference", for the swapped modules' cakeconv calls.
        base_class: the class to look for; None means ``fla.modules.ShortConvolution``.

    Returns:
        The number of modules swapped by this call.

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
    swapped = 0
    for name, module in model.named_modules():
        if type(module) is base:
            module.__class__ = cls
            module.cake_backend = cake_backend
            swapped += 1
        elif isinstance(module, base) and not isinstance(module, CakeShortConvolutionMixin):
            warnings.warn(f"swap_short_convolutions: {name or 'model'} is a {type(module).__qualname__}, a subclass "
                          f"of {base.__qualname__}; left unswapped (its forward may differ)", stacklevel=2)
    for module in model.modules():
        fuses = callable(getattr(type(module), "_use_fused_qkv_conv", None))
        if fuses and any(isinstance(child, CakeShortConvolutionMixin) for child in module.children()):
            module._use_fused_qkv_conv = _no_fused_qkv_conv
    return swapped
