"""``CakeShortConv``: the short convolution of a layer as an nn.Module (single rank or KCP).

The "short convolution" in front of linear-attention and state-space layers (KDA, GDN, Mamba2, LFM2)
is a depthwise causal conv1d of W taps (2 <= W <= 8; 4 by default), with a SiLU or no activation,
over the packed tokens of q, k, v (each with its own channel count and taps). This module holds
those taps (and optional biases) and calls the library's op:

- one rank:  ``cake_causal_conv1d_det`` per tensor;
- KCP:       ``cake_causal_conv1d_det_kcp`` (one tensor) or ``cake_causal_conv1d_det_multi_kcp``
             (several tensors, ONE halo exchange forward and ONE backward).

Shape legend: S packed tokens (S_local on a KCP rank), C channels of one tensor, W taps
(``kernel_size``), B batch rows, T tokens per batch row, n tensors of the layer.

Taps layout: ``weight[c, k]`` with ``weight[:, W - 1]`` multiplying the current token, i.e.

    y[t, c] = act(bias[c] + sum_{k=0..W-1} weight[c, k] * x[t - (W - 1) + k, c])     (per document)

with act SiLU (``activation="silu"``) or the identity (``activation=None``); which is
``torch.nn.Conv1d(C, C, W, groups=C)`` (a cross-correlation) with W - 1 rows of left zero padding
per document, then act: ``weight[c, k] == conv.weight[c, 0, k]``. A ``[C, 1, W]`` Conv1d weight
(flash-linear-attention's ``ShortConvolution``, Mamba's ``conv1d``, a plain ``nn.Conv1d``) therefore
loads as is, reshaped to ``[C, W]``.
"""

from __future__ import annotations

import math
import operator
from typing import Sequence

import torch
import torch.nn as nn

from .cake_causal_conv1d_det_train import cake_causal_conv1d_det
from .cake_causal_conv1d_det_train_backend.checks import check_activation, check_width
from .cake_causal_conv1d_det_train_backend.constants import MAX_WIDTH, MIN_WIDTH
from .cake_causal_conv1d_det_train_kcp import cake_causal_conv1d_det_kcp, cake_causal_conv1d_det_multi_kcp

__all__ = ["CakeShortConv"]

KERNEL_SIZE = 4  # the default width W
TAP_DTYPES = (torch.float32, torch.bfloat16)


