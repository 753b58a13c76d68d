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

Workload (kcp_workload.py): a packed batch of T = 65,536 tokens in 3 documents of 15,945,
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

Output (rank 0, kcp_report.py): progress lines on stderr; the table on stdout, also written to
``<stem>_table.txt``; ``<stem>.jsonl`` (one ``env`` line, then one ``timing`` row per (layout, P, form),
form = single | multi, with GPU name or 'cpu', torch/triton/cakeconv versions, UTC date, commit,
backend, per-rank medians, bytes, padding, eager and host-cost figures), ``<stem>.csv`` (the timing
rows) and ``<stem>.png`` under ``--out`` (default benchmarks/results); the stem is ``--name``
(default ``bench_cake_causal_conv1d_det_kcp_p{P}``). The exit status is 1 if any rank's bitwise
check failed.

The timing protocol (marks, L2 eviction by reading, host-ahead sleep, eager-loop forms, interleaved
wall-clock samples) is the single-rank benchmark's: benchmarks/timing.py.

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
import os
import statistics
import sys
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
if BENCH_DIR not in sys.path:  # the modules beside this file (the tests import this file by path)
    sys.path.insert(0, BENCH_DIR)

from environment import REPO_ROOT, run_environment  # noqa: E402
from kcp_report import build_rows, format_table, replot, write_outputs  # noqa: E402
from kcp_workload import (FORMS, LAYOUTS, NUM_MULTI, PASS_LABEL, PASSES, SEED_TOKENS, SUBJECTS,  # noqa: E402
                          cu_from_lengths, padded_doc_lengths, scaled_doc_lengths)
from progress import log as _log  # noqa: E402
from random_inputs import activations, bias, generator, taps  # noqa: E402
from timing import HOST_AHEAD_MIN_US, DeviceClock, auto_ahead_us, eager_forms, rotation, wall_samples  # noqa: E402

# NVLink multicast stays off (set before torch.distributed is initialised; see the docstring).
NVLS_OFF_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
DEFAULTS = {"tokens": SEED_TOKENS, "channels": 4096, "reps": 20, "warmup": 3, "backend": "auto", "chain": 16,
            "eager_steps": 10, "host_steps": 15, "host_calls": 16, "host_channels": 256, "host_tokens_per_rank": 4096}
DRY_DEFAULTS = {"tokens": 4096, "channels": 64, "reps": 2, "warmup": 1, "backend": "reference", "chain": 4,
                "eager_steps": 2, "host_steps": 2, "host_calls": 2, "host_channels": 16, "host_tokens_per_rank": 128}
HOST_AHEAD_MAX_US = 500000.0


def log(msg: str) -> None:
    _log(f"[kcp bench] {msg}")


# --------------------------------------------------------------------------------------------------------------
# Arguments
# --------------------------------------------------------------------------------------------------------------

def parse_args(argv=None) -> argparse.Namespace:
    """The options, validated (raises ValueError on a bad one)."""
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
    p.add_argument("--name", default=None,
                   help="stem of the files written (default bench_cake_causal_conv1d_det_kcp_p{P}; e.g. h200x2_kcp)")
    return _checked(p.parse_args(argv))


def _checked(args) -> argparse.Namespace:
    """args with the defaults of the run (--dry-run's or the GPU's) filled in, validated.

    Raises:
        ValueError: a bad option.
    """

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
    if args.name is not None and (not args.name or os.sep in args.name):
        raise ValueError(f"--name must be a file stem (no folder), got {args.name!r}")
    scaled_doc_lengths(args.tokens)  # validates --tokens
    return args


# --------------------------------------------------------------------------------------------------------------
# Process group, device, environment
# --------------------------------------------------------------------------------------------------------------


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
    """The run's env line: environment.run_environment, cakeconv's version, the process group, NCCL."""
    env = run_environment(torch, device, "cpu")
    env.update({
        "cakeconv": getattr(cakeconv, "__version__", None),
        "backend": backend,
        "world_size": dist.get_world_size(),
        "process_group": str(dist.get_backend()),
        **{k: os.environ.get(k) for k in NVLS_OFF_ENV},
    })
    env["nccl"] = None
    if device.type == "cuda":
        nccl_version = torch.cuda.nccl.version()  # a tuple in recent torch, an int in older ones
        env["nccl"] = ".".join(str(v) for v in nccl_version) if isinstance(nccl_version, tuple) else str(nccl_version)
    return env


# --------------------------------------------------------------------------------------------------------------
# Timing (the protocol of timing.py, across ranks)
# --------------------------------------------------------------------------------------------------------------


