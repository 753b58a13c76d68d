"""Tier 4 (GPU): every kernel launched with its integer arguments at 1, at multiples of 16 and at
ordinary values, compared with the reference; and the launches' own coverage of those values.

The cases (tests/launch_cases.py) run the public single-rank op and the KCP op on a 1-rank context
(the boundary-row kernels and the halo gather) on the GPU. Each result is compared with the FP32
reference backend on the same device (within FP32 / one-rounding tolerances: the Triton kernels
use FMAs), and each KCP result bitwise with the single-rank Triton op on the same tokens. The
launches are recorded as they run (``record_launches(launch=True)``), and every integer argument of
every kernel must have taken the value 1 (where the problem allows it), a multiple of 16 and
another value. Ranks of several ranks (one local segment) run in the multi-GPU tier.
"""

from __future__ import annotations

import collections
import json
import os

import pytest
import torch

from cakeconv.cake_causal_conv1d_det_train_backend.kernels import launch
from tests import launch_cases
from tests.helpers import TOLERANCES, rel_err

# One xdist group: the last test checks what the others recorded in this process (--dist loadgroup).
pytestmark = [pytest.mark.gpu, pytest.mark.xdist_group("gpu_specialization")]
DEV = "cuda"
SEEN = collections.defaultdict(set)
# Optional: a folder where each process also writes what it recorded (one JSON file per process), so the
# cases can run in parallel workers and the coverage check afterwards in a process of its own (D empty or absent
# at the start: the check reads every file in it):
#   CAKECONV_SPEC_SEEN_DIR=D pytest -n 8 -k "not every_integer" tests/test_gpu_specialization.py
#   CAKECONV_SPEC_SEEN_DIR=D pytest tests/test_gpu_specialization.py::test_zz_every_integer_argument_took_1_16k_and_other
SEEN_DIR = os.environ.get("CAKECONV_SPEC_SEEN_DIR")


def _record(launches):
    for r in launches:
        for p, a in zip(r.kernel.fn.params, r.args):
            if not p.is_constexpr and type(a) is int:
                SEEN[(r.kernel.name, p.name)].add(a)
    if SEEN_DIR:
        os.makedirs(SEEN_DIR, exist_ok=True)
        rows = [[kernel, arg, sorted(values)] for (kernel, arg), values in SEEN.items()]
        with open(os.path.join(SEEN_DIR, f"seen_{os.getpid()}.json"), "w") as f:
            json.dump(rows, f)


def _seen_everywhere():
    """What this process recorded, and what the files of SEEN_DIR hold (other processes' records)."""
    seen = collections.defaultdict(set, {k: set(v) for k, v in SEEN.items()})
    for name in sorted(os.listdir(SEEN_DIR)) if SEEN_DIR and os.path.isdir(SEEN_DIR) else []:
        with open(os.path.join(SEEN_DIR, name)) as f:
            for kernel, arg, values in json.load(f):
                seen[(kernel, arg)].update(values)
    return seen


@pytest.mark.parametrize("name", list(launch_cases.SINGLE_CASES))
def test_single_rank_case_matches_reference(name):
    with launch.record_launches(launch=True) as launches:
        got = launch_cases.run_single(name, DEV, "triton")
    torch.cuda.synchronize()
    _record(launches)
    want = launch_cases.run_single(name, DEV, "reference")
    dtype = launch_cases.SINGLE_CASES[name][5]
    for k in want:
        assert got[k].shape == want[k].shape and got[k].dtype == want[k].dtype, (name, k)
        tol = TOLERANCES[dtype] if k in ("y", "dx") else 1e-4
        if got[k].dtype == torch.bfloat16 and k not in ("y", "dx"):
            tol = TOLERANCES[torch.bfloat16]
        assert rel_err(got[k], want[k]) < tol, (name, k, rel_err(got[k], want[k]))
    again = launch_cases.run_single(name, DEV, "triton")
    assert all(torch.equal(got[k], again[k]) for k in got), name  # bitwise on every call


@pytest.mark.parametrize("name", list(launch_cases.KCP_CASES))
def test_kcp_case_is_bitwise_the_single_rank_op(name):
    with launch.record_launches(launch=True) as launches:
        got = launch_cases.run_kcp(name, DEV, "triton")
    torch.cuda.synchronize()
    _record(launches)
    one = launch_cases.run_kcp_single_rank(name, DEV, "triton")
    idx = got["index"]
    assert torch.equal(got["y"], one["y"][idx]), name
    assert torch.equal(got["dx"], one["dx"][idx]), name
    # one rank holds every token: its partial sums are the whole sums (in its own row order)
    assert rel_err(got["dw"], one["dw"]) < 1e-5 and rel_err(got["db"], one["db"]) < 1e-5, name
    ref = launch_cases.run_kcp(name, DEV, "reference")
    assert rel_err(got["y"], ref["y"]) < TOLERANCES[torch.bfloat16] and rel_err(got["dx"], ref["dx"]) < TOLERANCES[torch.bfloat16]


def test_zz_every_integer_argument_took_1_16k_and_other():
    """Runs last (name order within the module): what the cases above launched on the GPU, in this
    process or (CAKECONV_SPEC_SEEN_DIR) in the processes that wrote their records there."""
    seen = _seen_everywhere()
    if not seen:
        pytest.skip("run with the cases of this module, or with CAKECONV_SPEC_SEEN_DIR after them")
    # S = 1 and n_seg = 1 in the row kernels need a rank of several: the multi-GPU tier's
    needs_ranks = {("cake_conv_fwd_rows_kernel", "S"), ("cake_conv_fwd_rows_kernel", "n_seg"),
                   ("cake_conv_bwd_head_kernel", "S"), ("cake_conv_bwd_head_kernel", "n_seg"),
                   ("cake_conv_bwd_dx_rows_kernel", "S"), ("cake_conv_bwd_dx_rows_kernel", "n_seg"),
                   ("cake_halo_gather_kernel", "n_rows")}
    missing = []
    for (kernel, arg), values in sorted(seen.items()):
        need = {"16k": any(v % 16 == 0 and v > 0 for v in values), "other": any(v != 1 and v % 16 for v in values)}
        if not launch_cases.cannot_be_one(kernel, arg) and (kernel, arg) not in needs_ranks:
            need["1"] = 1 in values
        if not all(need.values()):
            missing.append(f"{kernel}.{arg}: {sorted(values)[:12]}")
    assert not missing, missing
    assert {k for k, _ in seen} == {k.name for k in launch.KERNELS}
