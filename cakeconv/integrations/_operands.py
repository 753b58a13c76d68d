"""The integrations' one rule for which operands cakeconv's op runs, on the core's constants.

Every integration (Dao's API, FLA's module and function, mamba_ssm's pair) sends a call to
cakeconv when its operands are ones the op computes, and says why not otherwise. The reasons come
from here, so the integrations cannot drift apart or from the core:

- the width W from ``MIN_WIDTH`` to ``MAX_WIDTH`` (2..8), run at its real width;
- the activation None, "silu" or "swish" (the libraries' two names of SiLU; the op's "silu");
- D a multiple of 8; x in the core's x dtypes (bf16, fp16, fp32); taps in the core's weight
  dtypes (fp32, bf16) or a dtype the integration widens to fp32 exactly (Dao's fp16 taps); a bias
  in the core's bias dtypes;
- a device cakeconv runs on (the CPU, or an NVIDIA GPU of compute capability >= 8.0), asked once
  per device.
"""

from __future__ import annotations

import torch

from .. import is_cake_causal_conv1d_det_train_supported
from ..cake_causal_conv1d_det_train_backend.checks import B_DTYPES, W_DTYPES, X_DTYPES
from ..cake_causal_conv1d_det_train_backend.constants import MAX_WIDTH, MIN_WIDTH

SILU_NAMES = ("silu", "swish")  # the libraries' names of SiLU
ACTIVATIONS = (None, *SILU_NAMES)

# device -> whether cakeconv runs there (is_cake_causal_conv1d_det_train_supported, asked once).
_SUPPORTED_DEVICES: dict[torch.device, bool] = {}


def device_supported(device: torch.device) -> bool:
    """``is_cake_causal_conv1d_det_train_supported(device)``, cached per device (no driver query
    on every call of an integration)."""
    supported = _SUPPORTED_DEVICES.get(device)
    if supported is None:
        supported = bool(is_cake_causal_conv1d_det_train_supported(device))
        _SUPPORTED_DEVICES[device] = supported
    return supported


def cake_activation(activation):
    """A library's activation (None, "silu" or "swish") as cakeconv's op takes it: "silu" or None."""
    return "silu" if activation in SILU_NAMES else None


def width_activation_reason(W: int, activation, width_name: str = "W") -> str | None:
    """Why a width and an activation keep a call off cakeconv, or None (the op computes them)."""
    if not MIN_WIDTH <= W <= MAX_WIDTH:
        return f"{width_name} = {W} (cakeconv runs W = {MIN_WIDTH}..{MAX_WIDTH})"
    if activation not in ACTIVATIONS:
        return f"activation = {activation!r} (cakeconv runs None, 'silu' and 'swish')"
    return None


def operands_reason(D: int, x_dtype: torch.dtype, weight_dtype: torch.dtype, bias_dtype: torch.dtype | None,
                    device: torch.device, widened_taps: tuple = ()) -> str | None:
    """Why these operands keep a call off cakeconv, or None (the op computes them).

    ``widened_taps``: tap dtypes the integration casts to fp32 before the op (exact widenings).
    """
    if D % 8 != 0:
        return f"D = {D} is not a multiple of 8"
    if x_dtype not in X_DTYPES:
        return f"x dtype {x_dtype} (cakeconv takes bf16, fp16 and fp32)"
    if weight_dtype not in W_DTYPES + tuple(widened_taps):
        names = ", ".join(str(d).replace("torch.", "") for d in W_DTYPES + tuple(widened_taps))
        return f"weight dtype {weight_dtype} (cakeconv takes {names} taps)"
    if bias_dtype is not None and bias_dtype not in B_DTYPES:
        return f"bias dtype {bias_dtype}"
    if not device_supported(device):
        return f"cakeconv does not run on {device}"
    return None