class RankClock(DeviceClock):
    """timing.DeviceClock across ranks: the ranks meet before each timed iteration; the host-ahead window."""

    def __init__(self, torch, dist, device, flush: bool, host_ahead_us: float):
        super().__init__(torch, device, flush)
        self.dist = dist
        self.host_ahead_us = 0.0
        self.set_host_ahead(host_ahead_us)

    def set_host_ahead(self, us: float) -> None:
        """The GPU sleep before each timed iteration (CUDA only)."""
        self.host_ahead_us = float(us) if (self.can_sleep and us > 0) else 0.0

    def barrier(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()
            self.dist.barrier(device_ids=[self.device.index])
            self.torch.cuda.synchronize()
        else:
            self.dist.barrier()

    def align(self) -> None:
        """Idle device, all ranks released together, then the host-ahead sleep and the L2 eviction."""
        self.barrier()
        self.before_call(self.host_ahead_us)


def make_step(torch, forward, leaves, dys):
    """One iteration: forward through autograd, then backward(dys).

    Returns fn(clock) -> (m0, m1, m2, host_ms): the three marks and the host time to enqueue the iteration.
    """

    def step(clock):
        for t in leaves:
            t.grad = None
        clock.align()
        m0 = clock.mark()
        t0 = time.perf_counter()
        ys = forward()
        m1 = clock.mark()
        torch.autograd.backward(ys, dys)
        host_ms = (time.perf_counter() - t0) * 1e3
        m2 = clock.mark()
        return m0, m1, m2, host_ms

    return step


def _all_max(torch, dist, value: float, coll_device) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=coll_device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())



def time_subjects(torch, dist, steps: dict, clock: RankClock, reps: int, warmup: int, auto_ahead: bool, coll_device):
    """Median ms per (subject, pass) of this rank, and the median host ms per subject.

    Subjects interleaved, their order rotating each round. With auto_ahead (CUDA), after the warm-up one more
    iteration of every subject measures its host time and the sleep becomes 3x the largest over subjects and
    ranks (at least 1 ms), so the host time of a call does not leak into its span.
    """
    names = list(steps)
    samples = {(n, p): [] for n in names for p in PASSES}
    host = {n: [] for n in names}
    for r in range(warmup):
        for name in rotation(names, r):
            steps[name](clock)
        clock.sync()
    if auto_ahead and clock.cuda:
        clock.set_host_ahead(HOST_AHEAD_MAX_US / 10)  # keep the GPU away from the host while measuring it
        host_max = max(steps[name](clock)[3] for name in names)
        clock.sync()
        host_max = _all_max(torch, dist, host_max, coll_device)
        clock.set_host_ahead(auto_ahead_us(host_max, HOST_AHEAD_MIN_US, HOST_AHEAD_MAX_US))
    for r in range(reps):
        marks = [(name, steps[name](clock)) for name in rotation(names, r)]
        clock.sync()
        for name, (m0, m1, m2, host_ms) in marks:
            samples[(name, "fwd")].append(clock.elapsed_ms(m0, m1))
            samples[(name, "bwd")].append(clock.elapsed_ms(m1, m2))
            samples[(name, "fwdbwd")].append(clock.elapsed_ms(m0, m2))
            host[name].append(host_ms)
    return ({key: statistics.median(v) for key, v in samples.items()},
            {n: statistics.median(v) for n, v in host.items()})


def wall_medians(subjects: dict, clock: RankClock, samples: int, warmup: int) -> dict:
    """Median wall ms per call of each subject {name: (fn, calls)} (timing.wall_samples): before each sample
    the ranks meet in a barrier with the device idle; fn() runs between it and a synchronisation."""
    out = wall_samples(subjects, samples, warmup, clock.barrier, clock.sync)
    return {n: statistics.median(v) for n, v in out.items()}


def eager_subjects(torch, ops: dict, xs_SC, dys_SC, params_by_call, chain: int, mode: str, calls_per_sample: int):
    """{subject: (fn, calls)} of one eager-loop form (timing.eager_forms): ``chain``, or ``step``
    (``calls_per_sample`` steps of one call + its backward).

    ops: {subject: (op(inputs, i) -> outputs, n_tensors)}; the op gets a list of n_tensors inputs and
    returns a list of n_tensors outputs, with the taps/biases of call i; params_by_call(subject, i): those
    taps and biases (leaves whose gradients each step resets).
    """
    out = {}
    for name, (op, n) in ops.items():
        leaves = [x.detach().requires_grad_(True) for x in xs_SC[:n]]  # own leaves, shared storage
        params = leaves + [t for i in range(chain) for t in params_by_call(name, i)]
        out[name] = eager_forms(torch, op, leaves, dys_SC[:n], params, chain, calls_per_sample, (mode,))[mode]
    return out


