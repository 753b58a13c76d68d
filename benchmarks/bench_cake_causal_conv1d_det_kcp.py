#!/usr/bin/env python3
"""Benchmark of cakeconv's context-parallel (KCP) causal conv1d + SiLU: halo overhead per layout.

Launch from the repository root, one process per GPU:

    torchrun --nproc-per-node P benchmarks/bench_cake_causal_conv1d_det_kcp.py [--out DIR]
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
its 5% target at S_local = 65,536, i.e. ``--tokens $((65536 * P))``; the default (the seed's
workload) gives S_local = 65,536 / P.

Protocol, per layout:

1. Correctness first, on EVERY rank: the rank computes the single-rank op ``cake_causal_conv1d_det``
   on the whole global batch (same seed on every rank, so every rank holds the same global x),
   indexes its y and dx with ``ctx.local_token_indices`` and compares them with ``torch.equal`` to
   the KCP op's y and dx (forward through autograd, ``y.backward(dy_local)``); the same for each of
   q, k, v of the multi form. The per-rank failure flags are all-gathered, so every rank reports
   the same verdict (``bitwise``), and ranks that failed are named.
2. Timing: four subjects, interleaved round by round (the order rotates): the KCP op, the local
   op, the KCP multi op and the local multi op (three single-rank calls). The local op is
   ``cake_causal_conv1d_det`` on the rank's own [S_local, C] rows with ``ctx.local_cu_seqlens`` (each
   local segment treated as a document start): the same arithmetic on the same rows, without the
   exchange and the boundary-row rewrite. One iteration = the forward through autograd, then
   ``backward(dy_local)``; three marks give fwd, bwd and fwd+bwd. Gradients are reset to None
   outside the span, so no accumulation kernel is timed.
   On CUDA the marks are CUDA events; before each iteration every rank synchronises, the ranks meet
   in a barrier, a 256 MiB read evicts the L2 (``--no-flush``: off) and ``torch.cuda._sleep`` holds
   the GPU for ``--host-ahead-us`` so the host enqueues the whole iteration ahead of the GPU (launch
   overhead hidden as in a training step, a host sync inside the call still shows). On the CPU the
   marks are ``time.perf_counter``.
3. Each rank takes the median of ``--reps`` iterations after ``--warmup`` dropped ones; the medians
   are all-gathered and the SLOWEST rank counts (the max over ranks of each median; the per-rank
   medians are in the JSON rows).

Definitions (per rank, bf16 x; the multi form sums the channels of q, k and v):

* floor bytes: fwd reads x and writes y, 4 * S_local * C; bwd reads x and dy and writes dx,
  6 * S_local * C; fwd+bwd 10 * S_local * C. GB/s = floor bytes / slowest-rank median time.
* halo bytes: what the rank receives from other ranks per fwd+bwd: the history rows (3 x rows of
  bf16 before each local segment that continues a document held elsewhere), hist_rows * C * 2, plus
  the future rows (FP32 g rows after each segment that a later fragment continues),
  fut_rows * C * 4. Rows a rank copies from its own fragments are not counted.
* halo overhead = (KCP fwd+bwd - local fwd+bwd) / local fwd+bwd, in %, both slowest-rank medians;
  the multi overhead compares the multi KCP call with the three local calls. SPEC section 7: at
  most 5% at S_local = 65,536, C = 4,096 (the exchange overlapped with interior work).

Output (rank 0): progress lines on stderr; the table on stdout (layout, P, T, S_local, fwd ms,
bwd ms, fwd+bwd ms, local fwd+bwd ms, overhead %, multi overhead %, bitwise), also written to
``bench_cake_causal_conv1d_det_kcp_p{P}_table.txt``; ``..._p{P}.jsonl`` (one ``env`` line, then one
``timing`` row per (layout, P, form), form = single | multi, with GPU name or 'cpu', torch/triton
/cakeconv versions, UTC date, backend, per-rank medians, bytes, padding) and ``..._p{P}.csv`` (the
timing rows) under ``--out`` (default benchmarks/results). The exit status is 1 if any rank's
bitwise check failed.

``--dry-run``: T = 4,096 in 3 documents scaled down proportionally (997, 1,365, 1,734), C = 64,
backend ``reference`` on the CPU over gloo, 2 reps after 1 warm-up: it exercises the whole pipeline
(layouts, padding, bitwise check on every rank, gathers, files) and is what CI runs
(tests/kcp/test_kcp_bench_dry.py); its times mean nothing.

What only a multi-GPU machine can show: the real cost of the halo exchange (NCCL point-to-point
over NVLink) and whether the Triton path hides it behind the interior kernels (on gloo the
exchange blocks and the reference backend does not overlap); the skew between ranks that the
slowest-rank rule exposes (the zigzag layouts exist to balance it); and therefore whether the
5% target is met. The CPU numbers say nothing about any of these.

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
TARGET_OVERHEAD_PCT = 5.0  # SPEC section 7, at S_local = 65,536, C = 4,096
TARGET_S_LOCAL = 65536
DEFAULTS = {"tokens": SEED_TOKENS, "channels": 4096, "reps": 20, "warmup": 3, "backend": "auto"}
DRY_DEFAULTS = {"tokens": 4096, "channels": 64, "reps": 2, "warmup": 1, "backend": "reference"}
FILE_STEM = "bench_cake_causal_conv1d_det_kcp"
SUBJECTS = ("kcp", "local", "kcp_multi", "local_multi")


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
        "per layout (run under torchrun, one process per GPU).",
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
    p.add_argument("--host-ahead-us", type=float, default=1000.0,
                   help="GPU sleep before each timed iteration so the host enqueues it ahead (0: off)")
    p.add_argument("--no-flush", action="store_true", help="no L2 eviction read before each timed iteration")
    p.add_argument("--dry-run", action="store_true",
                   help="tiny shapes on the CPU over gloo, backend='reference' (what CI runs)")
    p.add_argument("--out", default=os.path.join(REPO_ROOT, "benchmarks", "results"), help="output folder")
    args = p.parse_args(argv)

    defaults = DRY_DEFAULTS if args.dry_run else DEFAULTS
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    layouts = [s.strip() for s in args.layouts.split(",") if s.strip()]
    unknown = [s for s in layouts if s not in LAYOUTS]
    if unknown or not layouts:
        raise ValueError(f"--layouts must be a comma list among {', '.join(LAYOUTS)}, got {args.layouts!r}")
    args.layouts = list(dict.fromkeys(layouts))
    if args.channels <= 0 or args.channels % 8 != 0:
        raise ValueError(f"--channels must be a positive multiple of 8, got {args.channels}")
    if args.reps < 1:
        raise ValueError(f"--reps must be >= 1, got {args.reps}")
    if args.warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {args.warmup}")
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
        if self.cuda:
            if flush:
                self.flush_buf = torch.empty(256 * 2**20 // 4, dtype=torch.float32, device=device).normal_()
            if host_ahead_us > 0 and hasattr(torch.cuda, "_sleep"):
                self.sleep_cycles = int(host_ahead_us * 2000)  # ~2 GHz SM clock

    def align(self) -> None:
        """Idle device, all ranks released together, cold L2, then the host-ahead sleep."""
        if self.cuda:
            self.torch.cuda.synchronize()
            self.dist.barrier(device_ids=[self.device.index])
            self.torch.cuda.synchronize()
            if self.flush_buf is not None:
                self.flush_buf.sum()
            if self.sleep_cycles:
                self.torch.cuda._sleep(self.sleep_cycles)
        else:
            self.dist.barrier()

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
    """One iteration: forward through autograd, then backward(dys). Returns fn(timer) -> (m0, m1, m2)."""

    def step(timer):
        for t in leaves:
            t.grad = None
        timer.align()
        m0 = timer.mark()
        ys = forward()
        m1 = timer.mark()
        torch.autograd.backward(ys, dys)
        m2 = timer.mark()
        return m0, m1, m2

    return step


def time_subjects(steps: dict, timer: Timer, reps: int, warmup: int) -> dict:
    """Median ms per (subject, pass) of this rank; subjects interleaved, their order rotating each round."""
    names = list(steps)
    samples = {(n, p): [] for n in names for p in PASSES}
    for r in range(warmup + reps):
        k = r % len(names)
        marks = []
        for name in names[k:] + names[:k]:
            marks.append((name, steps[name](timer)))
        timer.sync()
        if r < warmup:
            continue
        for name, (m0, m1, m2) in marks:
            samples[(name, "fwd")].append(timer.elapsed_ms(m0, m1))
            samples[(name, "bwd")].append(timer.elapsed_ms(m1, m2))
            samples[(name, "fwdbwd")].append(timer.elapsed_ms(m0, m2))
    return {key: statistics.median(v) for key, v in samples.items()}


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


def single_rank_reference(torch, cakeconv, x_TC, dy_TC, w_C4, b_C, cu_N1, index_S, backend):
    """(y, dx) of the single-rank op on the whole global batch, at this rank's tokens."""
    x_leaf = x_TC.detach().clone().requires_grad_(True)
    y_TC = cakeconv.cake_causal_conv1d_det(x_leaf, w_C4, b_C, cu_seqlens=cu_N1, backend=backend)
    y_TC.backward(dy_TC)
    return y_TC.detach().index_select(0, index_S), x_leaf.grad.index_select(0, index_S)


