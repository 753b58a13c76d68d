"""Tier 2: no Triton kernel reads or writes outside its tensor arguments (CPU interpreter).

Every tier-2 test runs under ``tests.interpreter_bounds.checked_memory`` (conftest fixture; the
KCP ranks of tests/kcp/_dist.py too), so a load or store past a buffer fails the test instead of
reading a neighbour's bytes, as the interpreter otherwise would. This module shows that the
checker can fail, runs the launch cases of tests/launch_cases.py (integer arguments at 1, at
multiples of 16 and at ordinary values) and the KCP row-list kernels over the rank plans of every
layout under it. The row-list kernels' padding lanes (list positions past the list read as row
S) once read the look-ahead halo one segment past its end, an illegal memory access on the H200s
(2 ranks, zigzag_per_document, S_local = 65,538, C = 4,096) that every CPU tier passed.
"""

from __future__ import annotations

import random

import pytest
import torch
import triton
import triton.language as tl

from cakeconv.cake_causal_conv1d_det_train_backend.kcp.plan import build_rank_plans, layout_fragments
from cakeconv.cake_causal_conv1d_det_train_backend.kernels import launch
from cakeconv.cake_causal_conv1d_det_train_backend.kernels.launch import (
    triton_dx_rows,
    triton_forward_rows,
    triton_head_g,
)
from tests import launch_cases
from tests.helpers import TOLERANCES, rel_err
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


# The launch cases of tests/launch_cases.py (every integer argument at 1, at multiples of 16 and at
# ordinary values), interpreted under the checker: the sizes where a mask is most likely off by one.
# Only the cases of at most 24 channels and 2**14 elements: the others take 20 s to 3 min each in the
# interpreter (CI's budget); the GPU test tests/test_gpu_specialization.py runs them all.
SMALL_SINGLE = [n for n, (S, C, *_rest) in launch_cases.SINGLE_CASES.items() if C <= 24 and S * C <= 2 ** 14]
SMALL_KCP = [n for n in launch_cases.KCP_CASES if launch_cases.kcp_case(n)[2] <= 24]


@pytest.mark.parametrize("name", SMALL_SINGLE)
def test_single_rank_launch_case_in_bounds_and_matches_reference(name):
    with checked_memory():
        got = launch_cases.run_single(name, "cpu", "triton")
    want = launch_cases.run_single(name, "cpu", "reference")
    dtype = launch_cases.SINGLE_CASES[name][5]
    for k in want:
        tol = TOLERANCES[dtype] if k in ("y", "dx") else 1e-4
        if got[k].dtype == torch.bfloat16 and k not in ("y", "dx"):
            tol = TOLERANCES[torch.bfloat16]
        assert rel_err(got[k], want[k]) < tol, (name, k, rel_err(got[k], want[k]))


@pytest.mark.parametrize("name", SMALL_KCP)
def test_kcp_launch_case_in_bounds_and_bitwise_the_single_rank_op(name):
    with checked_memory():
        got = launch_cases.run_kcp(name, "cpu", "triton")
        one = launch_cases.run_kcp_single_rank(name, "cpu", "triton")
    idx = got["index"]
    assert torch.equal(got["y"], one["y"][idx]), name
    assert torch.equal(got["dx"], one["dx"][idx]), name


@pytest.mark.parametrize("name", list(launch_cases.RANK_CASES))
def test_kcp_rank_of_several_in_bounds(name):
    """One rank of a several-rank context (one local segment, 1 or 16 rows), its exchange stood in
    for (the received rows are not read for their values here: only the addresses are checked)."""
    with checked_memory(), launch.record_launches(launch=True) as launches:
        launch_cases.record_kcp_rank(name)
    assert launches, name
