"""Tier 1: the multi-GPU tier's warm-up compiles every Triton kernel its ranks will launch.

``tests/multigpu/warm_kernels.py`` compiles the tier's kernels in parallel processes before the
tier runs, so that its ranks find them in Triton's disk cache instead of compiling them one after
the other (the tier's time limit). A compiled kernel is identified by the launcher's key (kernel,
pointer dtypes, constexprs, launch options; tests/test_specialization.py checks that equal keys
mean equal compiled kernels). Here both sides are recorded on the CPU without launching: the
warm-up's jobs, and a rank of each several-rank context shape the tier uses (each (dtype, bias, C)
class of tests/multigpu/kcp_nccl.py: a document spanning the ranks, zigzag and contiguous, the
multi form, and the compile check's multi form of column halves), at the GPU's configurations. Every key of the second set must be in the first.

Shape legend: T tokens, C channels, P ranks.
"""

from __future__ import annotations

import pytest
import torch

from cakeconv import cake_causal_conv1d_det_kcp, cake_causal_conv1d_det_multi_kcp
from cakeconv.cake_causal_conv1d_det_train_backend import checks
from cakeconv.cake_causal_conv1d_det_train_backend.kernels import launch
from tests import launch_cases
from tests.helpers import INTERPRET
from tests.multigpu import warm_kernels

pytestmark = pytest.mark.skipif(INTERPRET, reason="tier 1: the launchers pick GPU configurations outside the interpreter")

# (dtype, bias, C) classes of the tier (tests/multigpu/kcp_nccl.py on CUDA)
TIER_CLASSES = [(torch.bfloat16, True, 256), (torch.float32, False, 256), (torch.bfloat16, False, 128),
                (torch.bfloat16, False, 512), (torch.bfloat16, True, 8)]


@pytest.fixture
def gpu_configs_on_cpu():
    real = checks.INTERPRET
    checks.INTERPRET = True  # lets backend="triton" take CPU tensors; launch.py keeps its GPU configurations
    try:
        yield
    finally:
        checks.INTERPRET = real


def _keys(records):
    return {(r.kernel.name, r.key) for r in records}


def _tier_rank_keys():
    keys = set()
    P = 2
    for dtype, bias, C in TIER_CLASSES:
        for cu, layout in (([0, 5, 400, 1024], "zigzag"), ([0, 3, 1019, 1024], "contiguous"), ([0, 2], "contiguous")):
            for rank in range(P):
                ctx = launch_cases._rank_context(cu, P, layout, rank)
                x, dy, w, b = launch_cases._inputs(ctx.num_local_tokens, C, rank, "cpu", dtype=dtype, bias=bias)
                with launch.record_launches(launch=False) as records:
                    y = cake_causal_conv1d_det_kcp(x.requires_grad_(True), w, ctx, bias=b, backend="triton")
                    y.backward(dy)
                keys |= _keys(records)
    # the multi form: q, k, v of (256, 128, 256) channels, biases (b, None, b), side by side
    ctx = launch_cases._rank_context([0, 5, 400, 1024], P, "zigzag", 1)
    S = ctx.num_local_tokens
    parts = [launch_cases._inputs(S, C, i, "cpu", bias=bias) for i, (C, bias) in enumerate(((256, True), (128, False), (256, True)))]
    with launch.record_launches(launch=False) as records:
        ys = cake_causal_conv1d_det_multi_kcp([p[0].requires_grad_(True) for p in parts], [p[2] for p in parts], ctx,
                                              biases=[p[3] for p in parts], backend="triton")
        torch.autograd.backward(ys, [p[1] for p in parts])
    keys |= _keys(records)
    # the compile check's multi form: the two column halves of one [S, 256] bf16 tensor, no biases
    whole = torch.randn(S, 256).to(torch.bfloat16).requires_grad_(True)
    halves = list(whole.split([128, 128], dim=1))
    dy_halves = list(torch.randn(S, 256).to(torch.bfloat16).split([128, 128], dim=1))  # eager: dy's halves
    dy_contiguous = [torch.randn(S, 128).to(torch.bfloat16)] * 2  # compiled: contiguous tangents
    for dys in (dy_halves, dy_contiguous):
        with launch.record_launches(launch=False) as records:
            ys = cake_causal_conv1d_det_multi_kcp(halves, [torch.randn(128, 4), torch.randn(128, 4)], ctx,
                                                  biases=[None, None], backend="triton")
            torch.autograd.backward(ys, dys)
        keys |= _keys(records)
    return keys


def test_warm_up_covers_every_kernel_of_the_tiers_ranks(gpu_configs_on_cpu):
    warm = set()
    for job in warm_kernels.JOBS:
        dtype_name, bias, C, T, kind = job
        with launch.record_launches(launch=False) as records:
            warm_kernels.run_job((dtype_name, bias, C, min(T, 2048), kind), "cpu", backend="triton")
        warm |= _keys(records)
    missing = _tier_rank_keys() - warm
    assert not missing, f"kernels the tier's ranks launch that the warm-up does not compile: {sorted(map(str, missing))}"
