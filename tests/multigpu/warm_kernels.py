"""Compile the Triton kernels of the multi-GPU tier in parallel processes before the tier runs.

Triton compiles a kernel the first time it is launched with a new combination of dtype, bias,
channel count and integer specialization (an argument equal to 1, or a multiple of 16) -- seconds
each, one after the other inside a process. The tier's ranks move in lock step, so each would
compile the same kernels at the same time. This script instead runs each kernel family once, in
separate processes side by side (one GPU process per job, spread over the GPUs), so the compiled
kernels land in Triton's on-disk cache (``TRITON_CACHE_DIR`` or ``~/.triton/cache``) and the tier
finds them there. It only warms a cache: it checks nothing, and whatever it misses compiles
during the tier as before.

Each job runs, on T tokens of a few documents, either the single-rank op forward + backward or a
1-rank KCP call (no process group; zigzag, so the back half reads the front half's rows through
the local halo: the KCP row kernels run too; or "kcp1": one document, one segment), for one (dtype, bias, C) the tier uses, with T chosen
so that the row counts fall in the specialization classes of the tier's calls (multiples of 16, odd
counts, 1). Usage: ``python tests/multigpu/warm_kernels.py [--procs N]`` (CUDA only; a no-op
without a GPU).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import multiprocessing as mp
import os
import sys
import time

BF16, FP32 = "bfloat16", "float32"

# (dtype, bias, C, T, kind): the (dtype, bias, C) classes of tests/multigpu/kcp_nccl.py
JOBS = [
    (BF16, True, 256, 16384, "single"), (BF16, True, 256, 16384, "kcp"),   # most checks
    (BF16, True, 256, 302, "single"), (BF16, True, 256, 302, "kcp"),       # fragments: odd row counts
    (BF16, True, 256, 1, "single"), (BF16, True, 256, 6, "kcp"),           # one token per rank
    (FP32, False, 256, 16384, "single"), (FP32, False, 256, 16384, "kcp"),  # the FP32 cases
    (BF16, False, 128, 4096, "single"), (BF16, False, 128, 4096, "kcp"),   # multi, compile
    (BF16, False, 128, 302, "kcp"),
    (BF16, False, 512, 32768, "single"), (BF16, False, 512, 16384, "kcp1"),  # issue 15's case
    (BF16, True, 256, 16, "kcp1"), (BF16, True, 256, 1, "kcp1"),             # one segment per rank
    (BF16, True, 8, 4096, "single"), (BF16, True, 8, 4096, "kcp"),         # C = 8
]


def _job(job, gpu):
    import torch

    from cakeconv import build_kcp_context, cake_causal_conv1d_det, cake_causal_conv1d_det_kcp

    dtype_name, bias, C, T, kind = job
    t0 = time.time()
    torch.cuda.set_device(gpu)
    dev = torch.device("cuda", gpu)
    dtype = getattr(torch, dtype_name)
    cuts = sorted({0, min(3, T), T // 3, min(T, T // 3 + 1), T})
    cu = torch.tensor(cuts, dtype=torch.int32, device=dev)
    x = torch.randn(T, C, device=dev).to(dtype)
    dy = torch.randn(T, C, device=dev).to(dtype)
    w = torch.randn(C, 4, device=dev).requires_grad_(True)
    b = torch.randn(C, device=dev).requires_grad_(True) if bias else None
    if kind == "single":
        xs = x.clone().requires_grad_(True)
        cake_causal_conv1d_det(xs, w, b, cu_seqlens=cu).backward(dy)
    else:
        if kind == "kcp1":  # one segment (no halo on one rank: the row kernels run in the tier)
            ctx = build_kcp_context(torch.tensor([0, T], dtype=torch.int32, device=dev), layout="contiguous")
        else:
            ctx = build_kcp_context(cu, layout="zigzag")  # no process group: one rank, local halo
        xl = ctx.shard(x).requires_grad_(True)
        cake_causal_conv1d_det_kcp(xl, w, ctx, bias=b).backward(ctx.shard(dy))
    torch.cuda.synchronize()
    return f"{dtype_name} bias={bias} C={C} T={T} {kind}: {time.time() - t0:.1f} s"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--procs", type=int, default=0, help="processes (default: one per job, at most CPUs - 2)")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("warm_kernels: no CUDA, nothing to compile")
        return 0
    n_gpus = torch.cuda.device_count()
    procs = args.procs or max(1, min(len(JOBS), (os.cpu_count() or 4) - 2))
    t0 = time.time()
    failed = 0
    with cf.ProcessPoolExecutor(procs, mp_context=mp.get_context("spawn")) as pool:
        futures = {pool.submit(_job, job, i % n_gpus): job for i, job in enumerate(JOBS)}
        for fut in cf.as_completed(futures):
            try:
                print(f"  warmed {fut.result()}", flush=True)
            except Exception as exc:  # the tier will hit (and report) the same error
                failed += 1
                print(f"  FAILED to warm {futures[fut]}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}", flush=True)
    print(f"warm_kernels: {len(JOBS)} jobs in {procs} processes on {n_gpus} GPU(s), {time.time() - t0:.0f} s"
          f"{f', {failed} failed' if failed else ''}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