def check_bitwise(torch, cakeconv, ctx, inputs, cu_N1, backend) -> dict:
    """This rank's verdict per form: KCP y and dx bitwise the single-rank op's at the local tokens."""
    index_S = ctx.local_token_indices
    ok = {}
    # single form: the first tensor
    x_TC, dy_TC, w_C4, b_C = inputs[0]
    y_ref_SC, dx_ref_SC = single_rank_reference(torch, cakeconv, x_TC, dy_TC, w_C4, b_C, cu_N1, index_S, backend)
    x_SC = ctx.shard(x_TC).requires_grad_(True)
    y_SC = cakeconv.cake_causal_conv1d_det_kcp(x_SC, w_C4, ctx, bias=b_C, backend=backend)
    y_SC.backward(ctx.shard(dy_TC))
    ok["single"] = bool(torch.equal(y_SC.detach(), y_ref_SC)) and bool(torch.equal(x_SC.grad, dx_ref_SC))
    del y_ref_SC, dx_ref_SC, x_SC, y_SC
    # multi form: q, k, v in one call, each against its own single-rank reference
    xs = [ctx.shard(t[0]).requires_grad_(True) for t in inputs]
    ys = cakeconv.cake_causal_conv1d_det_multi_kcp(xs, [t[2] for t in inputs], ctx,
                                                   biases=[t[3] for t in inputs], backend=backend)
    torch.autograd.backward(ys, [ctx.shard(t[1]) for t in inputs])
    good = True
    for (x_TC, dy_TC, w_C4, b_C), x_SC, y_SC in zip(inputs, xs, ys):
        y_ref_SC, dx_ref_SC = single_rank_reference(torch, cakeconv, x_TC, dy_TC, w_C4, b_C, cu_N1, index_S, backend)
        good = good and bool(torch.equal(y_SC.detach(), y_ref_SC)) and bool(torch.equal(x_SC.grad, dx_ref_SC))
    ok["multi"] = good
    return ok


