"""Tier 1: host-side caches are filled only by calls that succeed (SPEC section 6).

The caches this library keeps on the host: the set of cu_seqlens tensors already validated
(keyed by identity and version counter) and the KCP context (built whole or not at all).
A failure part-way must leave nothing half-built, and the next valid call must work.
"""

import gc

import pytest
import torch

import cakeconv
from cakeconv import build_kcp_context, cake_causal_conv1d_det_train_forward
from cakeconv.cake_causal_conv1d_det_train_backend import checks, conv
from cakeconv.cake_causal_conv1d_det_train_backend.kcp import context as kcp_context
from tests.helpers import make_inputs


def test_validation_cache_tracks_in_place_changes():
    x, w, b, _ = make_inputs(32, 16, seed=1)
    cu = torch.tensor([0, 5, 32], dtype=torch.int32)
    y = cake_causal_conv1d_det_train_forward(x, w, b, cu)
    cu[1] = 40  # now decreasing: the cached "valid" verdict must not survive the write
    with pytest.raises(ValueError, match="non-decreasing"):
        cake_causal_conv1d_det_train_forward(x, w, b, cu)
    cu[1] = 5
    assert torch.equal(cake_causal_conv1d_det_train_forward(x, w, b, cu), y)


def test_failed_validation_is_not_cached():
    x, w, b, _ = make_inputs(32, 16, seed=2)
    cu = torch.tensor([1, 5, 32], dtype=torch.int32)
    for _ in range(2):  # the second call must fail again, not hit a cache
        with pytest.raises(ValueError, match="start at 0"):
            cake_causal_conv1d_det_train_forward(x, w, b, cu)
    assert not checks._cu_values_checked(cu, 32)
    cu[0] = 0
    assert cake_causal_conv1d_det_train_forward(x, w, b, cu).shape == x.shape


def test_failure_inside_the_computation_then_a_valid_call(monkeypatch):
    x, w, b, _ = make_inputs(64, 16, seed=3)
    cu = torch.tensor([0, 7, 64], dtype=torch.int32)
    expect = cake_causal_conv1d_det_train_forward(x, w, b, cu)
    calls = {"n": 0}
    real = conv.reference_forward

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected failure (e.g. a kernel compile error)")
        return real(*args, **kwargs)

    monkeypatch.setattr(conv, "reference_forward", flaky)
    with pytest.raises(RuntimeError, match="injected"):
        cake_causal_conv1d_det_train_forward(x, w, b, cu)
    assert torch.equal(cake_causal_conv1d_det_train_forward(x, w, b, cu), expect)


def test_kcp_context_build_failure_leaves_nothing(monkeypatch):
    cu = torch.tensor([0, 3, 10, 16], dtype=torch.int32)
    real = kcp_context.build_rank_plans

    def broken(*args, **kwargs):
        raise RuntimeError("injected failure while planning")

    monkeypatch.setattr(kcp_context, "build_rank_plans", broken)
    with pytest.raises((RuntimeError, ValueError), match="injected"):
        build_kcp_context(cu, layout="zigzag")
    monkeypatch.setattr(kcp_context, "build_rank_plans", real)
    ctx = build_kcp_context(cu, layout="zigzag")
    x, w, b, _ = make_inputs(16, 8, seed=4)
    y = cakeconv.cake_causal_conv1d_det_kcp(ctx.shard(x), w, ctx, bias=b)
    assert torch.equal(y, cake_causal_conv1d_det_train_forward(x, w, b, cu)[ctx.local_token_indices])


def test_validated_cu_entry_leaves_with_its_tensor():
    """The cache of validated cu_seqlens is keyed by id(): a dead tensor's entry must go, or a later
    tensor given the same id could find it."""
    x, w, b, _ = make_inputs(32, 16, seed=3)
    cu = torch.tensor([0, 5, 32], dtype=torch.int32)
    cake_causal_conv1d_det_train_forward(x, w, b, cu)
    key = id(cu)
    assert checks._cu_values_checked(cu, 32)
    del cu
    gc.collect()
    assert key not in checks._checked_cu
