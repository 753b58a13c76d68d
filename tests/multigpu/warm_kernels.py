"""Compile the Triton kernels of the multi-GPU tier in parallel processes before the tier runs.

Triton compiles a kernel the first time it is launched with a new combination of dtypes and
constexprs (the configuration for C and bias, the row strides) -- seconds each, one after the
other inside a process. The tier's ranks move in lock step, so each would
compile the same kernels at the same time. This script instead runs each kernel family once, in
separate processes side by side (one GPU process per job, spread over the GPUs), so the compiled
kernels land in Triton's on-disk cache (``TRITON_CACHE_DIR`` or ``~/.triton/cache``) and the tier
finds them there. It only warms a cache: it checks nothing, and whatever it misses compiles
during the tier as before.

Each job runs, on T tokens of a few documents, the single-rank op forward + backward, or KCP
calls (run_job: a 1-rank context, one document on one rank, each rank of a 2-rank context in turn
with its messages dropped, the multi form), for one (dtype, bias, C) the tier uses. A compiled
kernel depends on the pointer dtypes, the constexprs (the configuration picked for C, bias, and
the row strides) and the launch options, not on the integer arguments (all unspecialized):
tests/test_warm_coverage.py records both sides on the CPU and checks that the jobs cover every
kernel a rank of the tier launches.

Usage: ``python tests/multigpu/warm_kernels.py [--procs N]`` (CUDA only; a no-op without a GPU).
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
    (BF16, False, 512, 32768, "single"), (BF16, False, 512, 16384, "kcp1"),  # the KCP one-document case
    (BF16, True, 256, 16, "kcp1"), (BF16, True, 256, 1, "kcp1"),             # one segment per rank
    (BF16, True, 8, 4096, "single"), (BF16, True, 8, 4096, "kcp"),         # C = 8
    # the ranks of a 2-rank context: gathers of received rows, row kernels of each (dtype, bias, C)
    (BF16, True, 256, 4096, "kcp2"), (FP32, False, 256, 4096, "kcp2"), (BF16, False, 128, 4096, "kcp2"),
    (BF16, False, 512, 4096, "kcp2"), (BF16, True, 8, 4096, "kcp2"),
    (BF16, None, None, 4096, "multi2"),  # the multi form (its g rows side by side: their own kernels)
    (BF16, None, None, 4096, "split2"),  # the compile check's multi form (row stride twice the width)
]
MULTI_C = (256, 128, 256)  # the tier's multi form on CUDA (kcp_nccl.py Env.multi_C)
SPLIT_C = 128  # the compile check's halves of C = 256 (kcp_nccl.py compile)


def run_job(job, device, backend="auto") -> None:
    """One job's forward + backward on ``device`` (module docstring). Kinds: "single" (the
    single-rank op), "kcp" (a 1-rank zigzag context: local halos), "kcp1" (one document, one
    segment), "kcp2" (each rank of a 2-rank zigzag context in turn, its messages dropped: the halo
    gathers that read received rows, and the row kernels, as the tier's ranks run them), "multi2"
    and "split2" (the same with the multi form of the multi and compile checks; bias and C of the
    job unused).
    ``backend``: the ops' backend ("triton" records the launches on the CPU: tests/test_warm_coverage.py)."""
    import torch

    from cakeconv import (
        KcpContext,
        build_kcp_context,
        cake_causal_conv1d_det,
        cake_causal_conv1d_det_kcp,
        cake_causal_conv1d_det_multi_kcp,
    )
    from cakeconv.cake_causal_conv1d_det_train_backend.kcp.plan import build_rank_plans, layout_fragments
    from tests.launch_cases import DroppedMessagesGroup

    dtype_name, bias, C, T, kind = job
    C = C or MULTI_C[0]  # "multi2" has its own channel counts
    dtype = getattr(torch, dtype_name)
    cuts = sorted({0, min(3, T), T // 3, min(T, T // 3 + 1), T})
    cu = torch.tensor(cuts, dtype=torch.int32, device=device)
    x = torch.randn(T, C, device=device).to(dtype)
    dy = torch.randn(T, C, device=device).to(dtype)
    w = torch.randn(C, 4, device=device).requires_grad_(True)
    b = torch.randn(C, device=device).requires_grad_(True) if bias else None
    if kind == "single":
        xs = x.clone().requires_grad_(True)
        cake_causal_conv1d_det(xs, w, b, cu_seqlens=cu, backend=backend).backward(dy)
        return
    if kind in ("kcp2", "multi2", "split2"):
        fragments = layout_fragments(cuts, 2, "zigzag")
        for plan in build_rank_plans(cuts, fragments):
            ctx = KcpContext(group=DroppedMessagesGroup(), layout="zigzag", fragments=fragments, global_cu_seqlens=cuts,
                             device=torch.device(device), plan=plan.to(torch.device(device)))
            S = ctx.num_local_tokens
            if kind == "kcp2":
                xl = x[:S].clone().requires_grad_(True)
                cake_causal_conv1d_det_kcp(xl, w, ctx, bias=b, backend=backend).backward(dy[:S])
                continue
            if kind == "multi2":  # the tier's multi form: q, k, v of MULTI_C channels, biases (b, None, b)
                xs = [torch.randn(S, c, device=device).to(dtype).requires_grad_(True) for c in MULTI_C]
                bs = [torch.randn(c, device=device) if i != 1 else None for i, c in enumerate(MULTI_C)]
            else:  # the compile check's: the two column halves of one [S, 2 * SPLIT_C] tensor, no biases
                whole = torch.randn(S, 2 * SPLIT_C, device=device).to(dtype).requires_grad_(True)
                xs, bs = list(whole.split([SPLIT_C, SPLIT_C], dim=1)), [None, None]
            ws = [torch.randn(x_i.shape[1], 4, device=device) for x_i in xs]
            dys = [[torch.randn_like(x_i) for x_i in xs]]
            if kind == "split2":  # eager passes dy's column halves; compiled code contiguous ones
                dys.append(list(torch.randn_like(whole).split([SPLIT_C, SPLIT_C], dim=1)))
            for dys_i in dys:
                ys = cake_causal_conv1d_det_multi_kcp(xs, ws, ctx, biases=bs, backend=backend)
                torch.autograd.backward(ys, dys_i)
        return
    if kind == "kcp1":  # one segment (no halo on one rank)
        ctx = build_kcp_context(torch.tensor([0, T], dtype=torch.int32, device=device), layout="contiguous")
    else:
        ctx = build_kcp_context(cu, layout="zigzag")  # no process group: one rank, local halo
    xl = ctx.shard(x).requires_grad_(True)
    cake_causal_conv1d_det_kcp(xl, w, ctx, bias=b, backend=backend).backward(ctx.shard(dy))


def _job(job, gpu):
    import torch

    t0 = time.time()
    torch.cuda.set_device(gpu)
    run_job(job, torch.device("cuda", gpu))
    torch.cuda.synchronize()
    dtype_name, bias, C, T, kind = job
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
