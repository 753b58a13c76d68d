#!/usr/bin/env python3
"""Benchmark of cakeconv's deterministic packed causal conv1d + SiLU against its peers (one GPU).

Run from the repository root on a CUDA machine:

    python benchmarks/bench_cake_causal_conv1d_det.py                # the full grid, seed document mix
    python benchmarks/bench_cake_causal_conv1d_det.py --quick        # S = 250340, C in 128, 512, 4096
    python benchmarks/bench_cake_causal_conv1d_det.py --rows 512,4096 --bias no --out /tmp/res
    python benchmarks/bench_cake_causal_conv1d_det.py --doc-mix seed,uniform:1-64,ones --rows 250340x512
    python benchmarks/bench_cake_causal_conv1d_det.py --rows 250340x128,250340x512 --passes fwdbwd \\
        --bias no --eager --host-cost                                # SPEC 7's eager loop and host cost
    python benchmarks/bench_cake_causal_conv1d_det.py --dry-run --eager --host-cost   # CPU, reference backend

Three timings (benchmarks/README.md has the long form; SPEC section 7):

* GPU time (``--passes fwd,bwd,fwdbwd``): floor bytes with bf16 x: fwd reads x and writes y, 4*S*C bytes; bwd
  reads x and dy and writes dx, 6*S*C; fwd+bwd 10*S*C.  GB/s = floor bytes / median time; "f" = that over
  the copy bandwidth measured in the same run (dst.copy_(src) of 2 GiB, bytes read + written).  Every pass
  is the whole call a user makes, between two CUDA events: fwd = the forward entry point, bwd = the
  backward entry point given dy and x (autograd peers: torch.autograd.grad on a graph built before the
  timed region), fwd+bwd = forward then backward.  Before every timed call the GPU sleeps
  (torch.cuda._sleep, ``--host-ahead-us``) so that the host enqueues the whole call ahead of the GPU; cold
  L2 (rotating input sets, a 256 MiB read before each call, outside the span); providers and passes
  interleaved; warm-up rounds dropped; median of the timed calls.
* Eager loop (``--eager``): what a user gets, no host-ahead trick.  One step = set .grad to None for x
  and every tap/bias (zero_grad(set_to_none=True)), a chain of ``--chain`` (16) calls ``y = op(y, w_i)``
  with distinct taps w_i (requiring grad) starting from x (requiring grad), one ``backward(dy)``.
  The device is synchronised before and after each step; time per call = wall time of the step / 16,
  median over ``--eager-steps`` steps after ``--eager-warmup``.  Also ``step``: one call and its own
  backward per step (16 steps between two synchronisations).  The op is each provider's autograd op
  (ours: cakeconv.cake_causal_conv1d_det) in its own input format (y keeps x's layout and dtype).
  Floor bytes per call: 10*S*C, so "f" compares with the GPU time of fwd+bwd.
* Host cost (``--host-cost``): the same at the tiny shape ``--host-shape`` (S = 4,096, C = 256, one
  document, bf16), where the GPU is idle, beside a trivial autograd.Function (forward x.clone(),
  backward identity) and torch.nn.functional.silu, with the ratio to the trivial Function.  Items per
  call: ``chain`` (the 16-call chain), ``step`` (one call + backward per step), ``nograd`` (the autograd op
  under torch.no_grad, one call per iteration), ``ws`` (ours only: the entry points
  cake_causal_conv1d_det_train_forward(..., out=y) + cake_causal_conv1d_det_train_backward(..., dx=dx,
  workspace=ws), buffers preallocated).  Each sample is 16 calls between two synchronisations.

Document mixes (``--doc-mix``, comma list, or the option repeated): ``seed`` (the benchmark's mix since
session 1: 85% of documents exponential around ``--mean-doc-len`` = 3,000 tokens capped at 8x that, 15% of
1-63 tokens), ``uniform:A-B`` (lengths uniform in A..B), ``ones`` (every document of length 1),
``fixed:N`` (all of length N, the last shorter), ``one`` (a single document).  Every row states its mix,
number of documents and shortest/longest document.

The same inputs (seeded x, dy, taps, bias, document lengths) go to every provider; each provider's y, dx,
dweight, dbias are checked against an FP32/FP64 PyTorch reference of SPEC section 1 before timing
(relative L2 error; bf16 tolerance 1e-2).

Peers (each is used only when it imports; otherwise a note is printed and it is skipped):

* flash-linear-attention (package fla-core 0.6.0), its Triton kernel (FLA_GLUON is forced to "0"):
      from fla.modules.causal_conv1d import causal_conv1d
      from fla.ops.utils import prepare_chunk_indices
      chunk_indices = prepare_chunk_indices(cu_seqlens, 64)          # once per batch, outside the timing
      y, _ = causal_conv1d(x=x[None], weight=w, bias=b, activation="silu", backend="triton",
                           cu_seqlens=cu_seqlens, chunk_indices=chunk_indices)
  x[None] is [1, S, C] bf16, w [C, 4] fp32 (w[:, 3] multiplies the current token, as ours), b [C] fp32 or
  None, cu_seqlens int32 on the GPU.  Backward: autograd (recomputes the pre-activation with a forward
  launch, then one kernel for dx and per-chunk dw/db partials, then a sum over chunks).
* Dao-AILab causal-conv1d (module causal_conv1d), token-major ("channel-last") with seq_idx:
      from causal_conv1d import causal_conv1d_fn
      x_cl = x.view(1, S, C).transpose(1, 2)                         # [1, C, S], stride(1) == 1
      seq_idx = document index of every token, int32 [1, S]
      y_cl = causal_conv1d_fn(x_cl, w, b, seq_idx=seq_idx, activation="silu")
  y_cl has x_cl's strides (channel-last), so a chain y = op(y, w_i) stays in that format.  Backward:
  autograd (its dweight is accumulated with atomics: not deterministic).  Build: benchmarks/device_run.sh
  daobuild (benchmarks/tools/build_dao.sh).

Ours: cakeconv.cake_causal_conv1d_det_train_forward / _backward (GPU time, provider "ours"), the autograd op
cakeconv.cake_causal_conv1d_det (eager loop, host cost; GPU time with provider "ours_ag"). Provider
"ours_search": ours with the per-token segment indices switched off (rows of programs that touch 5+
documents placed by a binary search, the kernels before v12), the same bits (checked): v12's A/B in one run.
"""

from __future__ import annotations

import abc
import argparse
import csv
import datetime
import importlib.util
import json
import math
import os
import platform
import random
import statistics
import sys
import time
import zlib
from dataclasses import dataclass, field

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# --------------------------------------------------------------------------------------------------------------
# The grid (the seed's single-rank grid)
# --------------------------------------------------------------------------------------------------------------

SWEEP_S = 250340
S_SWEEP_C = 512
S_SWEEP = [239718, 245028, 249866, 250340, 258574, 259042, 259584, 261393]
C_SWEEP = [128, 256, 1024, 1280, 1344, 1160, 1536, 2048, 2560, 4096, 8192]
S_262144_C = [1160, 1280, 1536]
QUICK_C = [128, 512, 4096]

DRY_SWEEP_S = 1531
DRY_SHAPES = [(1531, 16), (1531, 64), (1531, 200), (2053, 64)]

PASSES = ("fwd", "bwd", "fwdbwd")
PASS_LABEL = {"fwd": "fwd", "bwd": "bwd", "fwdbwd": "fwd+bwd"}
FLOOR_FACTOR = {"fwd": 2, "bwd": 3, "fwdbwd": 5}  # times S*C*itemsize(x): 4, 6, 10 bytes per element in bf16
PEERS = ("fla", "dao")
BASELINES = ("trivial", "silu")  # host-cost baselines (not in the GPU-time grid)
ALL_PROVIDERS = ("ours", "ours_search", "ours_ag", "fla", "dao")
DEFAULT_PROVIDERS = ("ours", "fla", "dao")
PROVIDER_ORDER = ALL_PROVIDERS + BASELINES

# Timing methods of a row ("method"): GPU time, eager loop at the row's shape, host cost at the tiny shape.
EAGER_MODES = ("chain", "step")
EAGER_METHOD = {"chain": "eager", "step": "eager_step"}
HOST_ITEMS = ("chain", "step", "nograd", "ws")
HOST_METHOD = {i: "host_" + i for i in HOST_ITEMS}
HOST_PASS = {"chain": "fwdbwd", "step": "fwdbwd", "nograd": "fwd", "ws": "fwdbwd"}
METHOD_LABEL = {"gpu": "GPU time", "eager": "eager, chain", "eager_step": "eager, one call per step",
                "host_chain": "chain (per call)", "host_step": "one call + backward per step",
                "host_nograd": "forward under no_grad", "host_ws": "workspace entry points fwd+bwd"}
CALLS_PER_SAMPLE = 16  # host-cost samples and one-call-per-step samples: 16 calls between two syncs (2 dry)

# SPEC section 7 targets (fraction of copy bandwidth; GPU time)
TARGETS = {"fwd": 0.90, "bwd": 0.85, "fwdbwd": 0.85}  # seed mix, C >= 512
TARGETS_SMALL_C = {"fwdbwd": 0.80}  # seed mix, C = 128 and 256
TARGETS_SHORT_DOCS = {"fwd": 0.85, "fwdbwd": 0.80}  # short-document mixes, C >= 512
SMALL_C_BELOW = 512
EAGER_TARGET = 1.05  # eager-loop time per call <= 1.05 x the GPU time per call (seed mix, C = 128 and 512)
EAGER_TARGET_C = (128, 512)
HOST_TARGETS = {"chain_ratio": 2.0, "nograd_us": 25.0, "ws_us": 40.0}
CHECK_TOL = 1e-2
DEFAULT_MIX = "seed"
HOST_AHEAD_MIN_US = 1000.0  # --host-ahead-us auto: at least the old fixed window
HOST_AHEAD_MAX_US = 200000.0
HOST_AHEAD_FACTOR = 3.0


def full_grid():
    shapes = [(s, S_SWEEP_C) for s in S_SWEEP]
    shapes += [(SWEEP_S, c) for c in C_SWEEP]
    shapes += [(262144, c) for c in S_262144_C]
    return shapes


def quick_grid():
    return [(SWEEP_S, c) for c in QUICK_C]


# --------------------------------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------------------------------


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def fmt_secs(s: float) -> str:
    s = max(0.0, s)
    return f"{int(s // 60)}m{int(s % 60):02d}s"


def percentile(values, q):
    v = sorted(values)
    if not v:
        return float("nan")
    pos = (len(v) - 1) * q
    lo, hi = int(math.floor(pos)), int(math.ceil(pos))
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


# --------------------------------------------------------------------------------------------------------------
# Document mixes
# --------------------------------------------------------------------------------------------------------------


def doc_lengths(S: int, seed: int, mean_len: int) -> list[int]:
    """The seed mix: random document lengths summing to S, mostly exponential around mean_len, 15% short ones (1..63)."""
    rng = random.Random(seed)
    lens: list[int] = []
    total = 0
    while total < S:
        if rng.random() < 0.15:
            n = rng.randint(1, 63)
        else:
            n = 64 + int(rng.expovariate(1.0 / max(1, mean_len - 64)))
            n = min(n, 8 * mean_len)
        n = min(n, S - total)
        lens.append(n)
        total += n
    return lens


