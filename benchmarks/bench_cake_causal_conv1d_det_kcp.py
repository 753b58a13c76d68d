#!/usr/bin/env python3
"""Benchmark of cakeconv's context-parallel (KCP) causal conv1d + SiLU against the rank's local op, per layout.

Launch from the repository root, one process per GPU:

    torchrun --nproc-per-node P benchmarks/bench_cake_causal_conv1d_det_kcp.py [--out DIR]
    torchrun --nproc-per-node 2 benchmarks/bench_cake_causal_conv1d_det_kcp.py --tokens 131072   # S_local = 65,536
    torchrun --nproc-per-node 4 benchmarks/bench_cake_causal_conv1d_det_kcp.py --layouts zigzag --reps 50
    torchrun --nproc-per-node 2 benchmarks/bench_cake_causal_conv1d_det_kcp.py --dry-run --out /tmp/kcpbench

The script initialises torch.distributed itself (NCCL when CUDA is available, gloo for --dry-run or
without CUDA) and sets the CUDA device from LOCAL_RANK. Before the init it sets, in os.environ,
``NCCL_NVLS_ENABLE=0``, ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1`` and ``NVSHMEM_DISABLE_NVLS=1``:
NVLink multicast (NVLS) stays off, as the lent multi-GPU machines require. When a process group is
already initialised (e.g. the test harness), ``run(argv)`` uses it and leaves it initialised; a plain
``python benchmarks/bench_cake_causal_conv1d_det_kcp.py`` runs one rank (P = 1: no exchange).

Workload (the seed's KCP benchmark): a packed batch of T = 65,536 tokens in 3 documents of 15,945,
21,845 and 27,746 tokens, C = 4,096 channels, bf16 x and dy, FP32 taps [C, 4] and bias [C]. The
multi form runs q, k and v (three tensors of C channels each, their own taps and biases) in one
``cake_causal_conv1d_det_multi_kcp`` call. Layouts (SPEC section 4):

* ``contiguous`` needs T % P == 0 and ``zigzag`` T % 2P == 0. 65,536 meets both for P = 1, 2, 4, 8;
  for other P (3, 5, 6, 7) the LAST document is padded at its end to the next multiple (as
  TransformerEngine pads a THD batch), e.g. P = 3: T = 65,538 (contiguous), 65,538 (zigzag).
* ``zigzag_per_document`` needs every document length divisible by 2P: each document is padded at
  its end to the next multiple of 2P. Padded lengths: P = 2: 15,948 + 21,848 + 27,748 = 65,544;
  P = 4: 15,952 + 21,848 + 27,752 = 65,552; P = 8: 15,952 + 21,856 + 27,760 = 65,568.
  The table and every row state the lengths used.

``--tokens T`` scales the three documents proportionally (largest remainder); SPEC section 7 states
its targets at S_local = 65,536, i.e. ``--tokens $((65536 * P))``; the default (the seed's
workload) gives S_local = 65,536 / P.

Protocol, per layout (every figure is the SLOWEST rank's: the max over ranks of the rank's median):

1. Correctness first, on EVERY rank: the rank computes the single-rank op ``cake_causal_conv1d_det``
   on the whole global batch (same seed on every rank, so every rank holds the same global x),
   indexes its y and dx with ``ctx.local_token_indices`` and compares them with ``torch.equal`` to
   the KCP op's y and dx (forward through autograd, ``y.backward(dy_local)``); the same for each of
   q, k, v of the multi form. The per-rank failure flags are all-gathered, so every rank reports
   the same verdict (``bitwise``), and ranks that failed are named.
2. GPU time: four subjects, interleaved round by round (the order rotates): the KCP op, the local
   op, the KCP multi op and the local multi op (three single-rank calls). The local op is
   ``cake_causal_conv1d_det`` on the rank's own [S_local, C] rows with ``ctx.local_cu_seqlens`` (each
   local segment treated as a document start): the same arithmetic on the same rows, without the
   exchange and the boundary-row rewrite. One iteration = the forward through autograd, then
   ``backward(dy_local)``; three marks give fwd, bwd and fwd+bwd. Gradients are reset to None
   outside the span, so no accumulation kernel is timed.
   On CUDA the marks are CUDA events; before each iteration every rank synchronises, the ranks meet
   in a barrier, a 256 MiB read evicts the L2 (``--no-flush``: off) and ``torch.cuda._sleep`` holds
   the GPU so that the host enqueues the whole iteration before the GPU reaches it: the host time of
   a call must not leak into its span. ``--host-ahead-us auto`` (the default): after the warm-up
   iterations, one more iteration of every subject measures the host time to enqueue it (forward +
   backward, perf_counter); the sleep is 3x the largest (over subjects and ranks), at least 1 ms.
   Every timed iteration records its host time too; a row whose median host time exceeds 80% of
   the window says so (``host_leak``). On the CPU the marks are ``time.perf_counter``.
3. Eager loop (``--eager-steps``, 0 turns it off): no sleep, wall time. One step = .grad set to None,
   a chain of ``--chain`` (16) calls ``y = op(y, w_i, ...)`` with distinct taps and biases (leaves
   requiring grad) starting from the rank's x rows (requiring grad), one ``backward(dy)``; the device
   is synchronised before and after the step and the ranks meet in a barrier before it. Time per
   call = step / 16; the four subjects interleaved; median over steps.
4. Host cost (``--host-steps``, 0 turns it off): the same chain, and one call + backward per step
   (``--host-calls`` = 16 steps per sample), at a tiny shape where the GPU is idle:
   ``--host-tokens`` (default 4,096 x P, the 3 documents scaled) x ``--host-channels`` (256), its own
   context per layout; KCP vs the local op on the same rows, and the ratio KCP / local.

Definitions (per rank, bf16 x; the multi form sums the channels of q, k and v):

* floor bytes: fwd reads x and writes y, 4 * S_local * C; bwd reads x and dy and writes dx,
  6 * S_local * C; fwd+bwd 10 * S_local * C. GB/s = floor bytes / slowest-rank median time.
* halo bytes: what the rank receives from other ranks per fwd+bwd: the history rows (3 x rows of
  bf16 before each local segment that continues a document held elsewhere), hist_rows * C * 2, plus
  the future rows (FP32 g rows after each segment that a later fragment continues),
  fut_rows * C * 4. Rows a rank copies from its own fragments are not counted.
* overhead = (KCP fwd+bwd - local fwd+bwd) / local fwd+bwd, in %, both slowest-rank medians (GPU
  time); eager overhead the same with the eager-loop times per call; host ratio = KCP host time per
  call / local host time per call. The multi form compares the multi KCP call with three local calls.
  SPEC section 7 (S_local = 65,536, C = 4,096, every layout): GPU-time overhead <= 3%, eager-loop
  KCP call within 5% of the local op's, host cost <= 1.5x the single-rank op's.

Output (rank 0): progress lines on stderr; the table on stdout, also written to
``bench_cake_causal_conv1d_det_kcp_p{P}_table.txt``; ``..._p{P}.jsonl`` (one ``env`` line, then one
``timing`` row per (layout, P, form), form = single | multi, with GPU name or 'cpu', torch/triton
/cakeconv versions, UTC date, backend, per-rank medians, bytes, padding, eager and host-cost
figures) and ``..._p{P}.csv`` (the timing rows) under ``--out`` (default benchmarks/results). The
exit status is 1 if any rank's bitwise check failed.

``--dry-run``: T = 4,096 in 3 documents scaled down proportionally (997, 1,365, 1,734), C = 64,
backend ``reference`` on the CPU over gloo, 2 reps after 1 warm-up, a chain of 4, 2 eager and host
samples, host shape 128 x P tokens x 16 channels: it exercises the whole pipeline (layouts,
padding, bitwise check on every rank, gathers, files) and is what CI runs
(tests/kcp/test_kcp_bench_dry.py); its times mean nothing.

What only a multi-GPU machine can show: the real cost of the halo exchange (NCCL point-to-point
over NVLink) and whether the Triton path hides it behind the interior kernels (on gloo the
exchange blocks and the reference backend does not overlap); the skew between ranks that the
slowest-rank rule exposes (the zigzag layouts exist to balance it); and therefore whether the
targets are met. The CPU numbers say nothing about any of these.

Shape legend (tensor-name suffixes): T global tokens (after padding), S local rows (S_local),
C channels of one tensor, N documents, P ranks, K per-rank statistics.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import platform
import statistics
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# NVLink multicast stays off (set before torch.distributed is initialised; see the docstring).
NVLS_OFF_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}

SEED_DOC_LENGTHS = (15945, 21845, 27746)  # the seed's workload: T = 65,536
SEED_TOKENS = sum(SEED_DOC_LENGTHS)
LAYOUTS = ("contiguous", "zigzag", "zigzag_per_document")
FORMS = ("single", "multi")
NUM_MULTI = 3  # q, k, v
PASSES = ("fwd", "bwd", "fwdbwd")
PASS_LABEL = {"fwd": "fwd", "bwd": "bwd", "fwdbwd": "fwd+bwd"}
FLOOR_FACTOR = {"fwd": 4, "bwd": 6, "fwdbwd": 10}  # bytes per (row, channel) with bf16 x
TARGET_OVERHEAD_PCT = 3.0  # SPEC section 7, GPU time, at S_local = 65,536, C = 4,096
TARGET_EAGER_PCT = 5.0  # eager-loop KCP call within 5% of the local op's
TARGET_HOST_RATIO = 1.5  # KCP host cost <= 1.5x the single-rank op's
TARGET_S_LOCAL = 65536
DEFAULTS = {"tokens": SEED_TOKENS, "channels": 4096, "reps": 20, "warmup": 3, "backend": "auto", "chain": 16,
            "eager_steps": 10, "host_steps": 15, "host_calls": 16, "host_channels": 256, "host_tokens_per_rank": 4096}
DRY_DEFAULTS = {"tokens": 4096, "channels": 64, "reps": 2, "warmup": 1, "backend": "reference", "chain": 4,
                "eager_steps": 2, "host_steps": 2, "host_calls": 2, "host_channels": 16, "host_tokens_per_rank": 128}
FILE_STEM = "bench_cake_causal_conv1d_det_kcp"
SUBJECTS = ("kcp", "local", "kcp_multi", "local_multi")
HOST_AHEAD_MIN_US = 1000.0
HOST_AHEAD_MAX_US = 500000.0
HOST_AHEAD_FACTOR = 3.0


def log(msg: str) -> None:
    print(f"[kcp bench] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------------------------
# Documents and layouts
# --------------------------------------------------------------------------------------------------------------


def scaled_doc_lengths(total_tokens: int) -> list[int]:
    """The seed's 3 document lengths scaled to ``total_tokens`` (largest remainder, exact sum)."""
    if total_tokens < len(SEED_DOC_LENGTHS):
        raise ValueError(f"--tokens must be at least {len(SEED_DOC_LENGTHS)} (one per document), got {total_tokens}")
    exact = [n * total_tokens / SEED_TOKENS for n in SEED_DOC_LENGTHS]
    lengths = [int(v) for v in exact]
    by_remainder = sorted(range(len(exact)), key=lambda i: lengths[i] - exact[i])
    for i in by_remainder[: total_tokens - sum(lengths)]:
        lengths[i] += 1
    return lengths


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def padded_doc_lengths(lengths: list[int], layout: str, world_size: int) -> list[int]:
    """Document lengths that meet the layout's divisibility rule for P ranks (SPEC section 4).

    contiguous: T % P == 0; zigzag: T % 2P == 0 (the last document is padded at its end);
    zigzag_per_document: every length % 2P == 0 (each document padded at its end).
    """
    if layout == "zigzag_per_document":
        return [_round_up(n, 2 * world_size) for n in lengths]
    multiple = world_size if layout == "contiguous" else 2 * world_size
    total = sum(lengths)
    return lengths[:-1] + [lengths[-1] + _round_up(total, multiple) - total]


