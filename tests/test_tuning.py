"""Tier 1: the tuner only returns configurations that the GPU bit tests run.

tests/test_gpu.py checks that every configuration in FWD_CONFIGS / BWD_CONFIGS gives the same
bits at W = 4 + SiLU, and at the other widths those of ``configs_at_width``; that covers the picks
only if every pick is one of them.
"""

import pytest

from cakeconv.cake_causal_conv1d_det_train_backend.kernels import tuning

CHANNELS = [8, 24, 64, 72, 128, 256, 264, 512, 520, 1024, 1160, 1280, 1344, 1536, 2048, 4096, 4104, 8192]


@pytest.mark.parametrize("width", range(2, 9))
@pytest.mark.parametrize("itemsize", [2, 4])
def test_every_pick_is_a_listed_configuration(itemsize, width):
    for C in CHANNELS:
        assert tuning.pick_fwd_config(C, itemsize, False, width=width) in tuning.FWD_CONFIGS, C
        for has_bias in (False, True):
            pick = tuning.pick_bwd_config(C, itemsize, False, has_bias=has_bias, width=width)
            assert pick in tuning.BWD_CONFIGS, (C, has_bias)


@pytest.mark.parametrize("width", range(2, 9))
def test_configs_at_width_are_the_picks_over_every_channel_count(width):
    """tests/test_gpu.py's widths test checks the bits of ``configs_at_width(W)``: they must be the
    configurations the picks return at W, every C from 1 to 16,384, both dtypes, bias or not."""
    fwd, bwd = set(), set()
    for C in range(1, 16385):
        for itemsize in (2, 4):
            fwd.add(tuning.pick_fwd_config(C, itemsize, False, width=width))
            for has_bias in (False, True):
                bwd.add(tuning.pick_bwd_config(C, itemsize, False, has_bias=has_bias, width=width))
    fwd_listed, bwd_listed = tuning.configs_at_width(width)
    assert (set(fwd_listed), set(bwd_listed)) == (fwd, bwd)
    assert len(set(fwd_listed)) == len(fwd_listed) and len(set(bwd_listed)) == len(bwd_listed)


def test_interpreter_configurations_are_small():
    """The interpreter's configurations (CPU, TRITON_INTERPRET=1) whatever C and bias."""
    for C in CHANNELS:
        assert tuning.pick_fwd_config(C, 2, True) == tuning.FWD_INTERPRET
        for has_bias in (False, True):
            assert tuning.pick_bwd_config(C, 2, True, has_bias=has_bias) == tuning.BWD_INTERPRET