# --------------------------------------------------------------------------------------------------------------
# One layout
# --------------------------------------------------------------------------------------------------------------


def global_inputs(torch, T: int, C: int, device, seed: int, count: int):
    """``count`` tensors (x_TC, dy_TC, w_C4, b_C), the same on every rank (same seed, same device type)."""
    gen = generator(torch, device, seed)
    out = []
    for _ in range(count):
        x_TC = activations(torch, gen, T, C, device)
        dy_TC = activations(torch, gen, T, C, device)
        w_C4 = taps(torch, gen, C, device)
        out.append((x_TC, dy_TC, w_C4, bias(torch, gen, C, device)))
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
    gen = generator(torch, device, seed + 7)
    base = [[(taps(torch, gen, C, device), bias(torch, gen, C, device)) for _ in range(NUM_MULTI)]
            for _ in range(chain)]
    leaves = {}
    for name in SUBJECTS:
        n = 1 if name in ("kcp", "local") else NUM_MULTI
        leaves[name] = [[(w.clone().requires_grad_(True), b.clone().requires_grad_(True)) for w, b in base[i][:n]]
                        for i in range(chain)]
    return lambda name, i: leaves[name][i]

def check_layout(torch, dist, cakeconv, ctx, inputs, cu_N1, backend, coll_device, layout) -> dict:
    """{form: ranks whose KCP y/dx are not bitwise the single-rank op's}: the same verdict on every rank."""
    rank, world = dist.get_rank(), dist.get_world_size()
    ok = check_bitwise(torch, cakeconv, ctx, inputs, cu_N1, backend)
    flags_K = torch.tensor([0 if ok[f] else 1 for f in FORMS], dtype=torch.int64, device=coll_device)
    gathered = [torch.empty_like(flags_K) for _ in range(world)]
    dist.all_gather(gathered, flags_K)
    for f in FORMS:
        if not ok[f]:
            log(f"rank {rank}: {layout} {f}: KCP y/dx NOT bitwise equal to the single-rank op")
    return {f: [r for r in range(world) if int(gathered[r][i]) != 0] for i, f in enumerate(FORMS)}


def gpu_time_stats(torch, dist, cakeconv, args, ctx, operands, clock, coll_device) -> dict:
    """This rank's GPU-time medians of the four subjects (``{subject}_{pass}``, ``{subject}_host_ms``) and
    its exchange statistics. operands: this rank's rows, dy, taps and biases (leaves), one per tensor."""
    xs_SC, dys_SC, ws_C4, bs_C = operands
    x_SC, dy_SC, w_C4, b_C = xs_SC[0], dys_SC[0], ws_C4[0], bs_C[0]
    kcp, kcp_multi = cakeconv.cake_causal_conv1d_det_kcp, cakeconv.cake_causal_conv1d_det_multi_kcp
    local, local_cu, backend = cakeconv.cake_causal_conv1d_det, local_cu_seqlens(ctx), args.backend
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
    clock.set_host_ahead(args.host_ahead_us)
    med, host_med = time_subjects(torch, dist, steps, clock, args.reps, args.warmup, args.host_ahead_auto, coll_device)
    stats = {"S": float(ctx.num_local_tokens), "segments": float(num_segments(ctx)),
             "hist_rows": float(remote_rows(ctx, "hist")), "fut_rows": float(remote_rows(ctx, "fut")),
             "host_ahead_us": clock.host_ahead_us}
    for n in SUBJECTS:
        for p in PASSES:
            stats[f"{n}_{p}"] = med[(n, p)]
        stats[f"{n}_host_ms"] = host_med[n]
    return stats


def eager_stats(torch, cakeconv, args, ctx, xs_SC, dys_SC, device, clock) -> dict:
    """This rank's eager-loop medians (``{subject}_eager_ms``): the chain at the layout's shape, no sleep."""
    if args.eager_steps <= 0:
        return {}
    taps = chain_taps(torch, args.channels, device, args.seed, args.chain)
    subj = eager_subjects(torch, subject_ops(cakeconv, ctx, args.backend, taps), xs_SC, dys_SC,
                          lambda name, i: [t for wb in taps(name, i) for t in wb], args.chain, "chain", 1)
    eager = wall_medians(subj, clock, args.eager_steps, 0 if args.dry_run else 1)
    return {f"{n}_eager_ms": eager[n] for n in SUBJECTS}