def cu_from_lengths(lengths: list[int]) -> list[int]:
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return cu


# --------------------------------------------------------------------------------------------------------------
# Arguments
# --------------------------------------------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="KCP causal conv1d + SiLU: KCP fwd/bwd vs the single-rank op on the same local rows, "
        "per layout: GPU time, eager loop and host cost (run under torchrun, one process per GPU).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--layouts", default=",".join(LAYOUTS), help=f"comma list among {','.join(LAYOUTS)}")
    p.add_argument("--channels", type=int, default=None, help="C of each tensor (default 4096; 64 with --dry-run)")
    p.add_argument("--tokens", type=int, default=None,
                   help=f"global T before padding, the 3 documents scaled proportionally (default {SEED_TOKENS}; "
                   "4096 with --dry-run)")
    p.add_argument("--reps", type=int, default=None, help="timed iterations per subject (default 20; 2 with --dry-run)")
    p.add_argument("--warmup", type=int, default=None, help="dropped iterations first (default 3; 1 with --dry-run)")
    p.add_argument("--backend", default=None, help="cakeconv backend (default auto; reference with --dry-run)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--host-ahead-us", default="auto",
                   help="GPU sleep before each timed iteration so the host enqueues it ahead: 'auto' (3x the "
                   "measured host time of one iteration, at least 1 ms), a number of us, or 0 (off)")
    p.add_argument("--no-flush", action="store_true", help="no L2 eviction read before each timed iteration")
    p.add_argument("--chain", type=int, default=None, help="calls per eager / host-cost chain step (default 16; 4 dry)")
    p.add_argument("--eager-steps", type=int, default=None, help="timed eager-loop steps per subject (0: off; default 10)")
    p.add_argument("--host-steps", type=int, default=None, help="timed host-cost samples per item (0: off; default 15)")
    p.add_argument("--host-calls", type=int, default=None, help="one-call-per-step host item: steps per sample (16)")
    p.add_argument("--host-tokens", type=int, default=None,
                   help="global T of the host-cost shape (default 4096 x P; 128 x P with --dry-run)")
    p.add_argument("--host-channels", type=int, default=None, help="C of the host-cost shape (default 256; 16 dry)")
    p.add_argument("--dry-run", action="store_true",
                   help="tiny shapes on the CPU over gloo, backend='reference' (what CI runs)")
    p.add_argument("--out", default=os.path.join(REPO_ROOT, "benchmarks", "results"), help="output folder")
    args = p.parse_args(argv)

    defaults = DRY_DEFAULTS if args.dry_run else DEFAULTS
    for name, value in defaults.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    layouts = [s.strip() for s in args.layouts.split(",") if s.strip()]
    unknown = [s for s in layouts if s not in LAYOUTS]
    if unknown or not layouts:
        raise ValueError(f"--layouts must be a comma list among {', '.join(LAYOUTS)}, got {args.layouts!r}")
    args.layouts = list(dict.fromkeys(layouts))
    if args.channels <= 0 or args.channels % 8 != 0:
        raise ValueError(f"--channels must be a positive multiple of 8, got {args.channels}")
    if args.host_channels <= 0 or args.host_channels % 8 != 0:
        raise ValueError(f"--host-channels must be a positive multiple of 8, got {args.host_channels}")
    if args.reps < 1:
        raise ValueError(f"--reps must be >= 1, got {args.reps}")
    if args.warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {args.warmup}")
    if args.chain < 1 or args.eager_steps < 0 or args.host_steps < 0 or args.host_calls < 1:
        raise ValueError("--chain and --host-calls must be >= 1, --eager-steps and --host-steps >= 0")
    text = str(args.host_ahead_us).strip().lower()
    args.host_ahead_auto = text == "auto"
    try:
        args.host_ahead_us = 0.0 if args.host_ahead_auto else float(text)
    except ValueError:
        raise ValueError(f"--host-ahead-us must be 'auto' or a number of microseconds, got {args.host_ahead_us!r}")
    if args.host_ahead_us < 0:
        raise ValueError(f"--host-ahead-us must be >= 0, got {args.host_ahead_us}")
    if args.backend not in ("auto", "triton", "reference"):
        raise ValueError(f"--backend must be one of auto, triton, reference, got {args.backend!r}")
    scaled_doc_lengths(args.tokens)  # validates --tokens
    return args


