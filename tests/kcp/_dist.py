"""A small multi-process harness for the KCP tests: N ranks on the CPU over gloo.

``run_on_ranks(fn, world_size, *args)`` spawns ``world_size`` processes (torch.multiprocessing,
start method "spawn"), initialises a gloo process group in each through a ``file://`` store in a
fresh temporary directory, calls ``fn(rank, world_size, *args)`` and returns the per-rank results
(pickled through the temporary directory). A failure on any rank is re-raised in the parent as an
AssertionError naming the rank(s) and carrying their tracebacks. A hang fails the test: the
process group has a short timeout and the parent stops waiting after ``timeout_s`` seconds and
terminates the ranks.

``fn`` must be a module-level function (it is pickled by name) and should run every check of a
test inside one call, since starting processes costs seconds on a small machine.
"""

from __future__ import annotations

import datetime
import faulthandler
import os
import pickle
import sys
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

DEFAULT_TIMEOUT_S = 120.0


def _worker(rank: int, fn, world_size: int, tmp_dir: str, pg_timeout_s: float, args: tuple) -> None:
    faulthandler.enable()  # a native crash (SIGABRT, SIGSEGV) prints this rank's Python stack
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{os.path.join(tmp_dir, 'store')}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=pg_timeout_s),
    )
    try:
        if os.environ.get("TRITON_INTERPRET") == "1":  # tier 2: interpreted kernels stay in bounds
            from tests.interpreter_bounds import checked_memory
            from tests.interpreter_patch_once import install

            install()  # triton.language patched once per launch (tests/interpreter_patch_once.py)

            with checked_memory():
                result = fn(rank, world_size, *args)
        else:
            result = fn(rank, world_size, *args)
        with open(os.path.join(tmp_dir, f"result_{rank}.pkl"), "wb") as f:
            pickle.dump(result, f)
        # Nobody leaves while a peer may still be talking to it.
        dist.barrier()
    except BaseException:
        with open(os.path.join(tmp_dir, f"error_{rank}.txt"), "w") as f:
            f.write(traceback.format_exc())
        raise
    finally:
        dist.destroy_process_group()
    # Leave without the interpreter's teardown: gloo's background threads can abort a process at
    # exit ("terminate called without an active exception", seen in about 1 of 10 2-rank runs
    # here) after every exchange, check and result is done. os._exit skips that teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_on_ranks(fn, world_size: int, *args, timeout_s: float = DEFAULT_TIMEOUT_S) -> list:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` gloo ranks; return the results by rank.

    Raises:
        AssertionError: some rank raised (the message names every rank that reported an error,
            with its traceback), or the ranks did not finish within ``timeout_s``.
    """
    pg_timeout_s = max(10.0, timeout_s / 2)
    with tempfile.TemporaryDirectory(prefix="cakeconv_kcp_") as tmp_dir:
        context = mp.spawn(
            _worker, args=(fn, world_size, tmp_dir, pg_timeout_s, args), nprocs=world_size, join=False
        )
        deadline = time.monotonic() + timeout_s
        spawn_error = None
        timed_out = False
        try:
            while not context.join(timeout=1.0):
                if time.monotonic() > deadline:
                    timed_out = True
                    break
        except Exception as exc:  # a rank died; its own report is read below
            spawn_error = exc
        if timed_out:
            for process in context.processes:
                if process.is_alive():
                    process.terminate()
            for process in context.processes:
                process.join(5.0)
                if process.is_alive():
                    process.kill()

        reports = []
        for rank in range(world_size):
            path = os.path.join(tmp_dir, f"error_{rank}.txt")
            if os.path.exists(path):
                with open(path) as f:
                    reports.append(f"--- rank {rank} of {world_size} failed:\n{f.read()}")
        if reports:
            raise AssertionError("\n".join(reports))
        if timed_out:
            raise AssertionError(f"ranks of a {world_size}-rank run did not finish within {timeout_s} s (hang?)")
        if spawn_error is not None:
            raise AssertionError(f"a rank of a {world_size}-rank run died without a report: {spawn_error}")

        results = []
        for rank in range(world_size):
            with open(os.path.join(tmp_dir, f"result_{rank}.pkl"), "rb") as f:
                results.append(pickle.load(f))
        return results


def nccl_one_rank_group():
    """Body of a module-scoped pytest fixture (``yield from nccl_one_rank_group()``): a 1-rank NCCL
    process group on GPU 0 (``file://`` store, 60 s timeout, NVLink multicast off), destroyed
    afterwards. A group another module of the same process already made is reused, not destroyed."""
    for var, val in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
        os.environ.setdefault(var, val)
    if dist.is_initialized():
        yield dist.group.WORLD
        return
    tmp = tempfile.mkdtemp(prefix="cakeconv_nccl_")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"file://{tmp}/store", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60))
    yield dist.group.WORLD
    dist.destroy_process_group()
