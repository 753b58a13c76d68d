"""Whether cakeconv's op runs on a device, asked once per device (the integrations' routing)."""

from __future__ import annotations

import torch

from .. import is_cake_causal_conv1d_det_train_supported

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