# --------------------------------------------------------------------------------------------------------------
# Process group, device, environment
# --------------------------------------------------------------------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def setup_distributed(torch, dist, dry_run: bool):
    """(device, owns_group): initialise torch.distributed unless it already is.

    NCCL with the CUDA device from LOCAL_RANK, or gloo on the CPU (--dry-run, or no CUDA).
    """
    for key, value in NVLS_OFF_ENV.items():
        os.environ[key] = value
    use_cuda = (not dry_run) and torch.cuda.is_available()
    if not dry_run and not use_cuda:
        raise ValueError("no CUDA device: run with --dry-run to exercise the benchmark on the CPU")
    device = torch.device("cpu")
    if use_cuda:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if dist.is_initialized() and "LOCAL_RANK" not in os.environ:
            local_rank = dist.get_rank() % torch.cuda.device_count()
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    owns_group = False
    if not dist.is_initialized():
        pg_backend = "nccl" if use_cuda else "gloo"
        if "WORLD_SIZE" in os.environ:  # torchrun
            dist.init_process_group(pg_backend)
        else:  # a plain `python bench...py`: one rank
            dist.init_process_group(pg_backend, init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
        owns_group = True
    group_backend = str(dist.get_backend()).lower()
    if use_cuda and "nccl" not in group_backend:
        raise ValueError(f"the CUDA benchmark needs an NCCL process group, got {group_backend!r}")
    if not use_cuda and "gloo" not in group_backend:
        raise ValueError(f"--dry-run runs on the CPU and needs a gloo process group, got {group_backend!r}")
    return device, owns_group


def environment(torch, dist, device, backend: str, cakeconv) -> dict:
    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "host": platform.node(),
        "cpu_count": os.cpu_count(),
        "cakeconv": getattr(cakeconv, "__version__", None),
        "backend": backend,
        "world_size": dist.get_world_size(),
        "process_group": str(dist.get_backend()),
        **{k: os.environ.get(k) for k in NVLS_OFF_ENV},
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception:  # noqa: BLE001 - any import failure means "not available"
        env["triton"] = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env["gpu"] = props.name
        env["sm"] = f"{props.major}.{props.minor}"
        env["cuda"] = torch.version.cuda
        nccl_version = torch.cuda.nccl.version()  # a tuple in recent torch, an int in older ones
        env["nccl"] = ".".join(str(v) for v in nccl_version) if isinstance(nccl_version, tuple) else str(nccl_version)
    else:
        env["gpu"] = "cpu"
        env["sm"] = env["cuda"] = env["nccl"] = None
    return env


# --------------------------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------------------------


class Timer:
    """Marks for one iteration: CUDA events (GPU) or perf_counter (CPU); aligns the ranks before each one."""

    def __init__(self, torch, dist, device, flush: bool, host_ahead_us: float):
        self.torch = torch
        self.dist = dist
        self.cuda = device.type == "cuda"
        self.device = device
        self.flush_buf = None
        self.sleep_cycles = 0
        self.host_ahead_us = 0.0
        if self.cuda and flush:
            self.flush_buf = torch.empty(256 * 2**20 // 4, dtype=torch.float32, device=device).normal_()
        self.set_host_ahead(host_ahead_us)

    def set_host_ahead(self, us: float) -> None:
        """The GPU sleep before each timed iteration (CUDA only): us microseconds at ~2 GHz."""
        if self.cuda and us > 0 and hasattr(self.torch.cuda, "_sleep"):
            self.sleep_cycles = int(us * 2000)  # ~2 GHz SM clock; a slower clock only sleeps longer
            self.host_ahead_us = float(us)
        else:
            self.sleep_cycles = 0
            self.host_ahead_us = 0.0

    def barrier(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()
            self.dist.barrier(device_ids=[self.device.index])
            self.torch.cuda.synchronize()
        else:
            self.dist.barrier()

    def align(self) -> None:
        """Idle device, all ranks released together, cold L2, then the host-ahead sleep."""
        self.barrier()
        if self.cuda:
            if self.flush_buf is not None:
                self.flush_buf.sum()
            if self.sleep_cycles:
                self.torch.cuda._sleep(self.sleep_cycles)

    def mark(self):
        if self.cuda:
            event = self.torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def elapsed_ms(self, a, b) -> float:
        if self.cuda:
            return a.elapsed_time(b)
        return (b - a) * 1e3

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()


def make_step(torch, forward, leaves, dys):
    """One iteration: forward through autograd, then backward(dys).

    Returns fn(timer) -> (m0, m1, m2, host_ms): the three marks and the host time to enqueue the iteration.
    """

    def step(timer):
        for t in leaves:
            t.grad = None
        timer.align()
        m0 = timer.mark()
        t0 = time.perf_counter()
        ys = forward()
        m1 = timer.mark()
        torch.autograd.backward(ys, dys)
        host_ms = (time.perf_counter() - t0) * 1e3
        m2 = timer.mark()
        return m0, m1, m2, host_ms

    return step


def _all_max(torch, dist, value: float, coll_device) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=coll_device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def time_subjects(torch, dist, steps: dict, timer: Timer, reps: int, warmup: int, auto_ahead: bool, coll_device):
    """Median ms per (subject, pass) of this rank, and the median host ms per subject.

    Subjects interleaved, their order rotating each round. With auto_ahead (CUDA), after the warm-up one more
    iteration of every subject measures its host time and the sleep becomes 3x the largest over subjects and
    ranks (at least 1 ms), so the host time of a call does not leak into its span.
    """
    names = list(steps)
    samples = {(n, p): [] for n in names for p in PASSES}
    host = {n: [] for n in names}
    for r in range(warmup):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            steps[name](timer)
        timer.sync()
    if auto_ahead and timer.cuda:
        timer.set_host_ahead(HOST_AHEAD_MAX_US / 10)  # keep the GPU away from the host while measuring it
        host_max = max(steps[name](timer)[3] for name in names)
        timer.sync()
        host_max = _all_max(torch, dist, host_max, coll_device)
        timer.set_host_ahead(min(HOST_AHEAD_MAX_US, max(HOST_AHEAD_MIN_US, HOST_AHEAD_FACTOR * host_max * 1e3)))
    for r in range(reps):
        k = r % len(names)
        marks = []
        for name in names[k:] + names[:k]:
            marks.append((name, steps[name](timer)))
        timer.sync()
        for name, (m0, m1, m2, host_ms) in marks:
            samples[(name, "fwd")].append(timer.elapsed_ms(m0, m1))
            samples[(name, "bwd")].append(timer.elapsed_ms(m1, m2))
            samples[(name, "fwdbwd")].append(timer.elapsed_ms(m0, m2))
            host[name].append(host_ms)
    return ({key: statistics.median(v) for key, v in samples.items()},
            {n: statistics.median(v) for n, v in host.items()})


def wall_subjects(subjects: dict, timer: Timer, samples: int, warmup: int) -> dict:
    """Median wall ms per call of each subject {name: (fn, calls)}: per sample the ranks meet in a barrier,
    the device is idle, then fn() runs between two synchronisations; the order rotates each round."""
    names = list(subjects)
    out = {n: [] for n in names}
    for r in range(warmup + samples):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            fn, calls = subjects[name]
            timer.barrier()
            t0 = time.perf_counter()
            fn()
            timer.sync()
            dt = time.perf_counter() - t0
            if r >= warmup:
                out[name].append(dt * 1e3 / calls)
    return {n: statistics.median(v) for n, v in out.items()}


def eager_subjects(torch, ops: dict, xs_SC, dys_SC, params_by_call, chain: int, mode: str, calls_per_sample: int):
    """{subject: (fn, calls)}: ``chain``: one step = zero grads, ``chain`` calls y = op(y, taps of call i),
    one backward; ``step``: ``calls_per_sample`` steps of one call + its backward.

    ops: {subject: (op(inputs, i) -> outputs, n_tensors)}; the op gets a list of n_tensors inputs and
    returns a list of n_tensors outputs, with the taps/biases of call i.
    """
    out = {}
    for name, (op, n) in ops.items():
        leaves = [x.detach().requires_grad_(True) for x in xs_SC[:n]]  # own leaves, shared storage
        dys = dys_SC[:n]
        params = leaves + [t for i in range(chain) for t in params_by_call(name, i)]

        def zero_grad(params=params):
            for t in params:
                t.grad = None

        if mode == "chain":

            def fn(op=op, leaves=leaves, dys=dys, zero_grad=zero_grad):
                zero_grad()
                ys = leaves
                for i in range(chain):
                    ys = op(ys, i)
                torch.autograd.backward(ys, dys)

            out[name] = (fn, chain)
        else:

            def fn(op=op, leaves=leaves, dys=dys, zero_grad=zero_grad):
                for _ in range(calls_per_sample):
                    zero_grad()
                    torch.autograd.backward(op(leaves, 0), dys)

            out[name] = (fn, calls_per_sample)
    return out


# --------------------------------------------------------------------------------------------------------------
# One layout
# --------------------------------------------------------------------------------------------------------------


def global_inputs(torch, T: int, C: int, device, seed: int, count: int):
    """``count`` tensors (x_TC, dy_TC, w_C4, b_C), the same on every rank (same seed, same device type)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    out = []
    for _ in range(count):
        x_TC = torch.randn(T, C, generator=gen, device=device, dtype=torch.float32).to(torch.bfloat16)
        dy_TC = torch.randn(T, C, generator=gen, device=device, dtype=torch.float32).to(torch.bfloat16)
        w_C4 = (torch.randn(C, 4, generator=gen, device=device, dtype=torch.float32) * 0.5).contiguous()
        b_C = (torch.randn(C, generator=gen, device=device, dtype=torch.float32) * 0.2).contiguous()
        out.append((x_TC, dy_TC, w_C4, b_C))
    return out


def local_indices(ctx):
    """int64 [S]: the global token of each local row."""
    return ctx.local_token_indices


def local_cu_seqlens(ctx):
    return ctx.local_cu_seqlens


def shard(ctx, x_global):
    """This rank's rows of a global [T, C] tensor, in local order."""
    return ctx.shard(x_global)


def num_segments(ctx) -> int:
    return int(ctx.num_segments)


def remote_rows(ctx, direction: str) -> int:
    """Rows this rank receives from other ranks in one exchange (``hist`` or ``fut``)."""
    return int(getattr(ctx.plan, direction).num_recv)


def single_rank_reference(torch, cakeconv, x_TC, dy_TC, w_C4, b_C, cu_N1, index_S, backend):
    """(y, dx) of the single-rank op on the whole global batch, at this rank's tokens."""
    x_leaf = x_TC.detach().clone().requires_grad_(True)
    y_TC = cakeconv.cake_causal_conv1d_det(x_leaf, w_C4, b_C, cu_seqlens=cu_N1, backend=backend)
    y_TC.backward(dy_TC)
    return y_TC.detach().index_select(0, index_S), x_leaf.grad.index_select(0, index_S)


def check_bitwise(torch, cakeconv, ctx, inputs, cu_N1, backend) -> dict:
    """This rank's verdict per form: KCP y and dx bitwise the single-rank op's at the local tokens."""
    index_S = local_indices(ctx).to(cu_N1.device)
    ok = {}
    # single form: the first tensor
    x_TC, dy_TC, w_C4, b_C = inputs[0]
    y_ref_SC, dx_ref_SC = single_rank_reference(torch, cakeconv, x_TC, dy_TC, w_C4, b_C, cu_N1, index_S, backend)
    x_SC = shard(ctx, x_TC).requires_grad_(True)
    y_SC = cakeconv.cake_causal_conv1d_det_kcp(x_SC, w_C4, ctx, bias=b_C, backend=backend)
    y_SC.backward(shard(ctx, dy_TC))
    ok["single"] = bool(torch.equal(y_SC.detach(), y_ref_SC)) and bool(torch.equal(x_SC.grad, dx_ref_SC))
    del y_ref_SC, dx_ref_SC, x_SC, y_SC
    # multi form: q, k, v in one call, each against its own single-rank reference
    xs = [shard(ctx, t[0]).requires_grad_(True) for t in inputs]
    ys = cakeconv.cake_causal_conv1d_det_multi_kcp(xs, [t[2] for t in inputs], ctx,
                                                   biases=[t[3] for t in inputs], backend=backend)
    torch.autograd.backward(ys, [shard(ctx, t[1]) for t in inputs])
    good = True
    for (x_TC, dy_TC, w_C4, b_C), x_SC, y_SC in zip(inputs, xs, ys):
        y_ref_SC, dx_ref_SC = single_rank_reference(torch, cakeconv, x_TC, dy_TC, w_C4, b_C, cu_N1, index_S, backend)
        good = good and bool(torch.equal(y_SC.detach(), y_ref_SC)) and bool(torch.equal(x_SC.grad, dx_ref_SC))
    ok["multi"] = good
    return ok


def subject_ops(cakeconv, ctx, backend, taps):
    """{subject: (op(inputs, i) -> outputs, n_tensors)} with taps(subject, i) -> [(w, b)] of call i."""
    kcp, kcp_multi = cakeconv.cake_causal_conv1d_det_kcp, cakeconv.cake_causal_conv1d_det_multi_kcp
    local = cakeconv.cake_causal_conv1d_det
    local_cu = local_cu_seqlens(ctx)

    def op_kcp(xs, i):
        (w, b), = taps("kcp", i)
        return [kcp(xs[0], w, ctx, bias=b, backend=backend)]

    def op_local(xs, i):
        (w, b), = taps("local", i)
        return [local(xs[0], w, b, cu_seqlens=local_cu, backend=backend)]

    def op_kcp_multi(xs, i):
        wb = taps("kcp_multi", i)
        return list(kcp_multi(list(xs), [w for w, _ in wb], ctx, biases=[b for _, b in wb], backend=backend))

    def op_local_multi(xs, i):
        wb = taps("local_multi", i)
        return [local(x, w, b, cu_seqlens=local_cu, backend=backend) for x, (w, b) in zip(xs, wb)]

    return {"kcp": (op_kcp, 1), "local": (op_local, 1), "kcp_multi": (op_kcp_multi, NUM_MULTI),
            "local_multi": (op_local_multi, NUM_MULTI)}


def chain_taps(torch, C: int, device, seed: int, chain: int):
    """taps(subject, i) -> [(w, b)] per tensor of call i: leaves requiring grad, distinct per call; the KCP and
    local subjects of a form get equal values (their own leaves)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed + 7)
    base = [[((torch.randn(C, 4, generator=gen, device=device) * 0.5).contiguous(),
              (torch.randn(C, generator=gen, device=device) * 0.2).contiguous()) for _ in range(NUM_MULTI)]
            for _ in range(chain)]
    leaves = {}
    for name in SUBJECTS:
        n = 1 if name in ("kcp", "local") else NUM_MULTI
        leaves[name] = [[(w.clone().requires_grad_(True), b.clone().requires_grad_(True)) for w, b in base[i][:n]]
                        for i in range(chain)]
    return lambda name, i: leaves[name][i]


def run_layout(torch, dist, cakeconv, args, layout, device, timer, coll_device):
    """Check and time one layout; returns (per-rank stats as dicts, failures by rank, doc lengths)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    C, backend = args.channels, args.backend
    lengths = padded_doc_lengths(scaled_doc_lengths(args.tokens), layout, world)
    cu_list = cu_from_lengths(lengths)
    T = cu_list[-1]
    cu_N1 = torch.tensor(cu_list, dtype=torch.int32, device=device)
    ctx = cakeconv.build_kcp_context(cu_N1, layout=layout, device=device)
    S = int(ctx.num_local_tokens)
    if rank == 0:
        log(f"{layout}: P={world} T={T} docs {lengths} S_local={S} C={C} (multi: {NUM_MULTI} x {C}): checking")

    inputs = global_inputs(torch, T, C, device, args.seed, NUM_MULTI)
    ok = check_bitwise(torch, cakeconv, ctx, inputs, cu_N1, backend)
    flags_K = torch.tensor([0 if ok[f] else 1 for f in FORMS], dtype=torch.int64, device=coll_device)
    gathered = [torch.empty_like(flags_K) for _ in range(world)]
    dist.all_gather(gathered, flags_K)
    failures = {f: [r for r in range(world) if int(gathered[r][i]) != 0] for i, f in enumerate(FORMS)}
    for f in FORMS:
        if not ok[f]:
            log(f"rank {rank}: {layout} {f}: KCP y/dx NOT bitwise equal to the single-rank op")

    # GPU time. Timing operands: this rank's rows (leaves), the taps and biases as leaves too.
    local_cu = local_cu_seqlens(ctx)
    xs_SC = [shard(ctx, t[0]).detach().requires_grad_(True) for t in inputs]
    dys_SC = [shard(ctx, t[1]).contiguous() for t in inputs]
    ws_C4 = [t[2].detach().clone().requires_grad_(True) for t in inputs]
    bs_C = [t[3].detach().clone().requires_grad_(True) for t in inputs]
    del inputs
    x_SC, dy_SC, w_C4, b_C = xs_SC[0], dys_SC[0], ws_C4[0], bs_C[0]
    kcp, kcp_multi = cakeconv.cake_causal_conv1d_det_kcp, cakeconv.cake_causal_conv1d_det_multi_kcp
    local = cakeconv.cake_causal_conv1d_det
    all_leaves = xs_SC + ws_C4 + bs_C
    steps = {
        "kcp": make_step(torch, lambda: kcp(x_SC, w_C4, ctx, bias=b_C, backend=backend),
                         [x_SC, w_C4, b_C], [dy_SC]),
        "local": make_step(torch, lambda: local(x_SC, w_C4, b_C, cu_seqlens=local_cu, backend=backend),
                           [x_SC, w_C4, b_C], [dy_SC]),
        "kcp_multi": make_step(torch, lambda: kcp_multi(xs_SC, ws_C4, ctx, biases=bs_C, backend=backend),
                               all_leaves, dys_SC),
        "local_multi": make_step(
            torch, lambda: [local(x, w, b, cu_seqlens=local_cu, backend=backend) for x, w, b in zip(xs_SC, ws_C4, bs_C)],
            all_leaves, dys_SC),
    }
    t0 = time.perf_counter()
    timer.set_host_ahead(args.host_ahead_us)
    med, host_med = time_subjects(torch, dist, steps, timer, args.reps, args.warmup, args.host_ahead_auto, coll_device)
    stats = {"S": float(S), "segments": float(num_segments(ctx)), "hist_rows": float(remote_rows(ctx, "hist")),
             "fut_rows": float(remote_rows(ctx, "fut")), "host_ahead_us": timer.host_ahead_us}
    for n in SUBJECTS:
        for p in PASSES:
            stats[f"{n}_{p}"] = med[(n, p)]
        stats[f"{n}_host_ms"] = host_med[n]
    steps = None
    t_gpu = time.perf_counter() - t0

    # Eager loop: the 16-call chain at this shape, no sleep.
    t0 = time.perf_counter()
    if args.eager_steps > 0:
        taps = chain_taps(torch, C, device, args.seed, args.chain)
        subj = eager_subjects(torch, subject_ops(cakeconv, ctx, backend, taps), xs_SC, dys_SC,
                              lambda name, i: [t for wb in taps(name, i) for t in wb], args.chain, "chain", 1)
        eager = wall_subjects(subj, timer, args.eager_steps, 0 if args.dry_run else 1)
        subj = taps = None
        for n in SUBJECTS:
            stats[f"{n}_eager_ms"] = eager[n]
    t_eager = time.perf_counter() - t0
    xs_SC = dys_SC = ws_C4 = bs_C = x_SC = dy_SC = w_C4 = b_C = all_leaves = None  # free before the host cost
    if device.type == "cuda":
        torch.cuda.empty_cache()

    # Host cost: the chain and one call per step at the tiny shape, its own context.
    t0 = time.perf_counter()
    host_T = None
    if args.host_steps > 0:
        host_tokens = args.host_tokens or args.host_tokens_per_rank * world
        h_lengths = padded_doc_lengths(scaled_doc_lengths(host_tokens), layout, world)
        h_cu = torch.tensor(cu_from_lengths(h_lengths), dtype=torch.int32, device=device)
        h_ctx = cakeconv.build_kcp_context(h_cu, layout=layout, device=device)
        host_T, hC = int(h_cu[-1]), args.host_channels
        h_inputs = global_inputs(torch, host_T, hC, device, args.seed + 1, NUM_MULTI)
        h_xs = [shard(h_ctx, t[0]).contiguous() for t in h_inputs]
        h_dys = [shard(h_ctx, t[1]).contiguous() for t in h_inputs]
        del h_inputs
        taps = chain_taps(torch, hC, device, args.seed + 1, args.chain)
        ops = subject_ops(cakeconv, h_ctx, backend, taps)
        flat = lambda name, i: [t for wb in taps(name, i) for t in wb]  # noqa: E731
        subj = {}
        for mode in ("chain", "step"):
            for n, fn_calls in eager_subjects(torch, ops, h_xs, h_dys, flat, args.chain, mode, args.host_calls).items():
                subj[f"{n}|{mode}"] = fn_calls
        # one untimed round compiles the kernels of this shape
        host = wall_subjects(subj, timer, args.host_steps, 0 if args.dry_run else 3)
        for key, v in host.items():
            n, mode = key.split("|")
            stats[f"{n}_host_{mode}_ms"] = v
        stats["host_S_local"] = float(int(h_ctx.num_local_tokens))
        subj = ops = taps = h_ctx = h_xs = h_dys = None
    t_host = time.perf_counter() - t0

    keys = sorted(stats)
    mine_K = torch.tensor([stats[k] for k in keys], dtype=torch.float64, device=coll_device)
    gathered = [torch.empty_like(mine_K) for _ in range(world)]
    dist.all_gather(gathered, mine_K)
    stats_P = [dict(zip(keys, g.cpu().tolist())) for g in gathered]
    if rank == 0:
        slow = {n: max(s[f"{n}_fwdbwd"] for s in stats_P) for n in SUBJECTS}
        log(f"{layout}: GPU time {t_gpu:.1f}s (host ahead {max(s['host_ahead_us'] for s in stats_P) / 1e3:.1f} ms), "
            f"eager {t_eager:.1f}s, host cost {t_host:.1f}s  "
            + "  ".join(f"{n}:{PASS_LABEL['fwdbwd']}={slow[n]:.3f}ms" for n in SUBJECTS))
    return stats_P, failures, lengths, host_T


# --------------------------------------------------------------------------------------------------------------
# Rows, table, files
# --------------------------------------------------------------------------------------------------------------


def _pct(a, b):
    return 100.0 * (a - b) / b if (a is not None and b) else None


def build_rows(env, args, layout, stats_P, failures, lengths, host_T=None) -> list[dict]:
    world = len(stats_P)
    by_rank = lambda key: [s[key] for s in stats_P]  # noqa: E731
    slowest = lambda key: max(by_rank(key)) if key in stats_P[0] else None  # noqa: E731
    base = scaled_doc_lengths(args.tokens)
    S = int(stats_P[0]["S"])
    rows = []
    for form in FORMS:
        kcp_name, local_name = ("kcp", "local") if form == "single" else ("kcp_multi", "local_multi")
        n_tensors = 1 if form == "single" else NUM_MULTI
        c_total = args.channels * n_tensors
        ms = {p: slowest(f"{kcp_name}_{p}") for p in PASSES}
        local_ms = {p: slowest(f"{local_name}_{p}") for p in PASSES}
        per_rank_overhead = [100.0 * (k - loc) / loc for k, loc in
                             zip(by_rank(f"{kcp_name}_fwdbwd"), by_rank(f"{local_name}_fwdbwd"))]
        halo_bytes_P = [s["hist_rows"] * c_total * 2 + s["fut_rows"] * c_total * 4 for s in stats_P]
        host_ahead_us = max(by_rank("host_ahead_us"))
        host_enqueue_ms = slowest(f"{kcp_name}_host_ms")
        local_enqueue_ms = slowest(f"{local_name}_host_ms")
        eager_ms, local_eager_ms = slowest(f"{kcp_name}_eager_ms"), slowest(f"{local_name}_eager_ms")
        hc, lhc = slowest(f"{kcp_name}_host_chain_ms"), slowest(f"{local_name}_host_chain_ms")
        hs, lhs = slowest(f"{kcp_name}_host_step_ms"), slowest(f"{local_name}_host_step_ms")
        row = {
            "kind": "timing",
            "date": env["date"],
            "gpu": env["gpu"],
            "torch": env["torch"],
            "triton": env["triton"],
            "cakeconv": env["cakeconv"],
            "backend": env["backend"],
            "process_group": env["process_group"],
            "layout": layout,
            "P": world,
            "form": form,
            "num_tensors": n_tensors,
            "C": args.channels,
            "C_total": c_total,
            "T": sum(lengths),
            "doc_lengths": lengths,
            "doc_lengths_unpadded": base,
            "pad_tokens": sum(lengths) - sum(base),
            "S_local": S,
            "S_local_by_rank": [int(v) for v in by_rank("S")],
            "segments_by_rank": [int(v) for v in by_rank("segments")],
            "hist_rows_by_rank": [int(v) for v in by_rank("hist_rows")],
            "fut_rows_by_rank": [int(v) for v in by_rank("fut_rows")],
            "halo_bytes_max": max(halo_bytes_P),
            "fwd_ms": ms["fwd"],
            "bwd_ms": ms["bwd"],
            "fwdbwd_ms": ms["fwdbwd"],
            "local_fwd_ms": local_ms["fwd"],
            "local_bwd_ms": local_ms["bwd"],
            "local_fwdbwd_ms": local_ms["fwdbwd"],
            "overhead_pct": 100.0 * (ms["fwdbwd"] - local_ms["fwdbwd"]) / local_ms["fwdbwd"],
            "overhead_pct_max_rank": max(per_rank_overhead),
            "fwdbwd_ms_by_rank": by_rank(f"{kcp_name}_fwdbwd"),
            "local_fwdbwd_ms_by_rank": by_rank(f"{local_name}_fwdbwd"),
            "fwd_gbs": FLOOR_FACTOR["fwd"] * S * c_total / (ms["fwd"] * 1e-3) / 1e9,
            "bwd_gbs": FLOOR_FACTOR["bwd"] * S * c_total / (ms["bwd"] * 1e-3) / 1e9,
            "fwdbwd_gbs": FLOOR_FACTOR["fwdbwd"] * S * c_total / (ms["fwdbwd"] * 1e-3) / 1e9,
            # the host-ahead window of the GPU-time rows and the host time to enqueue one iteration
            "host_ahead_us": host_ahead_us,
            "host_enqueue_ms": host_enqueue_ms,
            "local_host_enqueue_ms": local_enqueue_ms,
            "host_leak": bool(host_ahead_us > 0 and host_enqueue_ms is not None
                              and host_enqueue_ms > 0.8 * host_ahead_us * 1e-3),
            # eager loop: chain of `chain` calls, one backward per step, wall time per call
            "chain": args.chain,
            "eager_ms": eager_ms,
            "local_eager_ms": local_eager_ms,
            "eager_overhead_pct": _pct(eager_ms, local_eager_ms),
            "eager_ms_by_rank": by_rank(f"{kcp_name}_eager_ms") if eager_ms is not None else None,
            "eager_fwdbwd_gbs": (FLOOR_FACTOR["fwdbwd"] * S * c_total / (eager_ms * 1e-3) / 1e9) if eager_ms else None,
            # host cost per call at the tiny shape (GPU idle): chain and one call + backward per step
            "host_T": host_T,
            "host_C": args.host_channels if host_T else None,
            "host_S_local": int(stats_P[0]["host_S_local"]) if "host_S_local" in stats_P[0] else None,
            "host_chain_us": hc * 1e3 if hc is not None else None,
            "local_host_chain_us": lhc * 1e3 if lhc is not None else None,
            "host_chain_ratio": (hc / lhc) if (hc is not None and lhc) else None,
            "host_step_us": hs * 1e3 if hs is not None else None,
            "local_host_step_us": lhs * 1e3 if lhs is not None else None,
            "host_step_ratio": (hs / lhs) if (hs is not None and lhs) else None,
            "bitwise": not failures[form],
            "bitwise_failed_ranks": failures[form],
            "reps": args.reps,
            "warmup": args.warmup,
            "eager_steps": args.eager_steps,
            "host_steps": args.host_steps,
            "l2_flush": (not args.no_flush) and env["gpu"] != "cpu",
            "dry_run": args.dry_run,
        }
        rows.append(row)
    return rows


CSV_FIELDS = ["date", "gpu", "torch", "triton", "cakeconv", "backend", "layout", "P", "form", "num_tensors", "C",
              "T", "pad_tokens", "S_local", "fwd_ms", "bwd_ms", "fwdbwd_ms", "local_fwd_ms", "local_bwd_ms",
              "local_fwdbwd_ms", "overhead_pct", "overhead_pct_max_rank", "fwd_gbs", "bwd_gbs", "fwdbwd_gbs",
              "host_ahead_us", "host_enqueue_ms", "host_leak", "chain", "eager_ms", "local_eager_ms",
              "eager_overhead_pct", "host_T", "host_C", "host_S_local", "host_chain_us", "local_host_chain_us",
              "host_chain_ratio", "host_step_us", "local_host_step_us", "host_step_ratio", "halo_bytes_max",
              "bitwise", "reps", "warmup", "dry_run"]


def _f(v, fmt):
    return format(v, fmt) if v is not None else "-"


def format_table(rows, env, args, elapsed) -> str:
    world = env["world_size"]
    out = [
        f"# KCP causal conv1d + SiLU | {env['gpu']} | P={world} ({env['process_group']}) | torch {env['torch']} | "
        f"triton {env['triton']} | cakeconv {env['cakeconv']} ({env['backend']}) | {env['date']}",
        f"# seed workload: 3 documents {scaled_doc_lengths(args.tokens)} (T={args.tokens}), C={args.channels} "
        f"(multi: q, k, v of {args.channels}), bf16 x/dy, fp32 taps+bias; slowest rank of per-rank medians; "
        f"GPU time: {args.reps} iterations after {args.warmup} warm-up, host ahead "
        f"{'auto (3x the host time of one iteration)' if args.host_ahead_auto else f'{args.host_ahead_us:.0f} us'}; "
        f"eager: chain of {args.chain}, {args.eager_steps} steps; host cost: {args.host_steps} samples",
        "",
        "== GPU time (fwd+bwd ms; overhead = KCP / local - 1) ==",
        f"{'layout':<20} {'P':>2} {'T':>7} {'S_local':>7} {'fwd ms':>9} {'bwd ms':>9} {'fwd+bwd ms':>10} "
        f"{'local ms':>9} {'overhead %':>10} {'multi %':>8} {'ahead ms':>8} {'enqueue ms':>10} {'bitwise':>8}",
    ]
    by_layout = {}
    for r in rows:
        by_layout.setdefault(r["layout"], {})[r["form"]] = r
    for layout, forms in by_layout.items():
        s, m = forms["single"], forms["multi"]
        bitwise = s["bitwise"] and m["bitwise"]
        flag = "True" if bitwise else "False" + "".join(
            f" ({f} ranks {forms[f]['bitwise_failed_ranks']})" for f in FORMS if not forms[f]["bitwise"])
        leak = " LEAK" if (s["host_leak"] or m["host_leak"]) else ""
        out.append(f"{layout:<20} {s['P']:>2} {s['T']:>7} {s['S_local']:>7} {s['fwd_ms']:>9.4f} {s['bwd_ms']:>9.4f} "
                   f"{s['fwdbwd_ms']:>10.4f} {s['local_fwdbwd_ms']:>9.4f} {s['overhead_pct']:>10.2f} "
                   f"{m['overhead_pct']:>8.2f} {s['host_ahead_us'] / 1e3:>8.1f} "
                   f"{_f(max(v for v in (s['host_enqueue_ms'], m['host_enqueue_ms']) if v is not None), '.2f'):>10}"
                   f"{leak} {flag:>8}")
    if any(r["eager_ms"] is not None for r in rows):
        out += ["", f"== eager loop (chain of {args.chain} calls, one backward per step, no sleep; wall ms per call) ==",
                f"{'layout':<20} {'KCP ms':>9} {'local ms':>9} {'overhead %':>10} {'multi KCP':>9} {'multi local':>11} "
                f"{'multi %':>8} {'KCP f+b GB/s':>12}"]
        for layout, forms in by_layout.items():
            s, m = forms["single"], forms["multi"]
            out.append(f"{layout:<20} {_f(s['eager_ms'], '.4f'):>9} {_f(s['local_eager_ms'], '.4f'):>9} "
                       f"{_f(s['eager_overhead_pct'], '.2f'):>10} {_f(m['eager_ms'], '.4f'):>9} "
                       f"{_f(m['local_eager_ms'], '.4f'):>11} {_f(m['eager_overhead_pct'], '.2f'):>8} "
                       f"{_f(s['eager_fwdbwd_gbs'], '.0f'):>12}")
    if any(r["host_chain_us"] is not None for r in rows):
        r0 = next(r for r in rows if r["host_chain_us"] is not None)
        out += ["", f"== host cost per call (T={r0['host_T']}, S_local={r0['host_S_local']}, C={r0['host_C']}, GPU idle; "
                    f"us; ratio = KCP / local single-rank op) ==",
                f"{'layout':<20} {'chain KCP':>9} {'local':>7} {'ratio':>5} {'step KCP':>9} {'local':>7} {'ratio':>5} "
                f"{'multi chain':>11} {'local':>7} {'ratio':>5}"]
        for layout, forms in by_layout.items():
            s, m = forms["single"], forms["multi"]
            out.append(f"{layout:<20} {_f(s['host_chain_us'], '.0f'):>9} {_f(s['local_host_chain_us'], '.0f'):>7} "
                       f"{_f(s['host_chain_ratio'], '.2f'):>5} {_f(s['host_step_us'], '.0f'):>9} "
                       f"{_f(s['local_host_step_us'], '.0f'):>7} {_f(s['host_step_ratio'], '.2f'):>5} "
                       f"{_f(m['host_chain_us'], '.0f'):>11} {_f(m['local_host_chain_us'], '.0f'):>7} "
                       f"{_f(m['host_chain_ratio'], '.2f'):>5}")
    out.append("")
    for layout, forms in by_layout.items():
        s = forms["single"]
        if s["pad_tokens"]:
            out.append(f"# {layout}: padded to {s['doc_lengths']} (+{s['pad_tokens']} tokens, T={s['T']})")
    out.append("# local = cake_causal_conv1d_det on the rank's S_local rows with ctx.local_cu_seqlens (same work, no "
               "exchange); multi: q, k, v in one KCP call vs three local calls; LEAK: the host took > 80% of the "
               "host-ahead window to enqueue an iteration, so host time is in the GPU-time span")
    if env["gpu"] == "cpu":
        out.append("# CPU (gloo, blocking exchange): the times only exercise the pipeline; SPEC 7's targets need the GPUs")
    else:
        s_local = {r["S_local"] for r in rows}
        where = "" if s_local == {TARGET_S_LOCAL} else (
            f" (this run: S_local = {', '.join(str(v) for v in sorted(s_local))}; "
            f"--tokens {TARGET_S_LOCAL * world} gives the targets' shape)")
        singles = [r for r in rows if r["form"] == "single"]
        over = [f"{r['layout']} {r['overhead_pct']:.1f}%" for r in singles if r["overhead_pct"] > TARGET_OVERHEAD_PCT]
        eag = [f"{r['layout']} {r['eager_overhead_pct']:.1f}%" for r in singles
               if r["eager_overhead_pct"] is not None and r["eager_overhead_pct"] > TARGET_EAGER_PCT]
        hst = [f"{r['layout']} {r['host_chain_ratio']:.2f}x" for r in singles
               if r["host_chain_ratio"] is not None and r["host_chain_ratio"] > TARGET_HOST_RATIO]
        out.append(f"# SPEC 7 at S_local = {TARGET_S_LOCAL}, C = 4096{where}: GPU-time overhead <= "
                   f"{TARGET_OVERHEAD_PCT:.0f}%: " + (("over: " + ", ".join(over)) if over else "all within")
                   + f"; eager <= {TARGET_EAGER_PCT:.0f}%: " + (("over: " + ", ".join(eag)) if eag else "all within")
                   + f"; host cost (chain) <= {TARGET_HOST_RATIO:.1f}x: " + (("over: " + ", ".join(hst)) if hst else "all within"))
    out.append(f"# time taken: {elapsed:.1f} s")
    return "\n".join(out)


def write_outputs(rows, env, out_dir, table_text) -> list[str]:
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.join(out_dir, f"{FILE_STEM}_p{env['world_size']}")
    with open(stem + ".jsonl", "w") as f:
        f.write(json.dumps({"kind": "env", **env}) + "\n")
        for r in rows:
            f.write(json.dumps(r) + "\n")
    with open(stem + ".csv", "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        wr.writeheader()
        for r in rows:
            wr.writerow({k: r.get(k) for k in CSV_FIELDS})
    with open(stem + "_table.txt", "w") as f:
        f.write(table_text + "\n")
    paths = [stem + ".jsonl", stem + ".csv", stem + "_table.txt"]
    png = plot(rows, env, stem + ".png")
    return paths + ([png] if png else [])


def plot(rows, env, path) -> str | None:
    """PNG: per layout and form, the KCP overhead over the local op in GPU time and in the eager loop
    (percent; SPEC 7's targets 3% and 5% drawn), and the host-cost ratio (target 1.5x). Returns the
    path, or None when matplotlib is missing (the table and JSON lines carry the same figures)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        log(f"plot skipped: matplotlib did not import ({exc})")
        return None
    panels = [("overhead_pct", "GPU time: KCP / local - 1 (%)", 3.0),
              ("eager_overhead_pct", "eager loop: KCP / local - 1 (%)", 5.0),
              ("host_chain_ratio", "host cost per call: KCP / local (x)", 1.5)]
    forms = sorted({r["form"] for r in rows})
    layouts = list(dict.fromkeys(r["layout"] for r in rows))
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4))
    width = 0.8 / max(1, len(forms))
    for ax, (key, title, target) in zip(axes, panels):
        for j, form in enumerate(forms):
            vals = [next((r.get(key) for r in rows if r["layout"] == lay and r["form"] == form), None) or 0.0
                    for lay in layouts]
            ax.bar([i + j * width for i in range(len(layouts))], vals, width, label=form)
        ax.axhline(target, color="k", linestyle="--", linewidth=1, label=f"target {target:g}")
        ax.set_xticks([i + width * (len(forms) - 1) / 2 for i in range(len(layouts))])
        ax.set_xticklabels(layouts, fontsize=8)
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    r0 = rows[0] if rows else {}
    fig.suptitle(f"KCP vs the local op, slowest rank | {env.get('gpu')} x{env.get('world_size')} "
                 f"({env.get('process_group')}) | T={r0.get('T')} S_local={r0.get('S_local')} C={r0.get('C')} | "
                 f"{str(env.get('date', ''))[:10]}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def replot(jsonl_path: str) -> str | None:
    """Redraw the PNG of a finished run from its JSON lines (beside it)."""
    env, rows = {}, []
    with open(jsonl_path) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                if r.get("kind") == "env":
                    env = r
                elif r.get("kind") == "timing":
                    rows.append(r)
    return plot(rows, env, os.path.splitext(jsonl_path)[0] + ".png")


# --------------------------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------------------------


def run(argv=None) -> list[dict]:
    """Run the benchmark on this rank; returns the timing rows (the same on every rank).

    Initialises torch.distributed when it is not (and destroys it at the end); with a process group
    already initialised (gloo for --dry-run, NCCL otherwise) it runs on the world group and leaves
    it. Rank 0 prints the table and writes the files.

    Raises:
        ValueError: bad options, or no CUDA device without --dry-run.
    """
    args = parse_args(argv)
    t_start = time.perf_counter()
    import torch
    import torch.distributed as dist

    if REPO_ROOT not in sys.path:
        sys.path.insert(0, REPO_ROOT)
    import cakeconv

    device, owns_group = setup_distributed(torch, dist, args.dry_run)
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        coll_device = device if device.type == "cuda" else torch.device("cpu")
        env = environment(torch, dist, device, args.backend, cakeconv)
        if rank == 0:
            log(f"{env['gpu']}  P={world} ({env['process_group']})  torch {env['torch']}  triton {env['triton']}  "
                f"backend {args.backend}  layouts {args.layouts}  C={args.channels}  T={args.tokens}  "
                f"reps {args.reps} (+{args.warmup} warm-up)  chain {args.chain}  eager steps {args.eager_steps}  "
                f"host-cost samples {args.host_steps}")
        timer = Timer(torch, dist, device, flush=not args.no_flush, host_ahead_us=args.host_ahead_us)
        rows = []
        for layout in args.layouts:
            stats_P, failures, lengths, host_T = run_layout(torch, dist, cakeconv, args, layout, device, timer,
                                                            coll_device)
            rows += build_rows(env, args, layout, stats_P, failures, lengths, host_T)
            if device.type == "cuda":
                torch.cuda.empty_cache()
        if rank == 0:
            elapsed = time.perf_counter() - t_start
            text = format_table(rows, env, args, elapsed)
            paths = write_outputs(rows, env, args.out, text)
            print(text, flush=True)
            log(f"wrote {', '.join(paths)}")
        dist.barrier(**({"device_ids": [device.index]} if device.type == "cuda" else {}))
        return rows
    finally:
        if owns_group:
            dist.destroy_process_group()


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--replot"]:  # --replot RUN.jsonl: the PNG of a finished run, no GPU needed
        if len(argv) != 2:
            raise ValueError("usage: bench_cake_causal_conv1d_det_kcp.py --replot RUN.jsonl")
        print(replot(argv[1]))
        return 0
    rows = run(argv)
    return 0 if all(r["bitwise"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
