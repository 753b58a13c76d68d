"""Tier 2: no Triton kernel reads or writes outside its tensor arguments (CPU interpreter).

Every tier-2 test runs under ``tests.interpreter_bounds.checked_memory`` (conftest fixture; the
KCP ranks of tests/kcp/_dist.py too), so a load or store past a buffer fails the test instead of
reading a neighbour's bytes, as the interpreter otherwise would. This module shows that the
checker can fail, and runs the KCP row-list kernels over the rank plans of every layout: their
padding lanes (list positions past the list read as row S) once read the look-ahead halo one
segment past its end, an illegal memory access on the H200s (2 ranks, zigzag_per_document,
S_local = 65,538, C = 4,096) that every CPU tier passed.
"""

from __future__ import annotations

import random

import pytest
import torch
import triton
import triton.language as tl

from cakeconv.cake_causal_conv1d_det_train_backend.kcp.plan import build_rank_plans, layout_fragments
from cakeconv.cake_causal_conv1d_det_train_backend.kernels.launch import (
    triton_dx_rows,
    triton_forward_rows,
    triton_head_g,
)
from tests.interpreter_bounds import OutOfBounds, checked_memory

pytestmark = pytest.mark.interpret


@triton.jit
def _shifted_copy(x_ptr, y_ptr, n, shift, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(y_ptr + i + shift, tl.load(x_ptr + i + shift, mask=i < n), mask=i < n)


def _raises_out_of_bounds(fn) -> bool:
    """True if fn raised OutOfBounds (the interpreter wraps it in InterpreterError)."""
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - walk the chain for the checker's error
        while exc is not None:
            if isinstance(exc, OutOfBounds):
                return True
            exc = exc.__cause__ or exc.__context__
        raise
    return False


def test_the_checker_fails_a_load_or_store_past_a_tensor():
    x_N, y_N = torch.zeros(16), torch.zeros(16)
    with checked_memory():
        assert not _raises_out_of_bounds(lambda: _shifted_copy[(1,)](x_N, y_N, 15, 1, BLOCK=16))
        assert not _raises_out_of_bounds(lambda: _shifted_copy[(1,)](x_N, y_N, 16, 0, BLOCK=32))
        assert _raises_out_of_bounds(lambda: _shifted_copy[(1,)](x_N, y_N, 16, 1, BLOCK=16))
        assert _raises_out_of_bounds(lambda: _shifted_copy[(1,)](x_N, y_N, 1, -1, BLOCK=16))
    # Outside the context nothing is checked.
    _shifted_copy[(1,)](x_N, y_N, 15, 1, BLOCK=16)


def _doc_mixes(P: int):
    """Global document lengths (multiples of 2P, so zigzag_per_document needs no padding)."""
    rng = random.Random(P)
    unit = 2 * P
    yield [unit * rng.randint(20, 200) for _ in range(3)]  # long documents: ranks inside them
    yield [unit * n for n in (1, 2, 1, 3, 1, 1, 5)]  # short documents, 1- to 5-token fragments


@pytest.mark.parametrize("P", [2, 3])
def test_kcp_row_list_kernels_stay_inside_their_buffers(P):
    """forward_rows, head_g and dx_rows of every rank of every layout: halos of the plan's shape."""
    C = 8
    checked = 0
    for lengths in _doc_mixes(P):
        cu = [0]
        for n in lengths:
            cu.append(cu[-1] + n)
        for layout in ("contiguous", "zigzag", "zigzag_per_document"):
            for plan in build_rank_plans(cu, layout_fragments(cu, P, layout)):
                S, D = plan.num_local_tokens, plan.num_segments
                if S == 0:
                    continue
                g = torch.Generator().manual_seed(S)
                x_SC = torch.randn(S, C, generator=g).to(torch.bfloat16)
                dy_SC = torch.randn(S, C, generator=g).to(torch.bfloat16)
                w_C4, b_C = torch.randn(C, 4, generator=g), torch.randn(C, generator=g)
                hist_DHC = torch.randn(D, 3, C, generator=g).to(torch.bfloat16)
                fut_DHC = torch.randn(D, 3, C, generator=g)
                cu_local = plan.local_cu_seqlens
                with checked_memory():
                    if plan.fix_fwd_rows.numel():
                        triton_forward_rows(x_SC, w_C4, b_C, cu_local, hist_DHC, plan.fix_fwd_rows,
                                            torch.empty_like(x_SC))
                    if plan.fut.g_rows.numel():
                        triton_head_g(dy_SC, x_SC, w_C4, b_C, cu_local, hist_DHC, plan.fut.g_rows,
                                      torch.empty(plan.fut.g_rows.numel(), C))
                    if plan.fix_bwd_rows.numel():
                        triton_dx_rows(dy_SC, x_SC, w_C4, b_C, cu_local, hist_DHC, fut_DHC, plan.fix_bwd_rows,
                                       torch.empty_like(x_SC))
                checked += 1
    assert checked >= 6 * P
