"""Tier 1: the tuner only returns configurations that the GPU bit tests run.

tests/test_gpu.py checks that every configuration in FWD_CONFIGS / BWD_CONFIGS gives the same
bits; that covers the picks only if every pick is one of them.
"""

import pytest

from cakeconv.cake_causal_conv1d_det_train_backend.kernels import tuning

CHANNELS = [8, 24, 64, 72, 128, 256, 264, 512, 520, 1024, 1160, 1280, 1344, 1536, 2048, 4096, 4104, 8192]


@pytest.mark.parametrize("itemsize", [2, 4])
def test_every_pick_is_a_listed_configuration(itemsize):
    for C in CHANNELS:
        assert tuning.pick_fwd_config(C, itemsize, False) in tuning.FWD_CONFIGS, C
        for has_bias in (False, True):
            assert tuning.pick_bwd_config(C, itemsize, False, has_bias=has_bias) in tuning.BWD_CONFIGS, (C, has_bias)


def test_interpreter_configurations_are_small():
    """The interpreter's configurations (CPU, TRITON_INTERPRET=1) whatever C and bias."""
    for C in CHANNELS:
        assert tuning.pick_fwd_config(C, 2, True) == tuning.FWD_INTERPRET
        for has_bias in (False, True):
            assert tuning.pick_bwd_config(C, 2, True, has_bias=has_bias) == tuning.BWD_INTERPRET
