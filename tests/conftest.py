"""Shared test helpers.

Test tiers (cheapest first; see README "Testing"):
  1. reference backend on the CPU (this process);
  2. the real Triton kernels under TRITON_INTERPRET=1 -- marked ``interpret``, run in their own
     pytest process because triton reads the variable when the kernels are defined;
  3. several ranks on the CPU over gloo (tests/kcp);
  4. GPU tests, marked ``gpu``, run on the GPU machine.

Shape legend: S packed tokens, C channels, N documents.
"""

import os

import pytest
import torch

# Tier 4 under pytest-xdist on a machine of several GPUs (benchmarks/device_run.sh tests sets
# CAKECONV_TEST_GPUS): worker gwK sees only GPU K mod n. Six workers on one GPU of two ran it out of
# memory. Set before anything initialises CUDA (importing torch does not).
_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
_n_gpus = int(os.environ.get("CAKECONV_TEST_GPUS", "0") or 0)
if _worker.startswith("gw") and _n_gpus > 1 and "CUDA_VISIBLE_DEVICES" not in os.environ:
    os.environ["CUDA_VISIBLE_DEVICES"] = str(int(_worker[2:]) % _n_gpus)

# Under pytest-xdist each worker takes its share of the cores for torch's CPU ops: three workers of
# 16 OpenMP threads each on a 16-core GPU machine made the float64 oracles of the GPU tests (many
# small F.conv1d calls) take over 130 s instead of a second (three workers, test_integrations_dao).
if _worker.startswith("gw"):
    _n_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // _n_workers))

from tests.helpers import INTERPRET

if INTERPRET:  # tier 2: the interpreter patches triton.language once per launch (tests/interpreter_patch_once.py)
    from tests.interpreter_patch_once import install as _patch_language_once

    _patch_language_once()


@pytest.fixture(autouse=True)
def _interpreted_kernels_stay_in_bounds():
    """Tier 2: every load and store of an interpreted kernel must lie inside its tensor arguments
    (tests/interpreter_bounds.py); tests/kcp/_dist.py does the same on each spawned rank."""
    if not INTERPRET:
        yield
        return
    from tests.interpreter_bounds import checked_memory

    with checked_memory():
        yield


@pytest.fixture(autouse=True)
def _gpu_memory_returned_after_each_test(request):
    """Tier 4 runs several pytest workers on one GPU: after a GPU test its worker gives the blocks
    its caching allocator holds back to the driver, so the next large test of another worker finds
    them (without this, one worker's cache of a finished 262,144 x 8,192 test and the others' live
    tensors filled the 140 GiB, and four tests failed out of memory on an H200)."""
    yield
    if "gpu" in request.keywords and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "interpret" in item.keywords and not INTERPRET:
            item.add_marker(pytest.mark.skip(reason="run with TRITON_INTERPRET=1 in its own pytest process"))
        if "interpret" not in item.keywords and INTERPRET and "gpu" not in item.keywords:
            item.add_marker(pytest.mark.skip(reason="tier 1/3 test: runs in the process without TRITON_INTERPRET"))
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU (tier 4, run on the GPU machine)"))