def host_cost_stats(torch, cakeconv, args, layout, device, clock) -> tuple[dict, int | None]:
    """This rank's host cost per call (``{subject}_host_{chain|step}_ms``) at the tiny shape, its own context,
    and that shape's T (None when off)."""
    if args.host_steps <= 0:
        return {}, None
    world = clock.dist.get_world_size()
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
    ops = subject_ops(cakeconv, h_ctx, args.backend, taps)

    def flat(name, i):
        return [t for wb in taps(name, i) for t in wb]

    subj = {}
    for mode in ("chain", "step"):
        for n, fn_calls in eager_subjects(torch, ops, h_xs, h_dys, flat, args.chain, mode, args.host_calls).items():
            subj[f"{n}|{mode}"] = fn_calls
    # untimed rounds first compile the kernels of this shape
    host = wall_medians(subj, clock, args.host_steps, 0 if args.dry_run else 3)
    stats = {f"{key.split('|')[0]}_host_{key.split('|')[1]}_ms": v for key, v in host.items()}
    stats["host_S_local"] = float(int(h_ctx.num_local_tokens))
    return stats, host_T


def gather_stats(torch, dist, stats: dict, coll_device) -> list[dict]:
    """Every rank's statistics (the same keys on every rank), in rank order."""
    keys = sorted(stats)
    mine_K = torch.tensor([stats[k] for k in keys], dtype=torch.float64, device=coll_device)
    gathered = [torch.empty_like(mine_K) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, mine_K)
    return [dict(zip(keys, g.cpu().tolist())) for g in gathered]


def run_layout(torch, dist, cakeconv, args, layout, device, clock, coll_device):
    """Check and time one layout; returns (per-rank stats as dicts, failures by rank, doc lengths, host T)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    C = args.channels
    lengths = padded_doc_lengths(scaled_doc_lengths(args.tokens), layout, world)
    cu_list = cu_from_lengths(lengths)
    cu_N1 = torch.tensor(cu_list, dtype=torch.int32, device=device)
    ctx = cakeconv.build_kcp_context(cu_N1, layout=layout, device=device)
    if rank == 0:
        log(f"{layout}: P={world} T={cu_list[-1]} docs {lengths} S_local={int(ctx.num_local_tokens)} C={C} "
            f"(multi: {NUM_MULTI} x {C}): checking")
    inputs = global_inputs(torch, cu_list[-1], C, device, args.seed, NUM_MULTI)
    failures = check_layout(torch, dist, cakeconv, ctx, inputs, cu_N1, args.backend, coll_device, layout)
    # Timing operands: this rank's rows (leaves), the taps and biases as leaves too.
    operands = ([shard(ctx, t[0]).detach().requires_grad_(True) for t in inputs],
                [shard(ctx, t[1]).contiguous() for t in inputs],
                [t[2].detach().clone().requires_grad_(True) for t in inputs],
                [t[3].detach().clone().requires_grad_(True) for t in inputs])
    del inputs
    t0 = time.perf_counter()
    stats = gpu_time_stats(torch, dist, cakeconv, args, ctx, operands, clock, coll_device)
    t1 = time.perf_counter()
    stats.update(eager_stats(torch, cakeconv, args, ctx, operands[0], operands[1], device, clock))
    t2 = time.perf_counter()
    operands = None  # free before the host cost
    if device.type == "cuda":
        torch.cuda.empty_cache()
    host, host_T = host_cost_stats(torch, cakeconv, args, layout, device, clock)
    stats.update(host)
    t3 = time.perf_counter()
    stats_P = gather_stats(torch, dist, stats, coll_device)
    if rank == 0:
        slow = {n: max(s[f"{n}_fwdbwd"] for s in stats_P) for n in SUBJECTS}
        log(f"{layout}: GPU time {t1 - t0:.1f}s (host ahead {max(s['host_ahead_us'] for s in stats_P) / 1e3:.1f} ms), "
            f"eager {t2 - t1:.1f}s, host cost {t3 - t2:.1f}s  "
            + "  ".join(f"{n}:{PASS_LABEL['fwdbwd']}={slow[n]:.3f}ms" for n in SUBJECTS))
    return stats_P, failures, lengths, host_T


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
        clock = RankClock(torch, dist, device, flush=not args.no_flush, host_ahead_us=args.host_ahead_us)
        rows = []
        for layout in args.layouts:
            stats_P, failures, lengths, host_T = run_layout(torch, dist, cakeconv, args, layout, device, clock,
                                                            coll_device)
            rows += build_rows(env, args, layout, stats_P, failures, lengths, host_T)
            if device.type == "cuda":
                torch.cuda.empty_cache()
        if rank == 0:
            elapsed = time.perf_counter() - t_start
            text = format_table(rows, env, args, elapsed)
            paths = write_outputs(rows, env, args.out, text, args.name)
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