class CakeShortConv(nn.Module):
    """Depthwise causal conv1d of W taps (2 <= W <= 8) + SiLU (or no activation) of one or several
    tensors of a layer (e.g. q, k, v).

    ``channels`` decides the form, and with it the parameter names and the forward's signature:

    ==========================  ===========================================  ======================
    form                        parameters                                   forward
    ==========================  ===========================================  ======================
    single: ``channels=C``      ``weight`` [C, W], ``bias`` [C] or None       tensor -> tensor
    several: ``channels=[C_i]`` ``weights[i]`` [C_i, W] (ParameterList),      list -> tuple
                                ``biases[i]`` [C_i] (ParameterList) or None
    ==========================  ===========================================  ======================

    The single form's state-dict keys (``weight``, ``bias``) are those of a Conv1d, so a
    flash-linear-attention ``ShortConvolution`` or ``nn.Conv1d`` checkpoint loads directly:
    ``load_state_dict`` accepts ``[C, 1, W]`` weights (and ``[C, W]``) for every weight key, here and
    in the several form (``weights.i``). ``from_conv1d`` / ``load_conv1d_state_dict`` copy from
    one Conv1d per tensor and ``to_conv1d`` exports to them.

    Math, for token t of a document (rows before the document's first token read as zero), per
    tensor, computed in FP32 and rounded once to x's dtype (``weight[:, W - 1]`` multiplies the
    current token):

        y[t, c] = act(bias[c] + sum_{k=0..W-1} weight[c, k] * x[t - (W - 1) + k, c])

    with act SiLU (``activation="silu"``) or the identity (``activation=None``).

    Initialisation is ``torch.nn.Conv1d(C, C, W, groups=C)``'s: weight ~ U(-1/sqrt(fan_in),
    1/sqrt(fan_in)) (kaiming-uniform with a = sqrt(5)) and bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)),
    fan_in = W; tensors are drawn in the order weight_0, bias_0, weight_1, ..., so under the same
    seed the values equal those of n Conv1d modules created one after the other.

    Args:
        channels: C (single form) or a sequence of C_i (several form); each a positive multiple
            of 8.
        bias: whether every tensor has a bias.
        kernel_size: the width W, an int with 2 <= W <= 8 (default 4).
        activation: "silu" (default) or None (the conv alone).
        device: where the parameters live.
        dtype: FP32 (default) or BF16 taps and biases. The KCP ops need FP32.

    Attributes:
        channels: tuple of the C_i (one entry in the single form).
        multi: True for the several-tensor form (``channels`` given as a sequence).
        has_bias: whether the tensors have biases.
        kernel_size: the width W.
        activation: "silu" or None.

    Raises:
        ValueError: kernel_size outside 2..8 or not an int, an activation other than "silu" / None
            (the message names the value), no channels, or a channel count that is not a positive
            multiple of 8.
        TypeError: dtype other than FP32/BF16.
    """

    def __init__(self, channels: int | Sequence[int], bias: bool = False, *, kernel_size: int = KERNEL_SIZE,
                 activation="silu", device=None, dtype=torch.float32):
        super().__init__()
        kernel_size = check_width(kernel_size, "kernel_size")
        self.activation = check_activation(activation)
        if dtype not in TAP_DTYPES:
            raise TypeError(f"CakeShortConv dtype must be torch.float32 or torch.bfloat16, got {dtype}")
        self.multi = isinstance(channels, Sequence) and not isinstance(channels, str)
        channel_list = list(channels) if self.multi else [channels]
        if len(channel_list) == 0:
            raise ValueError("CakeShortConv needs at least one channel count, got an empty sequence")
        for i, C in enumerate(channel_list):
            bad = f"every channel count must be a positive multiple of 8, got {C!r} in channels={channels!r}"
            try:
                channel_list[i] = operator.index(C)  # accepts numpy / torch integers, rejects floats
            except TypeError:
                raise ValueError(bad) from None
            if isinstance(C, bool) or channel_list[i] <= 0 or channel_list[i] % 8 != 0:
                raise ValueError(bad)
        self.channels = tuple(channel_list)
        self.kernel_size = kernel_size
        self.has_bias = bool(bias)

        factory = {"device": device, "dtype": dtype}
        weights_CW = [nn.Parameter(torch.empty(C, kernel_size, **factory)) for C in self.channels]
        biases_C = [nn.Parameter(torch.empty(C, **factory)) for C in self.channels] if self.has_bias else None
        if self.multi:
            self.weights = nn.ParameterList(weights_CW)
            self.biases = nn.ParameterList(biases_C) if self.has_bias else None
        else:
            self.weight = weights_CW[0]
            self.register_parameter("bias", biases_C[0] if self.has_bias else None)
        self.reset_parameters()

    # ------------------------------------------------------------------------------- parameters

    def weight_list(self) -> list[nn.Parameter]:
        """The taps of every tensor, ``[C_i, W]`` each, in order (one entry in the single form)."""
        return list(self.weights) if self.multi else [self.weight]

    def bias_list(self) -> list[nn.Parameter | None]:
        """The bias of every tensor (``[C_i]``), or None for each when the module has no bias."""
        if not self.has_bias:
            return [None] * len(self.channels)
        return list(self.biases) if self.multi else [self.bias]

    def reset_parameters(self) -> None:
        """Draw the parameters as ``torch.nn.Conv1d(C, C, W, groups=C).reset_parameters`` does.

        ``kaiming_uniform_(a=sqrt(5))`` on a ``[C, W]`` tensor has fan_in = W, the fan_in of the
        Conv1d's ``[C, 1, W]`` weight, so the bound is the same: 1/sqrt(W) (0.5 for W = 4).
        """
        for w, b in zip(self.weight_list(), self.bias_list()):
            nn.init.kaiming_uniform_(w, a=math.sqrt(5))
            if b is not None:
                fan_in = w.shape[1]
                bound = 1.0 / math.sqrt(fan_in)
                nn.init.uniform_(b, -bound, bound)

    def extra_repr(self) -> str:
        """``channels=..., bias=..., kernel_size=W, activation=silu|None, dtype=...`` (shown by ``repr``)."""
        channels = self.channels if self.multi else self.channels[0]
        dtype = self.weight_list()[0].dtype
        return (f"channels={channels}, bias={self.has_bias}, kernel_size={self.kernel_size}, "
                f"activation={self.activation}, dtype={dtype}")

    # ---------------------------------------------------------------------------------- forward

    def forward(self, x, cu_seqlens=None, kcp_context=None, recompute_handle=None, backend="auto"):
        """Conv1d of W taps + the module's activation (SiLU or none) of the tensor (single form) or
        of each tensor of the list (several form).

        Args:
            x: single form: one tensor; several form: a list of n tensors, tensor i with C_i
                channels (one dtype for all in KCP). Without ``kcp_context``: [S, C] or [1, S, C]
                packed (with ``cu_seqlens``) or [B, T, C] (``cu_seqlens`` None), bf16/fp16/fp32.
                With ``kcp_context``: this rank's rows, [S_local, C] or [1, S_local, C], in the
                context's order (``kcp_context.shard(x_global)``).
            cu_seqlens: int32/int64 [N + 1] document boundaries on x's device (single rank only;
                a KCP context holds the global boundaries itself, so give None there).
            kcp_context: a ``KcpContext`` (``build_kcp_context``) to run context parallel; the
                several form then does ONE halo exchange for all tensors.
            recompute_handle: optional ``RecomputeHandleDetKcp`` (KCP only): under
                torch.utils.checkpoint the recompute reuses the forward's halo rows.
            backend: "auto", "triton" or "reference".

        Returns:
            single form: y of x's shape and dtype; several form: a tuple of n outputs. In KCP the
            parameter gradients are this rank's partial sums: all-reduce them over the data- and
            context-parallel group as for every parameter.

        Raises:
            ValueError: a tensor where a list is expected (or the reverse), the wrong number of
                tensors, ``cu_seqlens`` given with ``kcp_context``, or ``recompute_handle`` given
                without ``kcp_context``. The op's own checks (shapes, dtypes, devices) follow.
        """
        xs = self._as_list(x)
        weights, biases = self.weight_list(), self.bias_list()
        if kcp_context is None:
            if recompute_handle is not None:
                raise ValueError("recompute_handle is for the KCP path only: pass kcp_context as well, or no handle")
            ys = tuple(cake_causal_conv1d_det(x_i, w, b, cu_seqlens=cu_seqlens, activation=self.activation,
                                              backend=backend)
                       for x_i, w, b in zip(xs, weights, biases))
        else:
            if cu_seqlens is not None:
                raise ValueError("give cu_seqlens or kcp_context, not both: the KCP context already holds the "
                                 "global document boundaries (build_kcp_context(cu_seqlens, ...))")
            if self.multi:
                ys = cake_causal_conv1d_det_multi_kcp(xs, weights, kcp_context, biases=biases,
                                                      activation=self.activation,
                                                      recompute_handle=recompute_handle, backend=backend)
            else:
                ys = (cake_causal_conv1d_det_kcp(xs[0], weights[0], kcp_context, bias=biases[0],
                                                 activation=self.activation,
                                                 recompute_handle=recompute_handle, backend=backend),)
        return tuple(ys) if self.multi else ys[0]

    def _as_list(self, x) -> list:
        if not self.multi:
            if not isinstance(x, torch.Tensor):
                raise ValueError(f"this CakeShortConv has one tensor (channels={self.channels[0]}): forward takes a "
                                 f"tensor, got {type(x).__name__}")
            return [x]
        if isinstance(x, torch.Tensor) or not isinstance(x, Sequence):
            raise ValueError(f"this CakeShortConv has {len(self.channels)} tensors (channels={self.channels}): "
                             f"forward takes a list of {len(self.channels)} tensors, got {type(x).__name__}")
        if len(x) != len(self.channels):
            raise ValueError(f"this CakeShortConv has {len(self.channels)} tensors (channels={self.channels}), "
                             f"forward got {len(x)}")
        return list(x)

    # --------------------------------------------------------------------- Conv1d compatibility

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        """Accept ``[C, 1, W]`` Conv1d weights for every weight key (reshaped to ``[C, W]``)."""
        W = self.kernel_size
        keys = [prefix + f"weights.{i}" for i in range(len(self.channels))] if self.multi else [prefix + "weight"]
        for key, C in zip(keys, self.channels):
            w = state_dict.get(key)
            if isinstance(w, torch.Tensor) and tuple(w.shape) == (C, 1, W):
                state_dict[key] = w.reshape(C, W)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def load_conv1d_state_dict(self, state_dicts) -> None:
        """Copy the taps (and biases) from Conv1d state dicts: one dict, or a list of one per tensor.

        Each dict holds ``"weight"`` ``[C_i, 1, W]`` (or ``[C_i, W]``) and ``"bias"`` ``[C_i]`` exactly
        when this module has biases (a ``ShortConvolution`` / ``nn.Conv1d`` ``state_dict()``). Values
        are cast to the parameters' dtype and device.

        Raises:
            ValueError: wrong number of dicts, a missing or unexpected ``bias``, or a wrong shape.
        """
        if isinstance(state_dicts, dict):
            state_dicts = [state_dicts]
        state_dicts = list(state_dicts)
        if len(state_dicts) != len(self.channels):
            raise ValueError(f"this CakeShortConv has {len(self.channels)} tensors (channels={self.channels}), "
                             f"got {len(state_dicts)} Conv1d state dicts")
        W = self.kernel_size
        for i, (sd, C, w, b) in enumerate(zip(state_dicts, self.channels, self.weight_list(), self.bias_list())):
            if "weight" not in sd:
                raise ValueError(f"Conv1d state dict {i} has no 'weight' (keys: {sorted(sd)})")
            w_src = sd["weight"]
            if tuple(w_src.shape) not in ((C, 1, W), (C, W)):
                raise ValueError(f"Conv1d state dict {i}: weight must be [{C}, 1, {W}] or [{C}, {W}], "
                                 f"got {tuple(w_src.shape)}")
            has_bias = sd.get("bias") is not None
            if has_bias != self.has_bias:
                raise ValueError(f"Conv1d state dict {i} {'has' if has_bias else 'has no'} bias but this CakeShortConv "
                                 f"was built with bias={self.has_bias}")
            if has_bias and tuple(sd["bias"].shape) != (C,):
                raise ValueError(f"Conv1d state dict {i}: bias must be [{C}], got {tuple(sd['bias'].shape)}")
            with torch.no_grad():
                w.copy_(w_src.reshape(C, W))
                if has_bias:
                    b.copy_(sd["bias"])

    @classmethod
    def from_conv1d(cls, convs, *, activation="silu", dtype=torch.float32) -> "CakeShortConv":
        """A CakeShortConv with the taps of depthwise Conv1d module(s) of one width W (2..8).

        Args:
            convs: one ``nn.Conv1d(C, C, W, groups=C)`` (gives the single form) or a list of them
                of one W (the several form), e.g. a flash-linear-attention layer's ``q_conv1d``,
                ``k_conv1d``, ``v_conv1d`` (``ShortConvolution`` is an nn.Conv1d). Padding is not
                read: this module is always causal (W - 1 rows of left zero padding per document).
            activation: what the source applied after the conv: "silu" (default) or None.
            dtype: FP32 (default, needed by KCP) or BF16 for the new parameters.

        Raises:
            ValueError: a module that is not a depthwise, stride-1, dilation-1 Conv1d of a width in
                2..8 with zero padding mode, modules of different widths, biases on some tensors
                only, or an activation other than "silu" / None.
        """
        multi = not isinstance(convs, nn.Module)
        conv_list = list(convs) if multi else [convs]
        for i, conv in enumerate(conv_list):
            if not isinstance(conv, nn.Conv1d):
                raise ValueError(f"convs[{i}] must be a torch.nn.Conv1d, got {type(conv).__name__}")
            C = conv.in_channels
            if (conv.out_channels != C or conv.groups != C or not MIN_WIDTH <= conv.kernel_size[0] <= MAX_WIDTH
                    or tuple(conv.stride) != (1,) or tuple(conv.dilation) != (1,) or conv.padding_mode != "zeros"):
                raise ValueError(
                    f"convs[{i}] must be a depthwise Conv1d of width {MIN_WIDTH}..{MAX_WIDTH} (in = out = groups = C, "
                    f"stride 1, dilation 1, padding_mode 'zeros'), got {conv!r}")
        widths = [conv.kernel_size[0] for conv in conv_list]
        if len(set(widths)) != 1:
            raise ValueError(f"every Conv1d must have the same kernel_size, got {widths}")
        has_bias = [conv.bias is not None for conv in conv_list]
        if len(set(has_bias)) != 1:
            raise ValueError(f"either every Conv1d has a bias or none does, got bias presence {has_bias}")
        channels = [conv.in_channels for conv in conv_list]
        module = cls(channels if multi else channels[0], bias=has_bias[0], kernel_size=widths[0], activation=activation,
                     device=conv_list[0].weight.device, dtype=dtype)
        module.load_conv1d_state_dict([{"weight": conv.weight.detach(),
                                        "bias": None if conv.bias is None else conv.bias.detach()}
                                       for conv in conv_list])
        return module

    def to_conv1d(self):
        """Export to ``nn.Conv1d(C, C, W, groups=C, padding=W - 1)`` module(s) (one per tensor).

        ``conv.weight[c, 0, k] = weight[c, k]``. With ``padding=W - 1`` (as flash-linear-attention's
        ShortConvolution and Mamba build theirs), the causal output of one document
        ``x_BCT`` is ``act(conv(x_BCT)[..., :T])`` (act: the module's activation, not part of the
        Conv1d); its ``state_dict()`` loads into a ``ShortConvolution`` of the same C and W.

        Returns:
            one Conv1d (single form) or a list of them (several form), with this module's device
            and dtype.
        """
        convs = []
        W = self.kernel_size
        for C, w, b in zip(self.channels, self.weight_list(), self.bias_list()):
            conv = nn.Conv1d(C, C, W, groups=C, padding=W - 1, bias=b is not None, device=w.device, dtype=w.dtype)
            with torch.no_grad():
                conv.weight.copy_(w.detach().reshape(C, 1, W))
                if b is not None:
                    conv.bias.copy_(b.detach())
            convs.append(conv)
        return convs if self.multi else convs[0]