def remote_rows(spec) -> int:
    """Rows this rank receives from other ranks in one exchange (self copies excluded)."""
    return sum(int(t.numel()) for t in spec.recv_slot.values())


def run_layout(torch, dist, cakeconv, args, layout, device, timer, coll_device):
    """Check and time one layout; returns (per-rank stats [P, K] as lists, failures by rank, doc lengths)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    C, backend = args.channels, args.backend
    lengths = padded_doc_lengths(scaled_doc_lengths(args.tokens), layout, world)
    cu_list = cu_from_lengths(lengths)
    T = cu_list[-1]
    cu_N1 = torch.tensor(cu_list, dtype=torch.int32, device=device)
    ctx = cakeconv.build_kcp_context(cu_N1, layout=layout, device=device)
    S = ctx.num_local_tokens
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

    # Timing operands: this rank's rows (leaves), the taps and biases as leaves too.
    local_cu = ctx.local_cu_seqlens
    xs_SC = [ctx.shard(t[0]).detach().requires_grad_(True) for t in inputs]
    dys_SC = [ctx.shard(t[1]).contiguous() for t in inputs]
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
    med = time_subjects(steps, timer, args.reps, args.warmup)
    stats_K = [float(S), float(ctx.num_segments), float(remote_rows(ctx.hist_exchange)),
               float(remote_rows(ctx.fut_exchange))]
    stats_K += [med[(n, p)] for n in SUBJECTS for p in PASSES]
    mine_K = torch.tensor(stats_K, dtype=torch.float64, device=coll_device)
    gathered = [torch.empty_like(mine_K) for _ in range(world)]
    dist.all_gather(gathered, mine_K)
    stats_PK = [g.cpu().tolist() for g in gathered]
    if rank == 0:
        slow = {(n, p): max(s[4 + i] for s in stats_PK) for i, (n, p) in enumerate((n, p) for n in SUBJECTS for p in PASSES)}
        log(f"{layout}: {time.perf_counter() - t0:.1f}s  "
            + "  ".join(f"{n}:{PASS_LABEL['fwdbwd']}={slow[(n, 'fwdbwd')]:.3f}ms" for n in SUBJECTS))
    return stats_PK, failures, lengths


# --------------------------------------------------------------------------------------------------------------
# Rows, table, files
# --------------------------------------------------------------------------------------------------------------


def build_rows(env, args, layout, stats_PK, failures, lengths) -> list[dict]:
    world = len(stats_PK)
    col = {(n, p): 4 + i for i, (n, p) in enumerate((n, p) for n in SUBJECTS for p in PASSES)}
    by_rank = lambda key: [s[col[key]] for s in stats_PK]  # noqa: E731
    base = scaled_doc_lengths(args.tokens)
    S = int(stats_PK[0][0])
    rows = []
    for form in FORMS:
        kcp_name, local_name = ("kcp", "local") if form == "single" else ("kcp_multi", "local_multi")
        n_tensors = 1 if form == "single" else NUM_MULTI
        c_total = args.channels * n_tensors
        ms = {p: max(by_rank((kcp_name, p))) for p in PASSES}
        local_ms = {p: max(by_rank((local_name, p))) for p in PASSES}
        per_rank_overhead = [100.0 * (k - loc) / loc for k, loc in
                             zip(by_rank((kcp_name, "fwdbwd")), by_rank((local_name, "fwdbwd")))]
        halo_bytes_P = [s[2] * c_total * 2 + s[3] * c_total * 4 for s in stats_PK]
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
            "S_local_by_rank": [int(s[0]) for s in stats_PK],
            "segments_by_rank": [int(s[1]) for s in stats_PK],
            "hist_rows_by_rank": [int(s[2]) for s in stats_PK],
            "fut_rows_by_rank": [int(s[3]) for s in stats_PK],
            "halo_bytes_max": max(halo_bytes_P),
            "fwd_ms": ms["fwd"],
            "bwd_ms": ms["bwd"],
            "fwdbwd_ms": ms["fwdbwd"],
            "local_fwd_ms": local_ms["fwd"],
            "local_bwd_ms": local_ms["bwd"],
            "local_fwdbwd_ms": local_ms["fwdbwd"],
            "overhead_pct": 100.0 * (ms["fwdbwd"] - local_ms["fwdbwd"]) / local_ms["fwdbwd"],
            "overhead_pct_max_rank": max(per_rank_overhead),
            "fwdbwd_ms_by_rank": by_rank((kcp_name, "fwdbwd")),
            "local_fwdbwd_ms_by_rank": by_rank((local_name, "fwdbwd")),
            "fwd_gbs": FLOOR_FACTOR["fwd"] * S * c_total / (ms["fwd"] * 1e-3) / 1e9,
            "bwd_gbs": FLOOR_FACTOR["bwd"] * S * c_total / (ms["bwd"] * 1e-3) / 1e9,
            "fwdbwd_gbs": FLOOR_FACTOR["fwdbwd"] * S * c_total / (ms["fwdbwd"] * 1e-3) / 1e9,
            "bitwise": not failures[form],
            "bitwise_failed_ranks": failures[form],
            "reps": args.reps,
            "warmup": args.warmup,
            "host_ahead_us": args.host_ahead_us if env["gpu"] != "cpu" else 0.0,
            "l2_flush": (not args.no_flush) and env["gpu"] != "cpu",
            "dry_run": args.dry_run,
        }
        rows.append(row)
    return rows


CSV_FIELDS = ["date", "gpu", "torch", "triton", "cakeconv", "backend", "layout", "P", "form", "num_tensors", "C",
              "T", "pad_tokens", "S_local", "fwd_ms", "bwd_ms", "fwdbwd_ms", "local_fwd_ms", "local_bwd_ms",
              "local_fwdbwd_ms", "overhead_pct", "overhead_pct_max_rank", "fwd_gbs", "bwd_gbs", "fwdbwd_gbs",
              "halo_bytes_max", "bitwise", "reps", "warmup", "dry_run"]


def format_table(rows, env, args, elapsed) -> str:
    world = env["world_size"]
    out = [
        f"# KCP causal conv1d + SiLU | {env['gpu']} | P={world} ({env['process_group']}) | torch {env['torch']} | "
        f"triton {env['triton']} | cakeconv {env['cakeconv']} ({env['backend']}) | {env['date']}",
        f"# seed workload: 3 documents {scaled_doc_lengths(args.tokens)} (T={args.tokens}), C={args.channels} "
        f"(multi: q, k, v of {args.channels}), bf16 x/dy, fp32 taps+bias; median of {args.reps} after "
        f"{args.warmup} warm-up; slowest rank",
        "",
        f"{'layout':<20} {'P':>2} {'T':>7} {'S_local':>7} {'fwd ms':>9} {'bwd ms':>9} {'fwd+bwd ms':>10} "
        f"{'local fwd+bwd ms':>16} {'overhead %':>10} {'multi overhead %':>16} {'bitwise':>8}",
    ]
    by_layout = {}
    for r in rows:
        by_layout.setdefault(r["layout"], {})[r["form"]] = r
    for layout, forms in by_layout.items():
        s, m = forms["single"], forms["multi"]
        bitwise = s["bitwise"] and m["bitwise"]
        flag = "True" if bitwise else "False" + "".join(
            f" ({f} ranks {forms[f]['bitwise_failed_ranks']})" for f in FORMS if not forms[f]["bitwise"])
        out.append(f"{layout:<20} {s['P']:>2} {s['T']:>7} {s['S_local']:>7} {s['fwd_ms']:>9.4f} {s['bwd_ms']:>9.4f} "
                   f"{s['fwdbwd_ms']:>10.4f} {s['local_fwdbwd_ms']:>16.4f} {s['overhead_pct']:>10.2f} "
                   f"{m['overhead_pct']:>16.2f} {flag:>8}")
    out.append("")
    for layout, forms in by_layout.items():
        s = forms["single"]
        if s["pad_tokens"]:
            out.append(f"# {layout}: padded to {s['doc_lengths']} (+{s['pad_tokens']} tokens, T={s['T']})")
    out.append("# overhead = (KCP fwd+bwd - local fwd+bwd) / local fwd+bwd; local = cake_causal_conv1d_det on the "
               "rank's S_local rows with ctx.local_cu_seqlens (same work, no exchange); multi: q, k, v in one KCP call "
               "vs three local calls")
    if env["gpu"] == "cpu":
        out.append("# CPU (gloo, blocking exchange): the times only exercise the pipeline; the overhead that SPEC 7 "
                   "bounds needs the GPUs")
    else:
        s_local = {r["S_local"] for r in rows}
        where = "" if s_local == {TARGET_S_LOCAL} else (
            f" (this run: S_local = {', '.join(str(v) for v in sorted(s_local))}; "
            f"--tokens {TARGET_S_LOCAL * world} gives the target's shape)")
        over = [f"{r['layout']}/{r['form']} {r['overhead_pct']:.1f}%" for r in rows
                if r["overhead_pct"] > TARGET_OVERHEAD_PCT]
        out.append(f"# SPEC 7: overhead <= {TARGET_OVERHEAD_PCT:.0f}% at S_local = {TARGET_S_LOCAL}, C = 4096{where}: "
                   + (("over: " + ", ".join(over)) if over else "all within"))
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
    return [stem + ".jsonl", stem + ".csv", stem + "_table.txt"]


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
                f"reps {args.reps} (+{args.warmup} warm-up)")
        timer = Timer(torch, dist, device, flush=not args.no_flush, host_ahead_us=args.host_ahead_us)
        rows = []
        for layout in args.layouts:
            stats_PK, failures, lengths = run_layout(torch, dist, cakeconv, args, layout, device, timer, coll_device)
            rows += build_rows(env, args, layout, stats_PK, failures, lengths)
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
    rows = run(argv)
    return 0 if all(r["bitwise"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