def parse_mix(token: str) -> str:
    """The canonical name of one --doc-mix token (raises SystemExit on a bad one)."""
    t = token.strip().lower()
    if t in ("seed", "ones", "one"):
        return t
    try:
        if t.startswith("uniform:"):
            lo, hi = (int(v) for v in t.split(":", 1)[1].split("-"))
            if not 1 <= lo <= hi:
                raise ValueError
            return f"uniform:{lo}-{hi}"
        if t.startswith("fixed:"):
            n = int(t.split(":", 1)[1])
            if n < 1:
                raise ValueError
            return f"fixed:{n}"
    except ValueError:
        pass
    raise SystemExit(f"unknown --doc-mix {token!r}: use seed, uniform:A-B, ones, fixed:N or one")


def parse_mixes(values) -> list[str]:
    out = []
    for v in values or [DEFAULT_MIX]:
        for tok in v.split(","):
            if tok.strip():
                m = parse_mix(tok)
                if m not in out:
                    out.append(m)
    return out or [DEFAULT_MIX]


def mix_lengths(mix: str, S: int, seed: int, mean_len: int) -> list[int]:
    """Document lengths of ``mix`` summing to S (seed: the shape's seed, as before mixes existed)."""
    if S == 0:
        return []
    if mix == "seed":
        return doc_lengths(S, seed, mean_len)
    if mix == "one":
        return [S]
    if mix == "ones":
        return [1] * S
    if mix.startswith("fixed:"):
        n = int(mix.split(":")[1])
        return [n] * (S // n) + ([S % n] if S % n else [])
    if mix.startswith("uniform:"):
        lo, hi = (int(v) for v in mix.split(":")[1].split("-"))
        rng = random.Random(seed * 7919 + zlib.crc32(mix.encode()))
        lens, total = [], 0
        while total < S:
            n = min(rng.randint(lo, hi), S - total)
            lens.append(n)
            total += n
        return lens
    raise ValueError(f"unknown mix {mix!r}")


def is_short_mix(mix: str) -> bool:
    """The short-document mixes of SPEC section 7 (uniform 1-8, 1-64, 1-1,024 and all of length 1)."""
    return mix == "ones" or (mix.startswith("uniform:") and int(mix.split("-")[-1]) <= 1024)


def mix_of(r) -> str:
    return r.get("mix") or DEFAULT_MIX


def method_of(r) -> str:
    return r.get("method") or "gpu"


# --------------------------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------------------------


class Timer:
    """Brackets calls with CUDA events (GPU) or perf_counter (CPU); holds the L2 flush and host-ahead sleep."""

    def __init__(self, device, flush: bool, host_ahead_us: float):
        import torch

        self.torch = torch
        self.cuda = device.type == "cuda"
        self.flush_buf = None
        self.sleep_cycles = 0
        if self.cuda:
            if flush:
                self.flush_buf = torch.empty(256 * 2**20 // 4, dtype=torch.float32, device=device).normal_()
            if host_ahead_us > 0 and hasattr(torch.cuda, "_sleep"):
                self.sleep_cycles = int(host_ahead_us * 2000)  # ~2 GHz SM clock under load

    def prepare(self, sleep_us=None):
        if not self.cuda:
            return
        cycles = self.sleep_cycles if sleep_us is None else (int(sleep_us * 2000) if self.sleep_cycles else 0)
        if cycles:
            self.torch.cuda._sleep(cycles)
        if self.flush_buf is not None:
            self.flush_buf.sum()

    def time_call(self, fn, sleep_us=None):
        """Runs fn() once; returns a handle that resolve() turns into (device ms, host ms to enqueue the call).

        sleep_us: this call's host-ahead sleep (default: the timer's)."""
        self.prepare(sleep_us)
        if self.cuda:
            start = self.torch.cuda.Event(enable_timing=True)
            end = self.torch.cuda.Event(enable_timing=True)
            start.record()
            t0 = time.perf_counter()
            fn()
            host_ms = (time.perf_counter() - t0) * 1e3
            end.record()
            return (start, end, host_ms)
        t0 = time.perf_counter()
        fn()
        ms = (time.perf_counter() - t0) * 1e3
        return (ms, ms)

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def resolve(self, handle):
        if len(handle) == 3:
            return handle[0].elapsed_time(handle[1]), handle[2]
        return handle


def measure_copy_bandwidth(torch, device, timer: Timer, nbytes: int, reps: int):
    """dst.copy_(src); counts bytes read + bytes written.  Returns (median GB/s, all GB/s)."""
    n = nbytes // 2
    src = torch.randn(n, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    timer.sync()
    handles = [timer.time_call(lambda: dst.copy_(src)) for _ in range(reps)]
    timer.sync()
    ms = [timer.resolve(h)[0] for h in handles]
    gbs = [2 * n * 2 / (t * 1e-3) / 1e9 for t in ms]
    del src, dst
    return statistics.median(gbs), gbs


def wall_rounds(subjects, rounds: int, warmup: int, sync, on_error=None):
    """Wall-clock samples of several subjects, interleaved round by round (the order rotates).

    subjects: {key: (fn, calls)}; one sample = sync, fn(), sync; it is recorded as ms per call (the
    sample's wall time / calls).  A subject that raises is dropped (on_error(key, exc) is called).
    Returns {key: [ms per call, one per timed sample]}.
    """
    keys = list(subjects)
    out = {k: [] for k in keys}
    dead = set()
    for r in range(warmup + rounds):
        k0 = r % max(1, len(keys))
        for key in keys[k0:] + keys[:k0]:
            if key in dead:
                continue
            fn, calls = subjects[key]
            try:
                sync()
                t0 = time.perf_counter()
                fn()
                sync()
                dt = time.perf_counter() - t0
            except Exception as exc:  # noqa: BLE001
                dead.add(key)
                out[key] = []
                if on_error is not None:
                    on_error(key, exc)
                continue
            if r >= warmup:
                out[key].append(dt * 1e3 / calls)
    return {k: v for k, v in out.items() if k not in dead}


# --------------------------------------------------------------------------------------------------------------
# Inputs of one shape
# --------------------------------------------------------------------------------------------------------------


@dataclass
class ShapeData:
    S: int
    C: int
    device: object
    lengths: list
    cu: object  # int32 [N+1] on the device
    pos: object  # int64 [S] position of each token in its document (reference only)
    sets: list  # [(x, dy)] bf16 [S, C]
    w: object  # fp32 [C, 4]
    b: object  # fp32 [C]
    mix: str = DEFAULT_MIX
    extra: dict = field(default_factory=dict)

    @property
    def n_docs(self):
        return len(self.lengths)

    @property
    def doc_min(self):
        return min(self.lengths) if self.lengths else 0

    @property
    def doc_max(self):
        return max(self.lengths) if self.lengths else 0

    def chain_params(self, torch, chain: int, use_bias: bool):
        """``chain`` distinct taps (and biases) for the eager loop: fp32 leaves, the same for every provider."""
        key = ("chain", chain, use_bias)
        if key not in self.extra:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(shape_seed(0, self.S, self.C) + 17)
            ws = [(torch.randn(self.C, 4, generator=gen, device=self.device) * 0.5).contiguous() for _ in range(chain)]
            bs = [(torch.randn(self.C, generator=gen, device=self.device) * 0.2).contiguous() if use_bias else None
                  for _ in range(chain)]
            self.extra[key] = (ws, bs)
        return self.extra[key]


def shape_seed(seed: int, S: int, C: int) -> int:
    """The seed of one grid shape's inputs and document lengths."""
    return seed * 1_000_003 + S * 131 + C


def make_shape(torch, S, C, device, seed, mean_doc_len, l2_bytes, max_sets, mix=DEFAULT_MIX):
    sh_seed = shape_seed(seed, S, C)
    lens = mix_lengths(mix, S, sh_seed, mean_doc_len)
    cu_host = [0]
    for n in lens:
        cu_host.append(cu_host[-1] + n)
    cu = torch.tensor(cu_host, dtype=torch.int32, device=device)
    lens_t = torch.tensor(lens, dtype=torch.int64, device=device)
    starts = torch.repeat_interleave(cu[:-1].to(torch.int64), lens_t)
    pos = torch.arange(S, dtype=torch.int64, device=device) - starts
    set_bytes = 2 * S * C * 2
    n_sets = max(2, min(max_sets, math.ceil(8 * l2_bytes / max(1, set_bytes))))
    gen = torch.Generator(device=device)
    gen.manual_seed(sh_seed)
    sets = []
    for _ in range(n_sets):
        x = torch.randn(S, C, generator=gen, device=device, dtype=torch.float32).to(torch.bfloat16)
        dy = torch.randn(S, C, generator=gen, device=device, dtype=torch.float32).to(torch.bfloat16)
        sets.append((x, dy))
    w = (torch.randn(C, 4, generator=gen, device=device, dtype=torch.float32) * 0.5).contiguous()
    b = (torch.randn(C, generator=gen, device=device, dtype=torch.float32) * 0.2).contiguous()
    return ShapeData(S=S, C=C, device=device, lengths=lens, cu=cu, pos=pos, sets=sets, w=w, b=b, mix=mix)


# --------------------------------------------------------------------------------------------------------------
# FP32/FP64 reference of SPEC section 1 (independent of cakeconv), on channel blocks to bound memory
# --------------------------------------------------------------------------------------------------------------


def reference(torch, sh: ShapeData, x, dy, use_bias: bool, block_c: int = 1024):
    S, C = x.shape
    y = torch.empty(S, C, dtype=torch.float32, device=x.device)
    dx = torch.empty(S, C, dtype=torch.float32, device=x.device)
    dw = torch.empty(C, 4, dtype=torch.float64, device=x.device)
    db = torch.empty(C, dtype=torch.float64, device=x.device)
    pos = sh.pos
    for c0 in range(0, C, block_c):
        c1 = min(C, c0 + block_c)
        xf = x[:, c0:c1].float()
        wf = sh.w[c0:c1].float()
        shifted = {}
        pre = xf * wf[:, 3]
        if use_bias:
            pre = pre + sh.b[c0:c1].float()
        for s in (1, 2, 3):
            xs = torch.zeros_like(xf)
            xs[s:] = xf[:-s]
            xs[pos < s] = 0.0
            shifted[s] = xs
            pre = pre + xs * wf[:, 3 - s]
        sig = 1.0 / (1.0 + torch.exp(-pre))
        y[:, c0:c1] = pre * sig
        g = dy[:, c0:c1].float() * sig * (1.0 + pre * (1.0 - sig))
        dxb = g * wf[:, 3]
        for s in (1, 2, 3):
            gm = g.clone()
            gm[pos < s] = 0.0  # g[t'] reaches back to t' - s only inside its document
            gs = torch.zeros_like(g)
            gs[:-s] = gm[s:]
            dxb = dxb + gs * wf[:, 3 - s]
        dx[:, c0:c1] = dxb
        dw[c0:c1, 3] = torch.sum(g * xf, 0, dtype=torch.float64)
        for s in (1, 2, 3):
            dw[c0:c1, 3 - s] = torch.sum(g * shifted[s], 0, dtype=torch.float64)
        db[c0:c1] = torch.sum(g, 0, dtype=torch.float64)
        del xf, shifted, pre, sig, g, dxb
    return y, dx, dw, db


def rel_err(torch, got, ref, chunk: int = 1 << 24) -> float:
    """||got - ref|| / ||ref|| in FP64, over chunks (the big shapes hold 2e9 elements); inf if got is not finite."""
    if got is None:
        return float("nan")
    g_all = got.reshape(-1)
    r_all = ref.reshape(-1)
    if g_all.numel() != r_all.numel():
        return float("inf")
    num = den = 0.0
    for i in range(0, g_all.numel(), chunk):
        g = g_all[i:i + chunk].double()
        r = r_all[i:i + chunk].double()
        if not bool(torch.isfinite(g).all()):
            return float("inf")
        num += float(torch.sum((g - r) ** 2))
        den += float(torch.sum(r * r))
    return math.sqrt(num / den) if den > 0 else math.sqrt(num)


# --------------------------------------------------------------------------------------------------------------
# Providers
# --------------------------------------------------------------------------------------------------------------


class Provider(abc.ABC):
    name = "?"
    is_peer = False

    def prepare_shape(self, sh: ShapeData):
        pass

    def prepare_bias(self, sh: ShapeData, use_bias: bool, need_bwd_graph: bool):
        pass

    def release_bias(self):
        pass

    def release_shape(self):
        pass

    @abc.abstractmethod
    def callable_for(self, pass_: str, sh: ShapeData, use_bias: bool):
        """fn(i) running one timed call of pass_ on input set i."""

    @abc.abstractmethod
    def outputs(self, sh: ShapeData, use_bias: bool):
        """(y, dx [S, C], dw [C, 4], db [C] or None) on set 0, for the correctness check."""

    # The eager loop and the host cost use the provider's autograd op in its own input format.
    def to_layout(self, t, sh):  # [S, C] -> the provider's layout
        return t

    def from_layout(self, t, sh):  # back to [S, C]
        return t

    @abc.abstractmethod
    def op(self, x, w, b, sh):
        """The provider's autograd op on x in its layout (returns y in the same layout)."""

    def extra_host_items(self, sh: ShapeData, calls: int):
        """{item: (fn, calls)} host-cost items only this provider has (ours: the workspace entry points)."""
        return {}


class OursProvider(Provider):
    """cakeconv's forward and backward entry points (no workspace: the library allocates); the autograd op
    cakeconv.cake_causal_conv1d_det for the eager loop and the host cost."""

    name = "ours"

    def __init__(self, cakeconv, backend):
        self.m = cakeconv
        self.backend = backend

    def callable_for(self, pass_, sh, use_bias):
        fwd = self.m.cake_causal_conv1d_det_train_forward
        bwd = self.m.cake_causal_conv1d_det_train_backward
        w, cu, be = sh.w, sh.cu, self.backend
        b = sh.b if use_bias else None
        sets = sh.sets
        if pass_ == "fwd":
            return lambda i: fwd(sets[i][0], w, b, cu, backend=be)
        if pass_ == "bwd":
            return lambda i: bwd(sets[i][1], sets[i][0], w, b, cu, backend=be)

        def fwdbwd(i):
            x, dy = sets[i]
            fwd(x, w, b, cu, backend=be)
            return bwd(dy, x, w, b, cu, backend=be)

        return fwdbwd

    def outputs(self, sh, use_bias):
        x, dy = sh.sets[0]
        b = sh.b if use_bias else None
        y = self.m.cake_causal_conv1d_det_train_forward(x, sh.w, b, sh.cu, backend=self.backend)
        dx, dw, db = self.m.cake_causal_conv1d_det_train_backward(dy, x, sh.w, b, sh.cu, backend=self.backend)
        return y, dx, dw, db

    def op(self, x, w, b, sh):
        return self.m.cake_causal_conv1d_det(x, w, b, cu_seqlens=sh.cu, backend=self.backend)

    def extra_host_items(self, sh, calls):
        """The workspace entry points, forward + backward per pair, every buffer preallocated."""
        import torch

        m, be, cu = self.m, self.backend, sh.cu
        x, dy = sh.sets[0]
        w = sh.w
        y = torch.empty_like(x)
        dx = torch.empty_like(x)
        nbytes = m.cake_causal_conv1d_det_train_backward_workspace_bytes(sh.S, sh.C)
        ws = torch.empty(max(16, nbytes), dtype=torch.uint8, device=x.device)
        fwd, bwd = m.cake_causal_conv1d_det_train_forward, m.cake_causal_conv1d_det_train_backward

        def pairs():
            for _ in range(calls):
                fwd(x, w, None, cu, out=y, backend=be)
                bwd(dy, x, w, None, cu, dx=dx, workspace=ws, backend=be)

        return {"ws": (pairs, calls)}


class OursSearchProvider(OursProvider):
    """Ours with the per-token segment indices off (kernels/segment_ids.py): rows of programs touching 5+
    documents placed by a binary search over cu_seqlens, as before v12. The same kernels otherwise, so
    ``--providers ours,ours_search`` is v12's A/B in one run; the check requires the same bits."""

    name = "ours_search"

    def __init__(self, cakeconv, backend):
        super().__init__(cakeconv, backend)
        from cakeconv.cake_causal_conv1d_det_train_backend.kernels import launch

        self.launch = launch

    def _searching(self, fn):
        launch = self.launch

        def call(*args):
            launch.use_ids = False
            try:
                return fn(*args)
            finally:
                launch.use_ids = True

        return call

    def callable_for(self, pass_, sh, use_bias):
        return self._searching(super().callable_for(pass_, sh, use_bias))

    def outputs(self, sh, use_bias):
        return self._searching(super().outputs)(sh, use_bias)

    def op(self, x, w, b, sh):
        return self._searching(super().op)(x, w, b, sh)

    def extra_host_items(self, sh, calls):
        return {}


class AutogradProvider(Provider):
    """A provider timed through torch.autograd: fwd = the op, fwd+bwd = op + autograd.grad, bwd = autograd.grad
    over a graph built (per input set) before the timed region and kept with retain_graph=True."""

    def prepare_bias(self, sh, use_bias, need_bwd_graph):
        torch = self.torch
        self.use_bias = use_bias
        self.w_leaf = sh.w.detach().clone().requires_grad_()
        self.b_leaf = sh.b.detach().clone().requires_grad_() if use_bias else None
        self.xs = [self.to_layout(x, sh) for x, _ in sh.sets]
        self.dys = [self.to_layout(dy, sh) for _, dy in sh.sets]
        self.x_leaves = [x.detach().requires_grad_() for x in self.xs]
        self.inputs = [[xl, self.w_leaf] + ([self.b_leaf] if use_bias else []) for xl in self.x_leaves]
        self.graphs = []
        if need_bwd_graph:
            with torch.enable_grad():
                self.graphs = [self.op(xl, self.w_leaf, self.b_leaf, sh) for xl in self.x_leaves]

    def release_bias(self):
        self.graphs = []
        self.xs = self.dys = self.x_leaves = self.inputs = None
        self.w_leaf = self.b_leaf = None

    def callable_for(self, pass_, sh, use_bias):
        torch = self.torch
        op, xs, dys, w, b = self.op, self.xs, self.dys, sh.w, (sh.b if use_bias else None)
        if pass_ == "fwd":

            def fwd(i):
                with torch.no_grad():
                    return op(xs[i], w, b, sh)

            return fwd
        if pass_ == "bwd":
            graphs, inputs = self.graphs, self.inputs
            return lambda i: torch.autograd.grad(graphs[i], inputs[i], dys[i], retain_graph=True)
        xl, wl, bl, inputs = self.x_leaves, self.w_leaf, self.b_leaf, self.inputs

        def fwdbwd(i):
            with torch.enable_grad():
                y = op(xl[i], wl, bl, sh)
                return torch.autograd.grad(y, inputs[i], dys[i])

        return fwdbwd

    def outputs(self, sh, use_bias):
        torch = self.torch
        with torch.enable_grad():
            y = self.op(self.x_leaves[0], self.w_leaf, self.b_leaf, sh)
            grads = torch.autograd.grad(y, self.inputs[0], self.dys[0])
        dx, dw = grads[0], grads[1]
        db = grads[2] if use_bias else None
        return self.from_layout(y.detach(), sh), self.from_layout(dx, sh), dw, db


class OursAutogradProvider(AutogradProvider):
    name = "ours_ag"

    def __init__(self, torch, cakeconv, backend):
        self.torch = torch
        self.m = cakeconv
        self.backend = backend

    def op(self, x, w, b, sh):
        return self.m.cake_causal_conv1d_det(x, w, b, cu_seqlens=sh.cu, backend=self.backend)


class FlaProvider(AutogradProvider):
    """flash-linear-attention's Triton causal_conv1d (see the module docstring for the exact call)."""

    name = "fla"
    is_peer = True

    def __init__(self, torch, causal_conv1d, prepare_chunk_indices):
        self.torch = torch
        self.fn = causal_conv1d
        self.prepare_chunk_indices = prepare_chunk_indices

    def prepare_shape(self, sh):
        # What fla's own layers do once per batch (it syncs with the host): keep it out of the timing.
        sh.extra["fla_chunk_indices"] = self.prepare_chunk_indices(sh.cu, 64)

    def to_layout(self, t, sh):
        return t.view(1, sh.S, sh.C)

    def from_layout(self, t, sh):
        return t.reshape(sh.S, sh.C)

    def op(self, x, w, b, sh):
        y, _ = self.fn(
            x=x,
            weight=w,
            bias=b,
            activation="silu",
            backend="triton",
            cu_seqlens=sh.cu,
            chunk_indices=sh.extra["fla_chunk_indices"],
        )
        return y


class DaoProvider(AutogradProvider):
    """Dao-AILab causal-conv1d, token-major ("channel-last") layout with seq_idx."""

    name = "dao"
    is_peer = True

    def __init__(self, torch, causal_conv1d_fn):
        self.torch = torch
        self.fn = causal_conv1d_fn

    def prepare_shape(self, sh):
        torch = self.torch
        lens = torch.tensor(sh.lengths, dtype=torch.int64, device=sh.device)
        ids = torch.arange(len(sh.lengths), dtype=torch.int32, device=sh.device)
        sh.extra["dao_seq_idx"] = torch.repeat_interleave(ids, lens).view(1, sh.S).contiguous()

    def to_layout(self, t, sh):
        return t.view(1, sh.S, sh.C).transpose(1, 2)  # [1, C, S], channel stride 1

    def from_layout(self, t, sh):
        return t.transpose(1, 2).reshape(sh.S, sh.C)

    def op(self, x, w, b, sh):
        return self.fn(x, w, b, seq_idx=sh.extra["dao_seq_idx"], activation="silu")


class BaselineProvider(Provider):
    """A host-cost baseline: an op of the same form y = op(x, w), timed only in the eager loop and the host cost."""

    def __init__(self, torch, name):
        self.torch = torch
        self.name = name
        if name == "trivial":

            class TrivialFunction(torch.autograd.Function):
                """forward: one clone; backward: identity (no gradient for the taps)."""

                @staticmethod
                def forward(ctx, x, w):
                    return x.clone()

                @staticmethod
                def backward(ctx, g):
                    return g, None

            self._op = lambda x, w, b: TrivialFunction.apply(x, w)
        elif name == "silu":
            self._op = lambda x, w, b: torch.nn.functional.silu(x)
        else:
            raise ValueError(name)

    def op(self, x, w, b, sh):
        return self._op(x, w, b)

    def callable_for(self, pass_, sh, use_bias):
        raise RuntimeError(f"the {self.name} baseline is timed only in the eager loop and the host cost")

    def outputs(self, sh, use_bias):
        raise RuntimeError(f"the {self.name} baseline computes no convolution to check")


def load_providers(torch, names, cakeconv, backend, cuda: bool, notes: list):
    provs = []
    for name in names:
        if name in ("ours", "ours_search", "ours_ag"):
            if cakeconv is None:
                notes.append(f"{name}: skipped, cakeconv did not import")
                continue
            kinds = {"ours": lambda: OursProvider(cakeconv, backend),
                     "ours_search": lambda: OursSearchProvider(cakeconv, backend),
                     "ours_ag": lambda: OursAutogradProvider(torch, cakeconv, backend)}
            provs.append(kinds[name]())
        elif name == "fla":
            if not cuda:
                notes.append("fla: skipped (its Triton kernels need a CUDA device)")
                continue
            os.environ["FLA_GLUON"] = "0"  # its Triton path, the one SPEC section 7 quotes
            try:
                from fla.modules.causal_conv1d import causal_conv1d
                from fla.ops.utils import prepare_chunk_indices
            except Exception as exc:  # noqa: BLE001 - any import failure means "not available"
                notes.append(f"fla: skipped, import failed ({type(exc).__name__}: {exc}); install: "
                             "pip install --no-deps --target /tmp/fla .fla/*.whl && export PYTHONPATH=/tmp/fla")
                continue
            provs.append(FlaProvider(torch, causal_conv1d, prepare_chunk_indices))
        elif name == "dao":
            if not cuda:
                notes.append("dao: skipped (CUDA extension)")
                continue
            try:
                from causal_conv1d import causal_conv1d_fn
            except Exception as exc:  # noqa: BLE001
                notes.append(f"dao: skipped, causal_conv1d did not import ({type(exc).__name__}: {exc}); build: "
                             "benchmarks/device_run.sh daobuild ... waitdao")
                continue
            provs.append(DaoProvider(torch, causal_conv1d_fn))
    return provs


# --------------------------------------------------------------------------------------------------------------
# Eager loop and host cost
# --------------------------------------------------------------------------------------------------------------


def eager_subjects(torch, p: Provider, sh: ShapeData, use_bias: bool, chain: int, modes, calls: int = CALLS_PER_SAMPLE):
    """{mode: (fn, calls)} of provider p at shape sh: the chain of ``chain`` calls y = op(y, w_i) with one
    backward per step, and/or one call + its backward per step (``calls`` steps per sample), and/or ``calls``
    forward calls under torch.no_grad.

    Each step first sets .grad to None on x and every tap and bias (zero_grad(set_to_none=True)).
    """
    x0, dy0 = sh.sets[0]
    x_leaf = p.to_layout(x0, sh).detach().requires_grad_()
    dy = p.to_layout(dy0, sh)
    ws, bs = sh.chain_params(torch, chain, use_bias)
    ws = [w.detach().clone().requires_grad_() for w in ws]
    bs = [b.detach().clone().requires_grad_() if b is not None else None for b in bs]
    params = [x_leaf] + ws + [b for b in bs if b is not None]
    op = p.op
    out = {}

    def zero_grad():
        for t in params:
            t.grad = None

    if "chain" in modes:

        def chain_step():
            zero_grad()
            y = x_leaf
            for i in range(chain):
                y = op(y, ws[i], bs[i], sh)
            torch.autograd.backward(y, dy)

        out["chain"] = (chain_step, chain)
    if "step" in modes:

        def one_call_steps():
            for _ in range(calls):
                zero_grad()
                y = op(x_leaf, ws[0], bs[0], sh)
                torch.autograd.backward(y, dy)

        out["step"] = (one_call_steps, calls)
    if "nograd" in modes:

        def nograd_calls():
            with torch.no_grad():
                for _ in range(calls):
                    op(x_leaf, ws[0], bs[0], sh)

        out["nograd"] = (nograd_calls, calls)
    return out


def eager_fits(torch, sh: ShapeData, chain: int, n_providers: int) -> tuple[bool, str]:
    """Whether a chain step fits in the free device memory (it keeps ~chain + 4 activations alive)."""
    if sh.device.type != "cuda":
        return True, ""
    need = (chain + 6) * sh.S * sh.C * 2 * 2  # saved inputs, y, dy, dx, peers' extra buffers; x2 margin
    free, _ = torch.cuda.mem_get_info(sh.device)
    if need > 0.9 * free:
        return False, f"needs ~{need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free"
    return True, ""


# --------------------------------------------------------------------------------------------------------------
# Environment
# --------------------------------------------------------------------------------------------------------------


def environment(torch, device, cakeconv, provs):
    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "host": platform.node(),
        "cpu_count": os.cpu_count(),
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception:  # noqa: BLE001
        env["triton"] = None
    env["cakeconv"] = getattr(cakeconv, "__version__", None) if cakeconv is not None else None
    env["cakeconv_path"] = os.path.dirname(os.path.abspath(cakeconv.__file__)) if cakeconv is not None else None
    names = {p.name for p in provs}
    if "fla" in names:
        try:
            from importlib.metadata import version

            env["fla"] = version("fla-core")
        except Exception:  # noqa: BLE001
            import fla

            env["fla"] = getattr(fla, "__version__", None)
    if "dao" in names:
        try:
            import causal_conv1d

            env["causal_conv1d"] = getattr(causal_conv1d, "__version__", None)
        except Exception:  # noqa: BLE001
            env["causal_conv1d"] = None
        if not env["causal_conv1d"]:
            try:
                from importlib.metadata import version

                env["causal_conv1d"] = version("causal-conv1d")
            except Exception:  # noqa: BLE001
                pass
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env["gpu"] = props.name
        env["sm"] = f"{props.major}.{props.minor}"
        env["l2_bytes"] = int(getattr(props, "L2_cache_size", 0) or 0)
        env["cuda"] = torch.version.cuda
    else:
        env["gpu"] = "cpu (dry-run)"
        env["sm"] = None
        env["l2_bytes"] = 0
        env["cuda"] = None
    return env


# --------------------------------------------------------------------------------------------------------------
# Main loop
# --------------------------------------------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description="Benchmark cakeconv's deterministic causal conv1d (fwd, bwd, fwd+bwd) against "
        "flash-linear-attention and Dao's causal-conv1d, as fractions of the copy bandwidth: GPU time, "
        "eager loop and host cost.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help=f"S={SWEEP_S}, C in {QUICK_C} only")
    p.add_argument("--dry-run", action="store_true",
                   help="tiny shapes on the CPU with backend='reference' and perf_counter timing (no GPU needed)")
    p.add_argument("--rows", default=None,
                   help="comma list: C values keep the grid rows of those C; SxC tokens (e.g. 250340x512) add shapes")
    p.add_argument("--doc-mix", action="append", default=None,
                   help="document mix(es), comma list, the option may repeat: seed, uniform:A-B (e.g. uniform:1-64), "
                   "ones, fixed:N, one (default: seed)")
    p.add_argument("--bias", choices=("both", "no", "yes"), default="both", help="bias variants to run")
    p.add_argument("--passes", default=",".join(PASSES),
                   help="GPU-time passes, comma list of fwd,bwd,fwdbwd ('none': no GPU-time rows)")
    p.add_argument("--providers", default=",".join(DEFAULT_PROVIDERS),
                   help=f"comma list among {','.join(ALL_PROVIDERS)} (missing peers are skipped with a note)")
    p.add_argument("--backend", default=None, help="cakeconv backend for ours (default: auto; reference in --dry-run)")
    p.add_argument("--reps", type=int, default=None, help="timed calls per provider, pass and shape (default 25; 10 quick)")
    p.add_argument("--warmup", type=int, default=3, help="untimed rounds first (compilation, autotuning)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mean-doc-len", type=int, default=3000, help="mean document length of the seed mix, in tokens")
    p.add_argument("--max-sets", type=int, default=8, help="at most this many rotating input sets per shape")
    p.add_argument("--copy-bytes", type=int, default=2 * 2**30, help="size of the copy-bandwidth source tensor")
    p.add_argument("--no-flush", action="store_true", help="no L2 eviction read before each timed call")
    p.add_argument("--host-ahead-us", default="auto",
                   help="GPU sleep before each timed call so the host enqueues the call ahead: a number of us (0: off; "
                   "1000 = the protocol before issue 16), or 'auto': per provider and pass, 3x the host time to enqueue "
                   "the call in the warm-up rounds (the first excluded when there are two or more), at least "
                   f"{HOST_AHEAD_MIN_US:.0f} us, at most {HOST_AHEAD_MAX_US:.0f} us")
    p.add_argument("--no-check", action="store_true", help="skip the correctness check against the reference")
    p.add_argument("--eager", action="store_true",
                   help="also the eager loop at every row's shape (no host-ahead sleep; see the module docstring)")
    p.add_argument("--eager-modes", default=",".join(EAGER_MODES),
                   help="eager-loop forms: chain (16 calls, one backward per step), step (one call + backward per step)")
    p.add_argument("--eager-c", default=None, help="comma list of C: the eager loop only at rows of these C")
    p.add_argument("--chain", type=int, default=None, help="calls per chain step (default 16; 4 in --dry-run)")
    p.add_argument("--eager-steps", type=int, default=None, help="timed eager samples per provider (default 10)")
    p.add_argument("--eager-warmup", type=int, default=2, help="untimed eager samples first")
    p.add_argument("--host-cost", action="store_true",
                   help="host cost per call at --host-shape beside a trivial autograd.Function and silu")
    p.add_argument("--host-shape", default=None, help="SxC of the host-cost rows (default 4096x256; 256x16 in --dry-run)")
    p.add_argument("--host-steps", type=int, default=None, help="timed host-cost samples per item (default 30)")
    p.add_argument("--host-warmup", type=int, default=5, help="untimed host-cost samples first")
    p.add_argument("--calls", type=int, default=None,
                   help="calls per sample of the one-call items (eager step, host step/nograd/ws; default 16; 2 dry)")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--out", default=os.path.join(REPO_ROOT, "benchmarks", "results"), help="output folder")
    return p.parse_args(argv)


def select_shapes(args):
    if args.dry_run:
        shapes, sweep_s = list(DRY_SHAPES), DRY_SWEEP_S
    elif args.quick:
        shapes, sweep_s = quick_grid(), SWEEP_S
    else:
        shapes, sweep_s = full_grid(), SWEEP_S
    if args.rows:
        keep_c, extra = set(), []
        for tok in args.rows.replace(" ", "").split(","):
            if not tok:
                continue
            if "x" in tok.lower():
                s, c = tok.lower().split("x")
                extra.append((int(s), int(c)))
            else:
                keep_c.add(int(tok))
        if keep_c:
            # C values pick rows of the full grid (of the S=250340 sweep with --quick, of the tiny grid in --dry-run)
            if args.dry_run:
                base = list(DRY_SHAPES)
            elif args.quick:
                base = [sc for sc in full_grid() if sc[0] == SWEEP_S]
            else:
                base = full_grid()
            shapes = [sc for sc in base if sc[1] in keep_c]
            missing = keep_c - {c for _, c in shapes}
            if missing:
                log(f"note: --rows C values not in the grid, ignored: {sorted(missing)} (use SxC to add a shape)")
        elif extra:
            shapes = []
        shapes += [sc for sc in extra if sc not in shapes]
        if extra and not keep_c:
            counts = {}
            for s, _ in shapes:
                counts[s] = counts.get(s, 0) + 1
            if sweep_s not in counts:
                sweep_s = max(counts, key=counts.get)
    for s, c in shapes:
        if c % 8:
            raise SystemExit(f"C must be a multiple of 8, got {c}")
    return shapes, sweep_s


def parse_shape(text: str):
    s, c = text.lower().split("x")
    return int(s), int(c)


def main(argv=None):
    args = parse_args(argv)
    t_start = time.perf_counter()
    import torch

    if args.dry_run:
        device = torch.device("cpu")
        backend = args.backend or "reference"
    else:
        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device: run with --dry-run to exercise the pipeline on the CPU")
        device = torch.device("cuda", torch.cuda.current_device())
        backend = args.backend or "auto"
    if args.dry_run and args.mean_doc_len == 3000:
        args.mean_doc_len = 200  # many documents in the tiny shapes
    reps = args.reps if args.reps is not None else (5 if args.dry_run else (10 if args.quick else 25))
    warmup = 1 if args.dry_run and args.warmup == 3 else args.warmup
    chain = args.chain if args.chain is not None else (4 if args.dry_run else 16)
    eager_steps = args.eager_steps if args.eager_steps is not None else (2 if args.dry_run else 10)
    eager_warmup = min(args.eager_warmup, 1) if args.dry_run else args.eager_warmup
    host_steps = args.host_steps if args.host_steps is not None else (2 if args.dry_run else 30)
    host_warmup = min(args.host_warmup, 1) if args.dry_run else args.host_warmup
    host_shape = parse_shape(args.host_shape or ("256x16" if args.dry_run else "4096x256"))
    n_calls = args.calls if args.calls is not None else (2 if args.dry_run else CALLS_PER_SAMPLE)
    passes = [p for p in args.passes.split(",") if p and p != "none"]
    for p_ in passes:
        if p_ not in PASSES:
            raise SystemExit(f"unknown pass {p_!r}; choose among {PASSES} or none")
    eager_modes = [m for m in args.eager_modes.split(",") if m] if args.eager else []
    for m in eager_modes:
        if m not in EAGER_MODES:
            raise SystemExit(f"unknown eager mode {m!r}; choose among {EAGER_MODES}")
    eager_c = {int(c) for c in args.eager_c.split(",") if c} if args.eager_c else None
    mixes = parse_mixes(args.doc_mix)
    bias_variants = {"both": [False, True], "no": [False], "yes": [True]}[args.bias]
    shapes, sweep_s = select_shapes(args)
    names = [n for n in args.providers.split(",") if n]
    for n in names:
        if n not in ALL_PROVIDERS:
            raise SystemExit(f"unknown provider {n!r}; choose among {ALL_PROVIDERS}")
    if not passes and not eager_modes and not args.host_cost:
        raise SystemExit("nothing to time: --passes none without --eager or --host-cost")

    notes: list[str] = []
    if importlib.util.find_spec("cakeconv") is None:  # a cakeconv already importable wins (A/B of code versions)
        sys.path.insert(0, REPO_ROOT)
    try:
        import cakeconv

        log(f"cakeconv from {os.path.dirname(os.path.abspath(cakeconv.__file__))}")

        need = ["cake_causal_conv1d_det_train_forward", "cake_causal_conv1d_det_train_backward", "cake_causal_conv1d_det"]
        lacking = [n for n in need if not hasattr(cakeconv, n)]
        if lacking:
            notes.append(f"cakeconv ({getattr(cakeconv, '__file__', '?')}) lacks {lacking}")
            cakeconv = None
    except Exception as exc:  # noqa: BLE001
        cakeconv = None
        notes.append(f"cakeconv did not import ({type(exc).__name__}: {exc})")
    provs = load_providers(torch, names, cakeconv, backend, device.type == "cuda", notes)
    for n in notes:
        log("note: " + n)
    if not provs:
        raise SystemExit("no provider available")
    env = environment(torch, device, cakeconv, provs)
    env["ours_backend"] = backend
    env["doc_mixes"] = mixes
    env["chain"] = chain
    env["calls_per_sample"] = n_calls
    l2 = env["l2_bytes"] or 60 * 2**20
    ahead_text = str(args.host_ahead_us).strip().lower()
    ahead_auto = ahead_text == "auto"
    try:
        base_ahead_us = HOST_AHEAD_MIN_US if ahead_auto else float(ahead_text)
    except ValueError:
        raise SystemExit(f"--host-ahead-us must be 'auto' or a number of microseconds, got {args.host_ahead_us!r}")
    env["host_ahead"] = "auto" if ahead_auto else base_ahead_us
    timer = Timer(device, flush=not args.no_flush, host_ahead_us=base_ahead_us)
    sync = timer.sync

    copy_bytes = args.copy_bytes if not args.dry_run else 64 * 2**20
    copy_gbs_0, copy_all_0 = measure_copy_bandwidth(torch, device, timer, copy_bytes, 10)
    log(f"copy bandwidth (start): {copy_gbs_0:.0f} GB/s (read + write, median of 10)")
    partial_path = os.path.join(args.out, FILE_STEM + ".partial.jsonl")
    os.makedirs(args.out, exist_ok=True)
    with open(partial_path, "w") as f:  # rows follow as they are measured (plot_results.py reads this file too)
        f.write(json.dumps({"kind": "env", **env, "copy_gbs_start": copy_gbs_0, "partial": True}) + "\n")
    log(f"{env['gpu']}  torch {env['torch']}  triton {env['triton']}  providers {[p.name for p in provs]}  "
        f"mixes {mixes}  shapes {len(shapes) if (passes or eager_modes) else 0}  bias {bias_variants}  passes {passes}  "
        f"reps {reps} (+{warmup} warm-up)  eager {eager_modes or 'off'}  host cost {'on' if args.host_cost else 'off'}")

    results: list[dict] = []  # raw timings, the rows are built once the copy bandwidth is final
    checks: list[dict] = []

    def record(r):
        results.append(r)
        # Written as we go, so a run cut short by a time limit still leaves its rows.
        with open(partial_path, "a") as f:
            f.write(json.dumps({"kind": "partial", **{k: v for k, v in r.items() if k != "times"},
                                "median_ms": statistics.median(r["times"]), "n": len(r["times"])}) + "\n")

    grid = [(mix, S, C) for mix in mixes for S, C in shapes] if (passes or eager_modes) else []
    total_w = sum(S * C for _, S, C in grid) * len(bias_variants)
    done_w = 0
    counter = 0
    for i_shape, (mix, S, C) in enumerate(grid):
        sh = make_shape(torch, S, C, device, args.seed, args.mean_doc_len, l2, args.max_sets, mix=mix)
        base = {"mix": mix, "S": S, "C": C, "n_docs": sh.n_docs, "doc_min": sh.doc_min, "doc_max": sh.doc_max}
        live = []
        for p in provs:
            try:
                p.prepare_shape(sh)
                live.append(p)
            except Exception as exc:  # noqa: BLE001
                msg = f"{p.name} failed to prepare {mix} S={S} C={C}: {type(exc).__name__}: {exc}"
                notes.append(msg)
                log("note: " + msg)
        for use_bias in bias_variants:
            tag = f"[{i_shape + 1}/{len(grid)}] {mix} S={S} C={C} bias={'yes' if use_bias else 'no'}"
            active = []
            for p in live:
                try:
                    p.prepare_bias(sh, use_bias, need_bwd_graph="bwd" in passes)
                    active.append(p)
                except Exception as exc:  # noqa: BLE001
                    msg = f"{p.name} failed {mix} S={S} C={C} bias={use_bias}: {type(exc).__name__}: {exc}"
                    notes.append(msg)
                    log("note: " + msg)
            # correctness check (also the first compilation)
            if not args.no_check and active:
                log(f"{tag}: {sh.n_docs} documents ({sh.doc_min}-{sh.doc_max}); checking {[p.name for p in active]} "
                    "against the FP32 reference")
                x0, dy0 = sh.sets[0]
                ref = reference(torch, sh, x0, dy0, use_bias)
                y_by = {}
                same_by = {}  # ours and ours_search: every output, for the bitwise comparison
                for p in list(active):
                    try:
                        y, dx, dw, db = p.outputs(sh, use_bias)
                    except Exception as exc:  # noqa: BLE001
                        msg = f"{p.name} failed its check run {mix} S={S} C={C} bias={use_bias}: {type(exc).__name__}: {exc}"
                        notes.append(msg)
                        log("note: " + msg)
                        active.remove(p)
                        p.release_bias()
                        continue
                    errs = {
                        "y_rel": rel_err(torch, y, ref[0]),
                        "dx_rel": rel_err(torch, dx, ref[1]),
                        "dw_rel": rel_err(torch, dw, ref[2]),
                        "db_rel": rel_err(torch, db, ref[3]) if use_bias else None,
                    }
                    ok = all(v is not None and v <= CHECK_TOL for k, v in errs.items() if not (k == "db_rel" and not use_bias))
                    y_by[p.name] = y
                    if p.name in ("ours", "ours_search"):
                        same_by[p.name] = (y, dx, dw, db)
                    checks.append({"kind": "check", "mix": mix, "S": S, "C": C, "bias": use_bias, "provider": p.name,
                                   **errs, "ok": bool(ok)})
                if len(same_by) == 2:  # v12's segment indices change no bit of y, dx, dweight, dbias
                    pairs = list(zip(same_by["ours"], same_by["ours_search"]))
                    errs = {k: (None if a is None else 0.0 if torch.equal(a, c) else rel_err(torch, a, c))
                            for k, (a, c) in zip(("y_rel", "dx_rel", "dw_rel", "db_rel"), pairs)}
                    checks.append({"kind": "check", "mix": mix, "S": S, "C": C, "bias": use_bias,
                                   "provider": "ours_vs_ours_search", **errs,
                                   "ok": all(a is None and c is None or torch.equal(a, c) for a, c in pairs)})
                if "ours" in y_by and "fla" in y_by:
                    yo, yf = y_by["ours"].reshape(-1), y_by["fla"].reshape(-1)
                    d = max(float((yo[i:i + (1 << 24)].float() - yf[i:i + (1 << 24)].float()).abs().max())
                            for i in range(0, yo.numel(), 1 << 24)) if yo.numel() else 0.0
                    e = rel_err(torch, yo, yf)
                    checks.append({"kind": "check", "mix": mix, "S": S, "C": C, "bias": use_bias, "provider": "ours_vs_fla",
                                   "y_rel": e, "y_max_abs": d, "dx_rel": None, "dw_rel": None, "db_rel": None,
                                   "ok": bool(e <= CHECK_TOL)})
                del ref, y_by, same_by
            summary = []
            # GPU time: interleave providers and passes, rotate input sets
            calls = []
            for p in active:
                for p_ in passes:
                    calls.append((p, p_, p.callable_for(p_, sh, use_bias)))
            times = {(p.name, p_): [] for p, p_, _ in calls}
            host_times = {(p.name, p_): [] for p, p_, _ in calls}
            warm_host = {(p.name, p_): [] for p, p_, _ in calls}
            window_us = {(p.name, p_): base_ahead_us for p, p_, _ in calls}
            failed = set()
            n_sets = len(sh.sets)
            t_rounds = time.perf_counter()
            for r in range(warmup + reps if calls else 0):
                k = r % max(1, len(calls))
                handles = []
                for p, p_, fn in calls[k:] + calls[:k]:
                    if p.name in failed:
                        continue
                    i = counter % n_sets
                    counter += 1
                    try:
                        h = timer.time_call(lambda: fn(i), window_us[(p.name, p_)])
                    except Exception as exc:  # noqa: BLE001
                        msg = f"{p.name} {p_} failed {mix} S={S} C={C} bias={use_bias}: {type(exc).__name__}: {exc}"
                        notes.append(msg)
                        log("note: " + msg)
                        failed.add(p.name)
                        continue
                    handles.append(((p.name, p_), h))
                timer.sync()
                for key, h in handles:
                    ms, host_ms = timer.resolve(h)
                    if r >= warmup:
                        times[key].append(ms)
                        host_times[key].append(host_ms)
                    elif r >= 1 or warmup == 1:  # the first round compiles and autotunes
                        warm_host[key].append(host_ms)
                if ahead_auto and r == warmup - 1:
                    # the window per (provider, pass): 3x its host time to enqueue a call, so none leaks into the span
                    for key, hs in warm_host.items():
                        if hs:
                            window_us[key] = min(HOST_AHEAD_MAX_US, max(base_ahead_us, HOST_AHEAD_FACTOR * max(hs) * 1e3))
            for (name, p_), ts in times.items():
                if name in failed or not ts:
                    continue
                record({**base, "method": "gpu", "pass": p_, "provider": name, "bias": use_bias, "times": ts,
                        "host_ms": statistics.median(host_times[(name, p_)]), "n_sets": n_sets,
                        "host_ahead_us": window_us[(name, p_)] if timer.sleep_cycles else 0.0})
                summary.append(f"{name}:{PASS_LABEL[p_]}={statistics.median(ts):.3f}ms")
            calls = handles = None  # drop the closures (they hold this shape's tensors)
            # Eager loop at this shape (no host-ahead sleep, wall time)
            if eager_modes and (eager_c is None or C in eager_c):
                fits, why = eager_fits(torch, sh, chain, len(active))
                if not fits:
                    msg = f"eager loop skipped at {mix} S={S} C={C}: {why}"
                    notes.append(msg)
                    log("note: " + msg)
                else:
                    subjects = {}
                    for p in active:
                        if p.name == "ours_ag" and any(q.name == "ours" for q in active):
                            continue  # the same autograd op as ours' eager loop
                        try:
                            for mode, fn_calls in eager_subjects(torch, p, sh, use_bias, chain, eager_modes,
                                                                 n_calls).items():
                                subjects[(p.name, mode)] = fn_calls
                        except Exception as exc:  # noqa: BLE001
                            msg = f"{p.name} eager loop failed to set up {mix} S={S} C={C}: {type(exc).__name__}: {exc}"
                            notes.append(msg)
                            log("note: " + msg)

                    def on_error(key, exc, _mix=mix, _S=S, _C=C):
                        msg = f"{key[0]} eager {key[1]} failed {_mix} S={_S} C={_C}: {type(exc).__name__}: {exc}"
                        notes.append(msg)
                        log("note: " + msg)

                    eager = wall_rounds(subjects, eager_steps, eager_warmup, sync, on_error)
                    subjects = None
                    for (name, mode), ts in eager.items():
                        record({**base, "method": EAGER_METHOD[mode], "pass": "fwdbwd", "provider": name,
                                "bias": use_bias, "times": ts, "host_ms": 0.0, "chain": chain if mode == "chain" else 1,
                                "n_sets": 1})
                        summary.append(f"{name}:{EAGER_METHOD[mode]}={statistics.median(ts):.3f}ms/call")
            for p in active:
                p.release_bias()
            done_w += S * C
            el = time.perf_counter() - t_start
            eta = el / max(1, done_w) * (total_w - done_w)
            log(f"{tag}: {n_sets} sets, {sh.n_docs} docs, {time.perf_counter() - t_rounds:.1f}s  {'  '.join(summary)}  "
                f"elapsed {fmt_secs(el)} ETA {fmt_secs(eta)}")
        for p in provs:
            p.release_shape()
        del sh
        if device.type == "cuda":
            torch.cuda.empty_cache()

    if args.host_cost:
        host_cost(torch, device, provs, host_shape, host_steps, host_warmup, chain, n_calls, sync, args, l2, notes,
                  record)

    copy_gbs_1, copy_all_1 = measure_copy_bandwidth(torch, device, timer, copy_bytes, 10)
    # The higher of the two readings: a copy that slows down during the run (seen on the H200:
    # 4259 GB/s at the start, 3812 at the end of one run) must not inflate the fractions.
    copy_gbs = max(copy_gbs_0, copy_gbs_1)
    log(f"copy bandwidth (end): {copy_gbs_1:.0f} GB/s; used: {copy_gbs:.0f} GB/s (the higher reading)")
    env["copy_gbs"] = copy_gbs
    env["copy_gbs_start"] = copy_gbs_0
    env["copy_gbs_end"] = copy_gbs_1

    rows = build_rows(results, env, copy_gbs, reps, warmup, args)
    if device.type == "cuda" and timer.sleep_cycles:
        slow = [r for r in rows if r["method"] == "gpu" and r["host_ms"] > 0.8 * r["host_ahead_us"] * 1e-3]
        if slow:
            worst = sorted(slow, key=lambda r: -r["host_ms"])[:6]
            notes.append(
                f"{len(slow)} rows took the host longer than 80% of their host-ahead window to enqueue (host-bound, "
                "or a host sync inside the call): their spans include host time; worst: "
                + ", ".join(f"{r['provider']} {PASS_LABEL[r['pass']]} {r['mix']} S={r['S']} C={r['C']} "
                            f"{r['host_ms']:.2f} ms of {r['host_ahead_us'] / 1e3:.1f}" for r in worst))
        longer = sorted({(r["provider"], round(r["host_ahead_us"] / 1e3, 1)) for r in rows
                         if r["method"] == "gpu" and r["host_ahead_us"] > base_ahead_us})
        if longer:
            notes.append("host-ahead windows longer than %.1f ms (auto: 3x the host time of the call): " % (base_ahead_us / 1e3)
                         + ", ".join(f"{p} {w} ms" for p, w in longer[:12]))
    elapsed = time.perf_counter() - t_start
    os.makedirs(args.out, exist_ok=True)
    paths = write_outputs(rows, checks, env, notes, args.out, elapsed)
    if not args.no_plot:
        png = plot(rows, sweep_s, env, args.out, notes)
        if png:
            paths.append(png)
        png = plot_host_cost(rows, env, args.out, notes)
        if png:
            paths.append(png)
    table_path = os.path.join(args.out, FILE_STEM + "_table.txt")
    paths.append(table_path)
    text = format_table(rows, checks, env, notes, passes, bias_variants, sweep_s, paths, elapsed)
    with open(table_path, "w") as f:
        f.write(text + "\n")
    print(text, flush=True)
    return 0


def host_cost(torch, device, provs, host_shape, steps, warmup, chain, calls, sync, args, l2, notes, record):
    """Host cost per call at the tiny shape (one document, bf16, no bias), GPU idle: every provider's
    chain / step / no_grad items, ours' workspace entry points, and the baselines, interleaved."""
    S, C = host_shape
    sh = make_shape(torch, S, C, device, args.seed, args.mean_doc_len, l2, 1, mix="one")
    everyone = [p for p in provs if p.name != "ours_ag"] + [BaselineProvider(torch, n) for n in BASELINES]
    subjects = {}
    for p in everyone:
        try:
            p.prepare_shape(sh)
            for item, fn_calls in eager_subjects(torch, p, sh, False, chain, ("chain", "step", "nograd"), calls).items():
                subjects[(p.name, item)] = fn_calls
            for item, fn_calls in p.extra_host_items(sh, calls).items():
                subjects[(p.name, item)] = fn_calls
        except Exception as exc:  # noqa: BLE001
            msg = f"{p.name} host cost failed to set up: {type(exc).__name__}: {exc}"
            notes.append(msg)
            log("note: " + msg)
    log(f"host cost: S={S} C={C} one document, {len(subjects)} items, {steps} samples of {calls} calls (chain: {chain}) "
        f"(+{warmup} warm-up)")

    def on_error(key, exc):
        msg = f"{key[0]} host cost {key[1]} failed: {type(exc).__name__}: {exc}"
        notes.append(msg)
        log("note: " + msg)

    t0 = time.perf_counter()
    res = wall_rounds(subjects, steps, warmup, sync, on_error)
    subjects = None
    base = {"mix": "one", "S": S, "C": C, "n_docs": sh.n_docs, "doc_min": sh.doc_min, "doc_max": sh.doc_max}
    for (name, item), ts in res.items():
        record({**base, "method": HOST_METHOD[item], "pass": HOST_PASS[item], "provider": name, "bias": False,
                "times": ts, "host_ms": 0.0, "chain": chain if item == "chain" else 1, "n_sets": 1})
    log(f"host cost: {time.perf_counter() - t0:.1f}s  " + "  ".join(
        f"{n}:{i}={statistics.median(ts) * 1e3:.1f}us" for (n, i), ts in res.items()))
    for p in everyone:
        p.release_shape()


# --------------------------------------------------------------------------------------------------------------
# Rows and files
# --------------------------------------------------------------------------------------------------------------


def timing_row(env, copy_gbs, r, ms, ts=None, warmup=None, l2_flush=None, host_ahead_us=None):
    """One timing row: a measurement r (mix, method, S, C, pass, provider, bias, host_ms, n_docs, n_sets) with
    median ms (per call); ts (all samples) gives the percentiles and n when known (else r["n"])."""
    method = method_of(r)
    floor = FLOOR_FACTOR[r["pass"]] * r["S"] * r["C"] * 2
    gbs = floor / (ms * 1e-3) / 1e9
    return {
        "kind": "timing",
        "date": env["date"],
        "gpu": env["gpu"],
        "torch": env["torch"],
        "triton": env["triton"],
        "cakeconv": env["cakeconv"],
        "ours_backend": env["ours_backend"],
        "fla": env.get("fla"),
        "causal_conv1d": env.get("causal_conv1d"),
        "method": method,
        "mix": mix_of(r),
        "S": r["S"],
        "C": r["C"],
        "pass": r["pass"],
        "provider": r["provider"],
        "bias": r["bias"],
        "ms": ms,
        "us": ms * 1e3,
        "ms_p10": percentile(ts, 0.1) if ts else None,
        "ms_p90": percentile(ts, 0.9) if ts else None,
        "n": len(ts) if ts else r.get("n"),
        "warmup": warmup,
        "floor_bytes": floor,
        "gbs": gbs,
        "fraction": gbs / copy_gbs,
        "copy_gbs": copy_gbs,
        "host_ms": r.get("host_ms", 0.0),
        "n_docs": r.get("n_docs"),
        "doc_min": r.get("doc_min"),
        "doc_max": r.get("doc_max"),
        "n_sets": r.get("n_sets"),
        "chain": r.get("chain"),
        "l2_flush": l2_flush if method == "gpu" else False,
        "host_ahead_us": (host_ahead_us if host_ahead_us is not None else r.get("host_ahead_us")) if method == "gpu" else 0.0,
    }


def row_key(r, provider=None, method=None, pass_=None):
    return (mix_of(r), method or method_of(r), r["S"], r["C"], pass_ or r["pass"], r["bias"], provider or r["provider"])


def add_speedups(rows):
    """On our rows: speedup_vs_<peer> = the peer's time over ours (same mix, method, S, C, pass, bias).
    On eager rows: eager_vs_gpu = eager time per call / the same provider's GPU time of fwd+bwd.
    On host-cost rows: ratio_to_trivial = time per call / the trivial Function's for the same item."""
    by_key = {row_key(r): r["ms"] for r in rows}
    for row in rows:
        method = method_of(row)
        if row["provider"] not in PEERS + BASELINES:
            for peer in PEERS:
                pm = by_key.get(row_key(row, provider=peer))
                row[f"speedup_vs_{peer}"] = (pm / row["ms"]) if pm else None
        if method in ("eager", "eager_step"):
            g = by_key.get(row_key(row, method="gpu", pass_="fwdbwd"))
            row["eager_vs_gpu"] = (row["ms"] / g) if g else None
        if method.startswith("host_"):
            t = by_key.get(row_key(row, provider="trivial"))
            row["ratio_to_trivial"] = (row["ms"] / t) if t else None
    return rows


def build_rows(results, env, copy_gbs, reps, warmup, args):
    rows = []
    for r in results:
        gpu = method_of(r) == "gpu"
        rows.append(timing_row(env, copy_gbs, r, statistics.median(r["times"]), r["times"],
                               warmup if gpu else None, (not args.no_flush) if gpu else False,
                               r.get("host_ahead_us", 0.0) if gpu else 0.0))
    return add_speedups(rows)


CSV_FIELDS = ["date", "gpu", "torch", "triton", "cakeconv", "ours_backend", "fla", "causal_conv1d", "method", "mix",
              "S", "C", "pass", "provider", "bias", "ms", "us", "ms_p10", "ms_p90", "n", "floor_bytes", "gbs", "fraction",
              "copy_gbs", "speedup_vs_fla", "speedup_vs_dao", "eager_vs_gpu", "ratio_to_trivial", "host_ms", "n_docs",
              "doc_min", "doc_max", "n_sets", "chain", "host_ahead_us"]
FILE_STEM = "bench_cake_causal_conv1d_det"


def write_outputs(rows, checks, env, notes, out_dir, elapsed):
    jl = os.path.join(out_dir, FILE_STEM + ".jsonl")
    with open(jl, "w") as f:
        f.write(json.dumps({"kind": "env", **env, "elapsed_s": elapsed, "notes": notes}) + "\n")
        for r in rows:
            f.write(json.dumps(r) + "\n")
        for c in checks:
            f.write(json.dumps({**c, "date": env["date"], "gpu": env["gpu"]}) + "\n")
    cs = os.path.join(out_dir, FILE_STEM + ".csv")
    with open(cs, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        wr.writeheader()
        for r in rows:
            wr.writerow({k: r.get(k) for k in CSV_FIELDS})
    return [jl, cs]


# --------------------------------------------------------------------------------------------------------------
# Plots
# --------------------------------------------------------------------------------------------------------------


def _pyplot(notes):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:  # noqa: BLE001
        notes.append(f"plot skipped: matplotlib did not import ({exc})")
        return None
    return plt


def target_steps(mix, pass_):
    """[(C_lo, C_hi or None, target)] of SPEC section 7 for a GPU-time pass at a mix."""
    if mix == "seed":
        out = []
        if pass_ in TARGETS_SMALL_C:
            out.append((0, SMALL_C_BELOW, TARGETS_SMALL_C[pass_]))
        out.append((SMALL_C_BELOW, None, TARGETS[pass_]))
        return out
    if is_short_mix(mix) and pass_ in TARGETS_SHORT_DOCS:
        return [(SMALL_C_BELOW, None, TARGETS_SHORT_DOCS[pass_])]
    return []


def plot(rows, sweep_s, env, out_dir, notes):
    """Fraction of copy bandwidth against C at S = sweep_s: one row of panels per document mix, one panel per
    GPU-time pass (and one for the eager loop, whose per-call floor is fwd+bwd's), one line per provider."""
    sel = [r for r in rows if r["S"] == sweep_s and method_of(r) in ("gpu", "eager", "eager_step")]
    if not sel:
        notes.append(f"plot skipped: no GPU-time or eager rows at S={sweep_s}")
        return None
    plt = _pyplot(notes)
    if plt is None:
        return None
    mixes = []
    for r in sel:
        if mix_of(r) not in mixes:
            mixes.append(mix_of(r))
    cols = [("gpu", p) for p in PASSES if any(method_of(r) == "gpu" and r["pass"] == p for r in sel)]
    cols += [(m, "fwdbwd") for m in ("eager", "eager_step") if any(method_of(r) == m for r in sel)]
    fig, axes = plt.subplots(len(mixes), len(cols), figsize=(5.0 * len(cols), 3.9 * len(mixes)), squeeze=False)
    colors = {"ours": "tab:blue", "ours_search": "tab:purple", "ours_ag": "tab:cyan", "fla": "tab:orange",
              "dao": "tab:green"}
    for i, mix in enumerate(mixes):
        docs = {r["C"]: r.get("n_docs") for r in sel if mix_of(r) == mix and r.get("n_docs")}
        n_docs = sorted(v for v in docs.values() if v)
        for j, (method, p_) in enumerate(cols):
            ax = axes[i][j]
            cur = [r for r in sel if mix_of(r) == mix and method_of(r) == method and r["pass"] == p_]
            if not cur:
                ax.axis("off")
                continue
            for prov in ALL_PROVIDERS:
                for bias in (False, True):
                    pts = sorted((r["C"], r["fraction"]) for r in cur if r["provider"] == prov and r["bias"] == bias)
                    if not pts:
                        continue
                    ax.plot([c for c, _ in pts], [f for _, f in pts], marker="o", ms=3,
                            color=colors.get(prov), linestyle="--" if bias else "-",
                            label=f"{prov}{' +bias' if bias else ''}")
                    if method != "gpu":  # the same provider's GPU time of fwd+bwd, for comparison
                        gpts = sorted((r["C"], r["fraction"]) for r in sel if mix_of(r) == mix and method_of(r) == "gpu"
                                      and r["pass"] == "fwdbwd" and r["provider"] == prov and r["bias"] == bias
                                      and r["C"] in {c for c, _ in pts})
                        if gpts:
                            ax.plot([c for c, _ in gpts], [f for _, f in gpts], color=colors.get(prov), lw=0.8,
                                    linestyle=":", label=f"{prov}{' +bias' if bias else ''} GPU time")
            cs = sorted({r["C"] for r in cur}) or sorted({r["C"] for r in sel})
            if method == "gpu" and cs:
                for lo, hi, t in target_steps(mix, p_):
                    x0, x1 = max(lo, cs[0]), (hi if hi is not None else max(cs[-1], SMALL_C_BELOW))
                    if x1 > x0 or (hi is None and x1 >= x0):
                        ax.hlines(t, x0, x1, color="gray", lw=0.8, ls=":")
            if cs:
                ax.set_xscale("log", base=2)
                ax.set_xticks(cs)
                ax.set_xticklabels([str(c) for c in cs], rotation=60, fontsize=7)
                ax.minorticks_off()
            ax.set_xlabel("C (channels)")
            ax.set_ylabel("fraction of copy bandwidth")
            ax.set_ylim(0, 1.05)
            what = PASS_LABEL[p_] if method == "gpu" else METHOD_LABEL[method] + " (per call, fwd+bwd floor)"
            docs_txt = (f"{n_docs[0]}" if len(set(n_docs)) == 1 else f"{n_docs[0]}-{n_docs[-1]}") if n_docs else "?"
            ax.set_title(f"{what}\n{mix} ({docs_txt} docs), S={sweep_s}", fontsize=9)
            ax.grid(True, alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
    fig.suptitle(f"{env['gpu']}, copy {env['copy_gbs']:.0f} GB/s, {env['date']}", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.3 / (3.9 * len(mixes))))
    path = os.path.join(out_dir, FILE_STEM + "_fraction_vs_C.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_host_cost(rows, env, out_dir, notes):
    """Host cost per call (us) at the tiny shape: one group of bars per item, one bar per provider."""
    sel = [r for r in rows if method_of(r).startswith("host_")]
    if not sel:
        return None
    plt = _pyplot(notes)
    if plt is None:
        return None
    items = [m for m in (HOST_METHOD[i] for i in HOST_ITEMS) if any(method_of(r) == m for r in sel)]
    provs = [p for p in PROVIDER_ORDER if any(r["provider"] == p for r in sel)]
    colors = {"ours": "tab:blue", "fla": "tab:orange", "dao": "tab:green", "trivial": "tab:gray", "silu": "tab:olive"}
    fig, ax = plt.subplots(figsize=(2.2 + 2.0 * len(items), 4.2))
    width = 0.8 / max(1, len(provs))
    for k, prov in enumerate(provs):
        xs, hs = [], []
        for i, item in enumerate(items):
            r = next((r for r in sel if method_of(r) == item and r["provider"] == prov), None)
            if r is not None:
                xs.append(i + (k - (len(provs) - 1) / 2) * width)
                hs.append(r["us"])
        bars = ax.bar(xs, hs, width, label=prov, color=colors.get(prov))
        for b_, h in zip(bars, hs):
            ax.annotate(f"{h:.0f}", (b_.get_x() + b_.get_width() / 2, h), ha="center", va="bottom", fontsize=6)
    ax.set_xticks(range(len(items)))
    ax.set_xticklabels([METHOD_LABEL[m] for m in items], fontsize=8)
    ax.set_ylabel("host time per call (us)")
    S, C = sel[0]["S"], sel[0]["C"]
    ax.set_title(f"host cost per call, S={S} C={C} one document (GPU idle); chain of {sel[0].get('chain') or '?'}",
                 fontsize=9)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=7)
    fig.suptitle(f"{env['gpu']}, {env['date']}", fontsize=9)
    fig.tight_layout()
    path = os.path.join(out_dir, FILE_STEM + "_host_cost.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------------------------------


def _check_lines(checks):
    out = []
    bad = [c for c in checks if not c["ok"]]
    if not checks:
        return out
    worst = {}
    for c in checks:
        if c["provider"] == "ours_vs_fla":
            continue
        for k in ("y_rel", "dx_rel", "dw_rel", "db_rel"):
            v = c.get(k)
            if v is not None:
                worst[(c["provider"], k)] = max(worst.get((c["provider"], k), 0.0), v)
    byp = {}
    for (p, k), v in worst.items():
        byp.setdefault(p, []).append(f"{k[:-4]} {v:.1e}")
    out.append("# check vs FP32 reference (worst rel. L2 error, tol %.0e): " % CHECK_TOL
               + "; ".join(f"{p}: {', '.join(v)}" for p, v in byp.items())
               + (f"  ** {len(bad)} FAILED **" if bad else "  all ok"))
    ovf = [c for c in checks if c["provider"] == "ours_vs_fla"]
    if ovf:
        out.append(f"# ours y vs fla y: worst rel {max(c['y_rel'] for c in ovf):.1e}, "
                   f"worst max|diff| {max(c['y_max_abs'] for c in ovf):.3g}")
    for c in bad[:10]:
        out.append(f"#   FAILED check: {c}")
    return out


def _gpu_table(rows, passes, bias_variants):
    out = []
    gpu = [r for r in rows if method_of(r) == "gpu"]
    idx = {row_key(r): r for r in gpu}
    provs = [p for p in ALL_PROVIDERS if any(r["provider"] == p for r in gpu)]
    ours_like = [p for p in provs if p not in PEERS]
    peers = [p for p in provs if p in PEERS]
    keys = []
    for r in gpu:
        k = (mix_of(r), r["S"], r["C"])
        if k not in keys:
            keys.append(k)
    mixes = []
    for m, _, _ in keys:
        if m not in mixes:
            mixes.append(m)
    for mix in mixes:
        for bias in bias_variants:
            out.append("")
            docs = sorted({r["n_docs"] for r in gpu if mix_of(r) == mix and r.get("n_docs")})
            out.append(f"== GPU time, {mix} ({docs[0] if len(docs) == 1 else f'{docs[0]}-{docs[-1]}' if docs else '?'} "
                       f"documents), {'bias' if bias else 'no bias'} ==")
            head = f"{'S':>7} {'C':>5} {'pass':<7}"
            for p in ours_like:
                head += f" | {p + ' ms':>10} {'GB/s':>5} {'f':>4}"
            for p in peers:
                head += f" | {p + ' ms':>9} {'GB/s':>5} {'f':>4}" + "".join(
                    f" {('x' + p) if o == 'ours' else (o[-2:] + '/' + p):>6}" for o in ours_like)
            out.append(head)
            for m, S, C in keys:
                if m != mix:
                    continue
                for p_ in passes:
                    line = f"{S:>7} {C:>5} {PASS_LABEL[p_]:<7}"
                    any_row = False
                    for p in ours_like:
                        r = idx.get((mix, "gpu", S, C, p_, bias, p))
                        if r:
                            any_row = True
                            gbs = f"{r['gbs']:>5.0f}" if r["gbs"] >= 10 else f"{r['gbs']:>5.2f}"
                            line += f" | {r['ms']:>10.4f} {gbs} {r['fraction']:>4.2f}"
                        else:
                            line += f" | {'-':>10} {'-':>5} {'-':>4}"
                    for p in peers:
                        r = idx.get((mix, "gpu", S, C, p_, bias, p))
                        if r:
                            any_row = True
                            line += f" | {r['ms']:>9.3f} {r['gbs']:>5.0f} {r['fraction']:>4.2f}"
                            for o in ours_like:
                                ro = idx.get((mix, "gpu", S, C, p_, bias, o))
                                line += f" {ro['speedup_vs_' + p]:>5.1f}x" if ro and ro.get("speedup_vs_" + p) else f" {'-':>6}"
                        else:
                            line += f" | {'-':>9} {'-':>5} {'-':>4}" + "".join(f" {'-':>6}" for _ in ours_like)
                    if any_row:
                        out.append(line)
    return out


def _eager_table(rows):
    ev = [r for r in rows if method_of(r) in ("eager", "eager_step")]
    if not ev:
        return []
    idx = {row_key(r): r for r in rows}
    provs = [p for p in PROVIDER_ORDER if any(r["provider"] == p for r in ev)]
    chain = next((r.get("chain") for r in ev if method_of(r) == "eager"), None)
    out = ["", f"== eager loop (no host-ahead sleep; wall time per call; f = 10*S*C / time / copy): GPU = GPU time of "
               f"fwd+bwd, chain = {chain or '-'}-call chain per step / {chain or '-'}, step = one call + backward per "
               "step; e/g = chain / GPU =="]
    head = f"{'mix':<15} {'S':>7} {'C':>5} {'bias':<4}"
    for p in provs:
        head += f" | {p + ' GPU ms':>11} {'chain ms':>9} {'f':>4} {'e/g':>5} {'step ms':>8} {'f':>4}"
    out.append(head)
    keys = []
    for r in ev:
        k = (mix_of(r), r["S"], r["C"], r["bias"])
        if k not in keys:
            keys.append(k)
    for mix, S, C, bias in keys:
        line = f"{mix:<15} {S:>7} {C:>5} {'yes' if bias else 'no':<4}"
        for p in provs:
            g = idx.get((mix, "gpu", S, C, "fwdbwd", bias, p))
            e = idx.get((mix, "eager", S, C, "fwdbwd", bias, p))
            s = idx.get((mix, "eager_step", S, C, "fwdbwd", bias, p))
            line += f" | {g['ms']:>11.4f}" if g else f" | {'-':>11}"
            line += f" {e['ms']:>9.4f} {e['fraction']:>4.2f}" if e else f" {'-':>9} {'-':>4}"
            line += f" {e['eager_vs_gpu']:>5.2f}" if e and e.get("eager_vs_gpu") else f" {'-':>5}"
            line += f" {s['ms']:>8.4f} {s['fraction']:>4.2f}" if s else f" {'-':>8} {'-':>4}"
        out.append(line)
    return out


def _mix_summary(rows):
    """Per mix and C: fwd and fwd+bwd fractions (GPU time, no bias when present) for each provider."""
    gpu = [r for r in rows if method_of(r) == "gpu" and r["pass"] in ("fwd", "fwdbwd")]
    mixes = []
    for r in gpu:
        if mix_of(r) not in mixes:
            mixes.append(mix_of(r))
    if len(mixes) < 2:
        return []
    provs = [p for p in ALL_PROVIDERS if any(r["provider"] == p for r in gpu)]
    bias = False if any(not r["bias"] for r in gpu) else True
    idx = {row_key(r): r for r in gpu}
    out = ["", f"== document mixes, GPU time, {'bias' if bias else 'no bias'}: fraction of copy, fwd / fwd+bwd =="]
    head = f"{'mix':<15} {'docs':>6} {'S':>7} {'C':>5}" + "".join(f" | {p:>11}" for p in provs)
    out.append(head)
    keys = []
    for r in gpu:
        k = (mix_of(r), r["S"], r["C"])
        if k not in keys:
            keys.append(k)
    for mix, S, C in sorted(keys, key=lambda k: (mixes.index(k[0]), k[2], k[1])):
        any_r = next((r for r in gpu if (mix_of(r), r["S"], r["C"]) == (mix, S, C)), None)
        line = f"{mix:<15} {any_r.get('n_docs') or '-':>6} {S:>7} {C:>5}"
        for p in provs:
            f = idx.get((mix, "gpu", S, C, "fwd", bias, p))
            fb = idx.get((mix, "gpu", S, C, "fwdbwd", bias, p))
            txt = f"{f['fraction']:.2f}" if f else "-"
            txt += " / " + (f"{fb['fraction']:.2f}" if fb else "-")
            line += f" | {txt:>11}"
        out.append(line)
    return out


def _host_table(rows):
    hv = [r for r in rows if method_of(r).startswith("host_")]
    if not hv:
        return []
    idx = {(method_of(r), r["provider"]): r for r in hv}
    provs = [p for p in PROVIDER_ORDER if any(r["provider"] == p for r in hv)]
    items = [HOST_METHOD[i] for i in HOST_ITEMS if any(method_of(r) == HOST_METHOD[i] for r in hv)]
    S, C, chain = hv[0]["S"], hv[0]["C"], next((r.get("chain") for r in hv if method_of(r) == "host_chain"), None)
    out = ["", f"== host cost per call, S={S} C={C} one document, bf16, GPU idle (us per call; xT = ratio to the "
               f"trivial autograd.Function; chain = {chain}) =="]
    out.append(f"{'provider':<9}" + "".join(f" | {METHOD_LABEL[m]:>30}" for m in items))
    for p in provs:
        line = f"{p:<9}"
        for m in items:
            r = idx.get((m, p))
            if r:
                txt = f"{r['us']:.1f}" + (f" ({r['ratio_to_trivial']:.1f}xT)" if r.get("ratio_to_trivial") else "")
                line += f" | {txt:>30}"
            else:
                line += f" | {'-':>30}"
        out.append(line)
    return out


def _target_lines(rows, sweep_s, env):
    if env["gpu"].startswith("cpu"):
        return []
    out = []
    gpu = [r for r in rows if method_of(r) == "gpu" and r["provider"] == "ours"]
    by_mix = {}
    for r in gpu:
        by_mix.setdefault(mix_of(r), []).append(r)
    for mix, sel in by_mix.items():
        miss, checked = [], 0
        for r in sel:
            for lo, hi, t in target_steps(mix, r["pass"]):
                if r["C"] >= lo and (hi is None or r["C"] < hi):
                    checked += 1
                    if r["fraction"] < t:
                        miss.append(f"{PASS_LABEL[r['pass']]}{'+b' if r['bias'] else ''} S{r['S']} C{r['C']}:"
                                    f"{r['fraction']:.3f}<{t:.2f}")
        if checked:
            out.append(f"# ours GPU time vs SPEC 7, {mix}: {checked} checks, "
                       + (f"MISS {len(miss)}: " + " ".join(miss[:12]) + (" ..." if len(miss) > 12 else "") if miss else "all met"))
    ev = [r for r in rows if method_of(r) == "eager" and r["provider"] == "ours" and mix_of(r) == "seed"
          and r["C"] in EAGER_TARGET_C and r.get("eager_vs_gpu")]
    if ev:
        out.append("# ours eager loop vs SPEC 7 (seed mix, C = 128 and 512, chain time per call <= 1.05 x GPU time): "
                   + ", ".join(f"C{r['C']}{'+b' if r['bias'] else ''} {r['eager_vs_gpu']:.2f}x"
                               + ("" if r["eager_vs_gpu"] <= EAGER_TARGET else " MISS") for r in ev))
    host = {method_of(r): r for r in rows if method_of(r).startswith("host_") and r["provider"] == "ours"}
    parts = []
    if "host_chain" in host and host["host_chain"].get("ratio_to_trivial"):
        v = host["host_chain"]["ratio_to_trivial"]
        parts.append(f"chain {v:.1f}x trivial (<= {HOST_TARGETS['chain_ratio']:.1f}x){'' if v <= HOST_TARGETS['chain_ratio'] else ' MISS'}")
    if "host_nograd" in host:
        v = host["host_nograd"]["us"]
        parts.append(f"no_grad forward {v:.1f} us (<= {HOST_TARGETS['nograd_us']:.0f}){'' if v <= HOST_TARGETS['nograd_us'] else ' MISS'}")
    if "host_ws" in host:
        v = host["host_ws"]["us"]
        parts.append(f"entry points fwd+bwd {v:.1f} us (<= {HOST_TARGETS['ws_us']:.0f}){'' if v <= HOST_TARGETS['ws_us'] else ' MISS'}")
    if parts:
        out.append("# ours host cost vs SPEC 7: " + "; ".join(parts))
    return out


def format_table(rows, checks, env, notes, passes, bias_variants, sweep_s, paths, elapsed) -> str:
    out = []
    out.append(f"# {env['gpu']} | torch {env['torch']} | triton {env['triton']} | cakeconv {env['cakeconv']} "
               f"({env['ours_backend']}) | fla {env.get('fla')} | dao {env.get('causal_conv1d')} | {env['date']}")
    out.append(f"# copy bandwidth {env['copy_gbs']:.0f} GB/s (start {env['copy_gbs_start']:.0f}, end "
               f"{env['copy_gbs_end']:.0f}); floor bytes fwd 4SC, bwd 6SC, fwd+bwd 10SC; ms = median; "
               f"f = fraction of copy; xN = peer time / ours")
    out += _check_lines(checks)
    out += _gpu_table(rows, passes, bias_variants)
    out += _eager_table(rows)
    out += _mix_summary(rows)
    out += _host_table(rows)
    out.append("")
    out += _target_lines(rows, sweep_s, env)
    for n in notes:
        out.append(f"# note: {n}")
    out.append(f"# wrote: {', '.join(paths)}")
    out.append(f"# time taken: {elapsed:.1f} s")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
