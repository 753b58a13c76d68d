"""The op benchmark: cakeconv's deterministic packed causal conv1d (W = 2..8, SiLU or none) beside its peers, one GPU.

    python -m benchmarks.op                          the grid, every provider, with and without bias
    python -m benchmarks.op --dry-run --width 3,8 --activation silu,none     CPU, reference backend, tiny shapes
    python -m benchmarks.op --replot benchmarks/results/h200_mixes.jsonl --out /tmp/x

Floor bytes (bf16 x): fwd 4*S*C, bwd 6*S*C, fwd+bwd 10*S*C; fraction = floor bytes / median time / copy bandwidth
(the higher of the start and end readings). GPU time, eager loop and host cost after a check against an FP32
reference (benchmarks/README.md). Writes <name>.jsonl, .csv, _table.txt, .png, .partial.jsonl."""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import math
import os
import random
import re
import statistics
import sys
import time
import zlib

import torch

from benchmarks.report import (BASE_WA, PASS_LABEL, PASSES, PEERS, PROVIDERS, REPO_ROOT, choices, fmt_secs, log, note,
                               op_plots, op_table, package_version, read_jsonl, row_key, run_environment, write_csv,
                               write_jsonl)
from benchmarks.timing import (HOST_AHEAD_MIN_US, DeviceClock, copy_bandwidth, eager_forms, percentile, time_gpu,
                               wall_samples)

DEFAULT_MIX = "seed"
SEED_MEAN_LEN = 3000


def _fill(S: int, draw) -> list[int]:
    """Lengths draw() until they sum to S (the last one cut)."""
    lens, total = [], 0
    while total < S:
        lens.append(min(draw(), S - total))
        total += lens[-1]
    return lens


def parse_mix(token: str) -> str:
    """The canonical name of one --doc-mix token (raises SystemExit on a bad one)."""
    t = token.strip().lower()
    m = re.fullmatch(r"(seed|ones|one)|uniform:(\d+)-(\d+)|(fixed|docs):(\d+)", t)
    if m and m[1]:
        return t
    if m and m[2] and 1 <= int(m[2]) <= int(m[3]):
        return f"uniform:{int(m[2])}-{int(m[3])}"
    if m and m[4] and int(m[5]) >= 1:
        return f"{m[4]}:{int(m[5])}"
    raise SystemExit(f"unknown --doc-mix {token!r}: use seed, uniform:A-B, ones, fixed:N, docs:N or one")


def parse_mixes(values) -> list[str]:
    """The mixes of comma lists (the option may repeat), each once, in order; [seed] when none."""
    out = [parse_mix(tok) for v in values or [DEFAULT_MIX] for tok in v.split(",") if tok.strip()]
    return list(dict.fromkeys(out)) or [DEFAULT_MIX]


def mix_lengths(mix: str, S: int, seed: int, mean_len: int = SEED_MEAN_LEN) -> list[int]:
    """Document lengths of ``mix`` (a --doc-mix token) summing to S > 0 (seed: the shape's seed)."""
    mix = parse_mix(mix)
    if mix == "seed":  # 85% exponential around mean_len (capped at 8x it), 15% short documents of 1..63 tokens
        rng = random.Random(seed)
        return _fill(S, lambda: rng.randint(1, 63) if rng.random() < 0.15 else min(
            64 + int(rng.expovariate(1.0 / max(1, mean_len - 64))), 8 * mean_len))
    if mix in ("one", "ones"):
        return [S] if mix == "one" else [1] * S
    if mix.startswith("fixed:"):
        n = int(mix.split(":")[1])
        return [n] * (S // n) + ([S % n] if S % n else [])
    if mix.startswith("docs:"):  # N documents: N - 1 random cut points
        cuts = random.Random(seed).sample(range(1, S), min(int(mix.split(":")[1]), S) - 1)
        return [b - a for a, b in itertools.pairwise([0, *sorted(cuts), S])]
    lo, hi = (int(v) for v in mix.split(":")[1].split("-"))  # uniform:A-B
    rng = random.Random(seed * 7919 + zlib.crc32(mix.encode()))
    return _fill(S, lambda: rng.randint(lo, hi))


def mix_cu(S: int, mix: str, seed: int, device="cuda"):
    """cu_seqlens (int32 [N+1], on ``device``) of the benchmark's document mix ``mix`` (a --doc-mix token)."""
    return torch.tensor([0] + mix_lengths(mix, S, seed), dtype=torch.int64).cumsum(0).to(torch.int32).to(device)


def sweep_cu(S: int, seed: int, mean: int = SEED_MEAN_LEN, device="cuda"):
    """cu_seqlens of the sweep's mix: lengths uniform in 1..2*mean-1 (one document if mean >= S)."""
    g, cuts = torch.Generator().manual_seed(seed), [0]
    while cuts[-1] < S:
        step = S if mean >= S else int(torch.randint(1, 2 * mean, (), generator=g))
        cuts.append(min(S, cuts[-1] + step))
    return torch.tensor(cuts, dtype=torch.int32, device=device)


FLOOR_FACTOR = {"fwd": 2, "bwd": 3, "fwdbwd": 5}  # x S*C*itemsize(x): 4, 6, 10 bytes per element in bf16
WIDTHS, ACTIVATIONS = tuple(range(2, 9)), ("silu", "none")
BASELINES = ("trivial", "silu")  # the host cost's baselines
EAGER_METHOD = {"chain": "eager", "step": "eager_step"}  # the eager forms; the host-cost items and their pass:
HOST_PASS = {"chain": "fwdbwd", "step": "fwdbwd", "nograd": "fwd", "ws": "fwdbwd"}
# (run, --dry-run): calls per chain step; calls per one-call sample; eager and host-cost samples, warm-up first
PROTOCOL = {"chain": (16, 4), "calls": (16, 2), "eager_steps": (10, 2), "eager_warmup": (2, 1), "host_steps": (30, 2),
            "host_warmup": (5, 1), "host_shape": ((4096, 256), (256, 16)), "mean_doc_len": (SEED_MEAN_LEN, 200),
            "copy_bytes": (2 * 2**30, 64 * 2**20)}
# SPEC 7's GPU-time targets (fraction of copy) {(seed or short documents, pass): [(C_lo, C_hi or None, target)]}
TARGETS = {("seed", "fwd"): [(512, None, 0.90)], ("seed", "bwd"): [(512, None, 0.85)],
           ("seed", "fwdbwd"): [(0, 512, 0.80), (512, None, 0.85)],
           ("short", "fwd"): [(512, None, 0.85)], ("short", "fwdbwd"): [(512, None, 0.80)]}
EAGER_TARGET, EAGER_TARGET_C = 1.05, (128, 512)  # eager chain per call <= 1.05 x GPU time (seed mix)
HOST_TARGETS = {"host_chain": (2.0, "ratio_to_trivial", "chain {:.1f}x trivial (<= {:.1f}x)"),  # ours: at most
                "host_nograd": (25.0, "us", "no_grad forward {:.1f} us (<= {:.0f})"),
                "host_ws": (40.0, "us", "entry points fwd+bwd {:.1f} us (<= {:.0f})")}
WIDTH_TOLERANCE = 0.97  # every (W, activation): ours' fraction >= 0.97 x W = 4 + SiLU's
CHECK_TOL = 1e-2
CHUNK = 1 << 24  # elements per chunk of a comparison (the big shapes hold 2e9)
SWEEP_S = 250340
GRID = ([(s, 512) for s in (239718, 245028, 249866, 250340, 258574, 259042, 259584, 261393)]
        + [(SWEEP_S, c) for c in (128, 256, 1024, 1280, 1344, 1160, 1536, 2048, 2560, 4096, 8192)]
        + [(262144, c) for c in (1160, 1280, 1536)])
DRY_SWEEP_S, DRY_SHAPES = 1531, [(1531, 16), (1531, 64), (1531, 200), (2053, 64)]
ENV_FIELDS = ("date", "commit", "gpu", "torch", "triton", "cakeconv", "ours_backend", "fla", "causal_conv1d")
CSV_FIELDS = list(ENV_FIELDS) + [
    "method", "mix", "S", "C", "width", "activation", "pass", "provider", "bias", "ms", "us", "ms_p10", "ms_p90", "n",
    "floor_bytes", "gbs", "fraction", "copy_gbs", "speedup_vs_fla", "speedup_vs_dao", "speedup_vs_dao_det",
    "eager_vs_gpu", "ratio_to_trivial", "host_ms", "n_docs", "doc_min", "doc_max", "n_sets", "chain", "host_ahead_us"]


def target_steps(mix: str, pass_: str) -> list:
    """[(C_lo, C_hi or None, target)] of SPEC 7 for a GPU-time pass at a mix (short: uniform up to 1-1024, ones)."""
    short = mix == "ones" or (mix.startswith("uniform:") and int(mix.split("-")[-1]) <= 1024)
    return TARGETS.get(("seed" if mix == "seed" else "short" if short else None, pass_), [])


def shape_seed(seed: int, S: int, C: int) -> int:
    return seed * 1_000_003 + S * 131 + C


def _normal(gen, shape, scale=None):
    """randn(shape) in fp32 from gen (on its device): rounded to bf16 (scale None), or times scale (fp32)."""
    t = torch.randn(*shape, generator=gen, device=gen.device, dtype=torch.float32)
    return t.to(torch.bfloat16) if scale is None else (t * scale).contiguous()


class Shape:
    """One shape's inputs, the same for every provider: 2..max_sets (x, dy) sets bf16 N(0, 1), enough for 8x the L2;
    taps [C, W] N(0, 0.25), bias N(0, 0.04), drawn after the sets for every W (so W = 4 keeps its older draws)."""

    def __init__(self, S, C, device, seed, mean_doc_len, l2_bytes, max_sets, mix):
        self.S, self.C, self.device, self.mix, self.extra = S, C, device, mix, {}
        self.lengths = mix_lengths(mix, S, shape_seed(seed, S, C), mean_doc_len)
        self.n_docs, self.doc_min, self.doc_max = len(self.lengths), min(self.lengths), max(self.lengths)
        self.cu = torch.tensor(list(itertools.accumulate(self.lengths, initial=0)), dtype=torch.int32, device=device)
        doc = torch.arange(self.n_docs, device=device).repeat_interleave(torch.tensor(self.lengths, device=device))
        self.seq_idx, self.pos = doc.to(torch.int32).view(1, S), torch.arange(S, device=device) - self.cu.long()[doc]
        gen = torch.Generator(device=device).manual_seed(shape_seed(seed, S, C))
        self.sets = [(_normal(gen, (S, C)), _normal(gen, (S, C)))
                     for _ in range(max(2, min(max_sets, math.ceil(8 * l2_bytes / max(1, 2 * S * C * 2)))))]
        self.taps_state = gen.get_state()
        self.use_taps(*BASE_WA)

    def use_taps(self, width: int, act: str) -> None:
        """Taps [C, width] and bias of this width (see the class docstring), and the activation label act."""
        gen = torch.Generator(device=self.device)
        gen.set_state(self.taps_state)
        self.w, self.b = _normal(gen, (self.C, width), 0.5), _normal(gen, (self.C,), 0.2)
        self.width, self.act, self.activation = width, act, None if act == "none" else act

    def chain_params(self, chain: int, use_bias: bool):
        """``chain`` distinct taps (and biases) for the eager loop, the same for every provider (one seed)."""
        gen = torch.Generator(device=self.device).manual_seed(shape_seed(0, self.S, self.C) + 17)
        ws = [_normal(gen, (self.C, self.width), 0.5) for _ in range(chain)]
        return ws, [_normal(gen, (self.C,), 0.2) if use_bias else None for _ in range(chain)]

    def where(self, use_bias=None) -> str:
        return f"{self.mix} S={self.S} C={self.C}" + ("" if use_bias is None else (
            f" W={self.width} {self.activation or 'no activation'} bias={'yes' if use_bias else 'no'}"))

    def row_base(self, use_bias: bool) -> dict:
        return {"mix": self.mix, "S": self.S, "C": self.C, "width": self.width, "activation": self.act,
                "n_docs": self.n_docs, "doc_min": self.doc_min, "doc_max": self.doc_max, "bias": use_bias}


class Provider:
    """An autograd op ``op(x, w, b, sh)`` in its layout (SC [S, C], 1SC [1, S, C], CS the [1, C, S] view); env
    (variable, value) is set around each of its calls; supports(W, activation) says why it cannot, or None."""

    def __init__(self, name, op, layout="SC", prepare=None, env=None, supports=None):
        self.name, self.op, self.layout, self.env = name, op, layout, env
        self.prepare, self.supports = prepare or (lambda sh: {}), supports or (lambda width, activation: None)

    def to_layout(self, t, sh):
        return t if self.layout == "SC" else t.view(1, sh.S, sh.C).transpose(1, 2) if self.layout == "CS" else \
            t.view(1, sh.S, sh.C)

    def around(self, fn):
        """fn with the provider's environment variable set around each call and restored after."""
        if self.env is None:
            return fn
        var, value = self.env

        def call(*args):
            old, os.environ[var] = os.environ.get(var), value
            try:
                return fn(*args)
            finally:
                if old is None:
                    del os.environ[var]
                else:
                    os.environ[var] = old
        return call

    def prepare_bias(self, sh, use_bias, need_bwd_graph):
        self.w_leaf = sh.w.detach().clone().requires_grad_()
        self.b_leaf = sh.b.detach().clone().requires_grad_() if use_bias else None
        self.xs, self.dys = ([self.to_layout(t[k], sh) for t in sh.sets] for k in (0, 1))
        self.x_leaves = [x.detach().requires_grad_() for x in self.xs]
        self.inputs = [[xl, self.w_leaf] + ([self.b_leaf] if use_bias else []) for xl in self.x_leaves]
        with torch.enable_grad():  # the graphs the bwd pass differentiates
            self.graphs = [self.op(xl, self.w_leaf, self.b_leaf, sh) for xl in self.x_leaves] if need_bwd_graph else []

    def release_bias(self):
        self.graphs = self.xs = self.dys = self.x_leaves = self.inputs = self.w_leaf = self.b_leaf = None

    def callable_for(self, pass_, sh, use_bias):
        """fn(i): one call of pass_ on input set i."""
        op, xs, dys, w, b = self.op, self.xs, self.dys, sh.w, (sh.b if use_bias else None)
        xl, wl, bl, inputs, graphs = self.x_leaves, self.w_leaf, self.b_leaf, self.inputs, self.graphs
        if pass_ == "bwd":
            return lambda i: torch.autograd.grad(graphs[i], inputs[i], dys[i], retain_graph=True)

        def fwd(i):
            with torch.no_grad():
                return op(xs[i], w, b, sh)

        def fwdbwd(i):
            with torch.enable_grad():
                return torch.autograd.grad(op(xl[i], wl, bl, sh), inputs[i], dys[i])
        return fwd if pass_ == "fwd" else fwdbwd

    def outputs(self, sh, use_bias):
        """(y, dx [S, C], dw [C, W], db [C] or None) on input set 0."""
        with torch.enable_grad():
            y = self.op(self.x_leaves[0], self.w_leaf, self.b_leaf, sh)
            grads = torch.autograd.grad(y, self.inputs[0], self.dys[0])
        back = lambda t: (t.transpose(1, 2) if self.layout == "CS" else t).reshape(sh.S, sh.C)  # noqa: E731
        return back(y.detach()), back(grads[0]), grads[1], grads[2] if use_bias else None


class Ours(Provider):
    """cakeconv: GPU time of its entry points (the library allocates), the autograd op for eager loop and host cost."""

    def __init__(self, cakeconv, backend):
        self.m, self.backend = cakeconv, backend
        super().__init__("ours", lambda x, w, b, sh: cakeconv.cake_causal_conv1d_det(
            x, w, b, cu_seqlens=sh.cu, **self.kw(sh)))

    def kw(self, sh) -> dict:
        return {"backend": self.backend, "activation": sh.activation}

    def prepare_bias(self, *_):
        """Nothing to prepare or release: the entry points take the shape's tensors."""

    release_bias = prepare_bias

    def callable_for(self, pass_, sh, use_bias):
        fwd, bwd = self.m.cake_causal_conv1d_det_train_forward, self.m.cake_causal_conv1d_det_train_backward
        w, b, cu, kw, sets = sh.w, (sh.b if use_bias else None), sh.cu, self.kw(sh), sh.sets
        if pass_ == "fwd":
            return lambda i: fwd(sets[i][0], w, b, cu, **kw)
        if pass_ == "bwd":
            return lambda i: bwd(sets[i][1], sets[i][0], w, b, cu, **kw)

        def fwdbwd(i):
            x, dy = sets[i]
            fwd(x, w, b, cu, **kw)
            return bwd(dy, x, w, b, cu, **kw)
        return fwdbwd

    def outputs(self, sh, use_bias):
        (x, dy), b, kw = sh.sets[0], (sh.b if use_bias else None), self.kw(sh)
        y = self.m.cake_causal_conv1d_det_train_forward(x, sh.w, b, sh.cu, **kw)
        return (y, *self.m.cake_causal_conv1d_det_train_backward(dy, x, sh.w, b, sh.cu, **kw))

    def extra_host_items(self, sh, calls):
        """``ws``: the workspace entry points, forward + backward per pair, every buffer preallocated."""
        m, kw, cu, w, (x, dy) = self.m, self.kw(sh), sh.cu, sh.w, sh.sets[0]
        y, dx = torch.empty_like(x), torch.empty_like(x)
        nbytes = m.cake_causal_conv1d_det_train_backward_workspace_bytes(sh.S, sh.C, width=sh.width)
        ws = torch.empty(max(16, nbytes), dtype=torch.uint8, device=x.device)
        fwd, bwd = m.cake_causal_conv1d_det_train_forward, m.cake_causal_conv1d_det_train_backward

        def pairs():
            for _ in range(calls):
                fwd(x, w, None, cu, out=y, **kw)
                bwd(dy, x, w, None, cu, dx=dx, workspace=ws, **kw)
        return {"ws": (pairs, calls)}


def baseline_op(torch, name: str):
    """op(x, w, b, sh=None) of a host-cost baseline: trivial (autograd.Function: x.clone(), identity backward), silu."""
    if name == "silu":
        return lambda x, w, b, sh=None: torch.nn.functional.silu(x)

    class TrivialFunction(torch.autograd.Function):
        forward = staticmethod(lambda ctx, x, w: x.clone())
        backward = staticmethod(lambda ctx, g: (g, None))
    return lambda x, w, b, sh=None: TrivialFunction.apply(x, w)


def load_providers(st, notes: list) -> tuple:
    """(the providers of --providers that can run here, cakeconv or None, the peers' versions); each one that cannot
    is noted. A cakeconv on PYTHONPATH (an A/B) wins over this repository's, which ``python -m`` puts first."""
    first = next((d for d in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                  if d and os.path.isfile(os.path.join(d, "cakeconv", "__init__.py"))), None)
    if first:
        sys.path.insert(0, os.path.abspath(first))
    try:
        import cakeconv
        log(f"cakeconv from {os.path.dirname(os.path.abspath(cakeconv.__file__))}")
    except Exception as exc:  # noqa: BLE001 - any import failure means "not available"
        cakeconv = None
        note(notes, f"cakeconv did not import ({type(exc).__name__}: {exc})")
    provs, ours = [], Ours(cakeconv, st.backend) if cakeconv is not None else None
    for name in st.providers:
        if name in ("ours", "ours_ag"):
            if ours is None:
                note(notes, f"{name}: skipped, cakeconv did not import")
            else:
                provs.append(ours if name == "ours" else Provider("ours_ag", ours.op, supports=ours.supports))
        elif st.device.type != "cuda":
            why = "its Triton kernels need a CUDA device" if name == "fla" else "CUDA extension"
            note(notes, f"{name}: skipped ({why})")
        elif name == "fla":
            os.environ["FLA_GLUON"] = "0"  # its Triton path, the one SPEC section 7 quotes
            try:
                from fla.modules.causal_conv1d import causal_conv1d
                from fla.ops.utils import prepare_chunk_indices
            except Exception as exc:  # noqa: BLE001 - any import failure means "not available"
                note(notes, f"fla: skipped, import failed ({type(exc).__name__}: {exc}); install: "
                            "pip install --no-deps --target /tmp/fla .fla/*.whl && export PYTHONPATH=/tmp/fla")
                continue
            provs.append(Provider("fla", lambda x, w, b, sh: causal_conv1d(
                x=x, weight=w, bias=b, activation=sh.activation, backend="triton", cu_seqlens=sh.cu,
                chunk_indices=sh.extra["fla_chunk_indices"])[0], layout="1SC",
                prepare=lambda sh: {"fla_chunk_indices": prepare_chunk_indices(sh.cu, 64)}))
        else:
            try:
                from causal_conv1d import causal_conv1d_fn
            except Exception as exc:  # noqa: BLE001
                note(notes, f"{name}: skipped, causal_conv1d did not import ({type(exc).__name__}: {exc}); build: "
                            "bash benchmarks/device_run.sh peers ...")
                continue
            provs.append(Provider(name, lambda x, w, b, sh: causal_conv1d_fn(
                x, w, b, seq_idx=sh.seq_idx, activation=sh.activation), layout="CS",
                env=("CAUSAL_CONV1D_DETERMINISTIC", "1" if name == "dao_det" else "0"),
                supports=lambda width, activation: None if width in (2, 3, 4) else
                f"causal_conv1d_fn takes W = 2..4, not {width}"))
    names = {p.name for p in provs}
    versions = {"fla": package_version("fla", "fla-core")} if "fla" in names else {}
    if names & {"dao", "dao_det"}:
        versions["causal_conv1d"] = package_version("causal_conv1d", "causal-conv1d")
    return provs, cakeconv, versions


def _shift(t, s: int, pos, back: bool):
    """t moved s rows within each document (zeros where that leaves it): back, row t - s at t; else row t + s."""
    out, first = torch.zeros_like(t), (pos < s)[:, None]  # row t' reaches back to t' - s only inside its document
    if back:
        out[s:] = t[:-s]
        return out.masked_fill_(first, 0.0)
    out[:-s] = t.masked_fill(first, 0.0)[s:]
    return out


def reference(sh: Shape, x, dy, use_bias: bool, block_c: int = 1024):
    """(y, dx fp32, dw, db fp64) of SPEC 1b, FP32 with FP64 reductions, by channel blocks (w[:, W-1]: token t)."""
    (S, C), W, pos = x.shape, sh.w.shape[1], sh.pos
    y, dx = (torch.empty(S, C, dtype=torch.float32, device=x.device) for _ in range(2))
    dw, db = (torch.empty(*shape, dtype=torch.float64, device=x.device) for shape in ((C, W), (C,)))
    for c0 in range(0, C, block_c):
        c1 = min(C, c0 + block_c)
        xf, wf = x[:, c0:c1].float(), sh.w[c0:c1].float()
        pre = xf * wf[:, W - 1]
        if use_bias:
            pre = pre + sh.b[c0:c1].float()
        for s in range(1, W):
            pre = pre + _shift(xf, s, pos, True) * wf[:, W - 1 - s]
        g = dy[:, c0:c1].float()
        if sh.activation is not None:
            sig = 1.0 / (1.0 + torch.exp(-pre))
            y[:, c0:c1] = pre * sig
            g = g * sig * (1.0 + pre * (1.0 - sig))
            del sig
        else:
            y[:, c0:c1] = pre
        dxb = g * wf[:, W - 1]
        dw[c0:c1, W - 1] = torch.sum(g * xf, 0, dtype=torch.float64)
        for s in range(1, W):
            dxb = dxb + _shift(g, s, pos, False) * wf[:, W - 1 - s]
            dw[c0:c1, W - 1 - s] = torch.sum(g * _shift(xf, s, pos, True), 0, dtype=torch.float64)
        dx[:, c0:c1] = dxb
        db[c0:c1] = torch.sum(g, 0, dtype=torch.float64)
        del xf, pre, g, dxb
    return y, dx, dw, db


def rel_err(got, ref) -> float:
    """||got - ref|| / ||ref|| in FP64 over chunks; inf if got is not finite or not ref's size, nan if None."""
    if got is None:
        return float("nan")
    g_all, r_all = got.reshape(-1), ref.reshape(-1)
    if g_all.numel() != r_all.numel():
        return float("inf")
    num = den = 0.0
    for i in range(0, g_all.numel(), CHUNK):
        g, r = g_all[i:i + CHUNK].double(), r_all[i:i + CHUNK].double()
        if not bool(torch.isfinite(g).all()):
            return float("inf")
        num += float(torch.sum((g - r) ** 2))
        den += float(torch.sum(r * r))
    return math.sqrt(num / den) if den > 0 else math.sqrt(num)


def check_shape(sh: Shape, active: list, use_bias: bool, notes: list) -> list[dict]:
    """Check rows: each provider's y, dx, dw (db) on set 0 vs the reference, ours' y vs fla's; failures dropped."""
    ref = reference(sh, *sh.sets[0], use_bias)
    head = {"kind": "check", "mix": sh.mix, "S": sh.S, "C": sh.C, "width": sh.width, "activation": sh.act,
            "bias": use_bias}
    rows, ys = [], {}
    for p in list(active):
        try:
            outs = p.around(p.outputs)(sh, use_bias)
        except Exception as exc:  # noqa: BLE001 - a provider that fails is reported and dropped
            note(notes, f"{p.name} failed its check run {sh.where(use_bias)}: {type(exc).__name__}: {exc}")
            active.remove(p)
            p.release_bias()
            continue
        errs = {k: rel_err(o, r) for k, o, r in zip(("y_rel", "dx_rel", "dw_rel"), outs, ref)}
        errs["db_rel"] = rel_err(outs[3], ref[3]) if use_bias else None
        ok = all(e <= CHECK_TOL for e in errs.values() if e is not None)  # NaN fails
        rows.append({**head, "provider": p.name, **errs, "ok": ok})
        ys[p.name] = outs[0]
        del outs
    del ref
    if "ours" in ys and "fla" in ys:
        yo, yf = ys["ours"].reshape(-1), ys["fla"].reshape(-1)
        d = max((float((yo[i:i + CHUNK].float() - yf[i:i + CHUNK].float()).abs().max())
                 for i in range(0, yo.numel(), CHUNK)), default=0.0)
        e = rel_err(yo, yf)
        rows.append({**head, "provider": "ours_vs_fla", "y_rel": e, "y_max_abs": d, "dx_rel": None, "dw_rel": None,
                     "db_rel": None, "ok": e <= CHECK_TOL})
    return rows


def provider_forms(p, sh: Shape, use_bias: bool, st, modes, notes: list, failed: str) -> dict:
    """{(p.name, form): (fn, calls)} of eager_forms (leaves: x, st.chain taps and biases) inside p.around, ours' ``ws``
    too with nograd (the host cost); {} with a note (``failed``) when p fails to set up."""
    try:
        x0, dy0 = sh.sets[0]
        x_leaf, dy = p.to_layout(x0, sh).detach().requires_grad_(), p.to_layout(dy0, sh)
        ws, bs = ([t if t is None else t.detach().clone().requires_grad_() for t in ts]
                  for ts in sh.chain_params(st.chain, use_bias))
        params = [x_leaf] + ws + [b for b in bs if b is not None]
        forms = {form: (p.around(fn), n) for form, (fn, n) in eager_forms(
            torch, lambda y, i: p.op(y, ws[i], bs[i], sh), x_leaf, dy, params, st.chain, st.calls, modes).items()}
        forms.update(p.extra_host_items(sh, st.calls) if "nograd" in modes and isinstance(p, Ours) else {})
    except Exception as exc:  # noqa: BLE001 - a provider that fails is reported and dropped
        note(notes, f"{p.name} {failed}: {type(exc).__name__}: {exc}")
        return {}
    return {(p.name, form): fn_calls for form, fn_calls in forms.items()}


def eager_at_shape(sh: Shape, active: list, use_bias: bool, st, sync, notes: list) -> dict:
    """{(provider, form): [ms per call]} of the eager loop (chain, step) at one shape, if it fits in memory."""
    where = sh.where(use_bias)
    if sh.device.type == "cuda":
        need = (st.chain + 6) * sh.S * sh.C * 2 * 2  # saved inputs, y, dy, dx, peers' extra buffers; x2 margin
        free, _ = torch.cuda.mem_get_info(sh.device)
        if need > 0.9 * free:
            note(notes, f"eager loop skipped at {where}: needs ~{need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free")
            return {}
    subjects = {}
    for p in [p for p in active if p.name != "ours_ag" or "ours" not in {q.name for q in active}]:
        subjects.update(provider_forms(p, sh, use_bias, st, EAGER_METHOD, notes, f"eager loop failed {where}"))
    return wall_samples(subjects, st.eager_steps, st.eager_warmup, sync, sync, lambda key, exc: note(
        notes, f"{key[0]} eager {key[1]} failed {where}: {type(exc).__name__}: {exc}"))


def host_cost(st, provs, sync, notes: list, record) -> None:
    """Host cost per call at the host shape (one document, no bias, first (W, activation), GPU idle)."""
    (S, C), (width, act) = st.host_shape, st.width_acts[0]
    sh = Shape(S, C, st.device, st.seed, st.mean_doc_len, st.l2_bytes, 1, "one")
    sh.use_taps(width, act)
    subjects = {}
    for p in [p for p in provs if p.name != "ours_ag"] + [Provider(n, baseline_op(torch, n)) for n in BASELINES]:
        if p.supports(width, sh.activation) is not None:
            note(notes, f"{p.name}: no host cost at W={width}, activation {act}: {p.supports(width, sh.activation)}")
        elif prepare([p], sh, notes):
            subjects.update(provider_forms(p, sh, False, st, HOST_PASS, notes, "host cost failed"))
    log(f"host cost: S={S} C={C} W={width} {act} one document, {len(subjects)} items, {st.host_steps} samples "
        f"of {st.calls} calls (chain: {st.chain}) (+{st.host_warmup} warm-up)")
    t0 = time.perf_counter()
    res = wall_samples(subjects, st.host_steps, st.host_warmup, sync, sync, lambda key, exc: note(
        notes, f"{key[0]} host cost {key[1]} failed: {type(exc).__name__}: {exc}"))
    for (name, item), ts in res.items():
        record({**sh.row_base(False), "method": "host_" + item, "pass": HOST_PASS[item], "provider": name,
                "times": ts, "host_ms": 0.0, "chain": st.chain if item == "chain" else 1, "n_sets": 1})
    log(f"host cost: {time.perf_counter() - t0:.1f}s  " + "  ".join(
        f"{n}:{i}={statistics.median(ts) * 1e3:.1f}us" for (n, i), ts in res.items()))


def with_defaults(r) -> dict:
    """Row r with method, mix, width and activation filled in (rows of older files lack some: gpu, seed, 4, silu)."""
    defaults = {"method": "gpu", "mix": DEFAULT_MIX, "width": BASE_WA[0], "activation": BASE_WA[1]}
    return {**r, **{k: r.get(k) or v for k, v in defaults.items()}}


def timing_row(env, copy, r, ms, ts=None, warmup=None, l2_flush=None) -> dict:
    """The row of measurement r at median ms per call (copy: GB/s); ts (the samples) gives p10, p90 and n."""
    r = with_defaults(r)
    gpu, fb = r["method"] == "gpu", FLOOR_FACTOR[r["pass"]] * r["S"] * r["C"] * 2  # floor bytes
    gbs = fb / (ms * 1e-3) / 1e9
    return {"kind": "timing", **{k: env.get(k) for k in ENV_FIELDS},
            **{k: r[k] for k in ("method", "mix", "S", "C", "width", "activation", "pass", "provider", "bias")},
            "ms": ms, "us": ms * 1e3, "ms_p10": percentile(ts, 0.1) if ts else None,
            "ms_p90": percentile(ts, 0.9) if ts else None, "n": len(ts) if ts else r.get("n"), "warmup": warmup,
            "floor_bytes": fb, "gbs": gbs, "fraction": gbs / copy, "copy_gbs": copy, "host_ms": r.get("host_ms", 0.0),
            **{k: r.get(k) for k in ("n_docs", "doc_min", "doc_max", "n_sets", "chain")},
            "l2_flush": l2_flush if gpu else False, "host_ahead_us": r.get("host_ahead_us") if gpu else 0.0}


def add_speedups(rows) -> list:
    """speedup_vs_<peer> = peer / ours, eager_vs_gpu = eager / GPU time of fwd+bwd, ratio_to_trivial."""
    by_key = {row_key(r): r["ms"] for r in rows}
    for row in rows:
        if row["provider"] not in PEERS + BASELINES:
            for peer in PEERS:
                pm = by_key.get(row_key({**row, "provider": peer}))
                row[f"speedup_vs_{peer}"] = (pm / row["ms"]) if pm else None
        if row["method"] in ("eager", "eager_step"):
            g = by_key.get(row_key({**row, "method": "gpu", "pass": "fwdbwd"}))
            row["eager_vs_gpu"] = (row["ms"] / g) if g else None
        if row["method"].startswith("host_"):
            t = by_key.get(row_key({**row, "provider": "trivial"}))
            row["ratio_to_trivial"] = (row["ms"] / t) if t else None
    return rows


def target_lines(rows, env) -> list[str]:
    """Ours against SPEC 7 (not on the CPU): GPU time, every (W, activation) vs W = 4 + SiLU, eager, host cost."""
    gpu, out = [r for r in rows if r["method"] == "gpu" and r["provider"] == "ours"], []
    if env["gpu"].startswith("cpu"):
        return out
    tag = lambda r: f"{PASS_LABEL[r['pass']]}{'+b' if r['bias'] else ''}"  # noqa: E731
    summary = lambda checked, miss: f"{len(checked)} checks, " + (  # noqa: E731
        f"MISS {len(miss)}: " + " ".join(miss[:12]) + (" ..." if len(miss) > 12 else "") if miss else "all met")
    several = len({(r["width"], r["activation"]) for r in gpu}) > 1
    for mix, width, act in dict.fromkeys((r["mix"], r["width"], r["activation"]) for r in gpu):
        scale = 1.0 if (width, act) == BASE_WA else WIDTH_TOLERANCE  # checked: [(row, its target)]
        checked = [(r, t * scale) for r in gpu if (r["mix"], r["width"], r["activation"]) == (mix, width, act)
                   for lo, hi, t in target_steps(mix, r["pass"]) if r["C"] >= lo and (hi is None or r["C"] < hi)]
        miss = [f"{tag(r)} S{r['S']} C{r['C']}:{r['fraction']:.3f}<{t:.3f}" for r, t in checked if r["fraction"] < t]
        if checked:
            what = f", W = {width} {act}" + (" (targets x 0.97)" if scale != 1.0 else "") if several else ""
            out.append(f"# ours GPU time vs SPEC 7, {mix}{what}: {summary(checked, miss)}")
    idx = {row_key(r): r for r in gpu}  # checked: [(row, its W = 4 + SiLU row)]
    checked = [(r, idx[k]) for r in gpu if (r["width"], r["activation"]) != BASE_WA
               and (k := row_key({**r, "width": BASE_WA[0], "activation": BASE_WA[1]})) in idx]
    miss = [f"W{r['width']} {r['activation']} {r['mix']} {tag(r)} C{r['C']}:{r['fraction'] / b['fraction']:.3f}"
            for r, b in checked if r["fraction"] < WIDTH_TOLERANCE * b["fraction"]]
    if checked:
        out.append(f"# ours at every (W, activation) vs its W = 4 + SiLU row (fraction ratio >= {WIDTH_TOLERANCE}): "
                   + summary(checked, miss))
    ev = [r for r in rows if r["method"] == "eager" and r["provider"] == "ours" and r["mix"] == "seed"
          and r["C"] in EAGER_TARGET_C and r.get("eager_vs_gpu")]
    several = len({(r["width"], r["activation"]) for r in ev}) > 1
    if ev:
        out.append("# ours eager loop vs SPEC 7 (seed mix, C = 128 and 512, chain time per call <= 1.05 x GPU time): "
                   + ", ".join(f"C{r['C']}{'+b' if r['bias'] else ''}" + (f" W{r['width']} {r['activation']}"
                               if several else "") + f" {r['eager_vs_gpu']:.2f}x"
                               + ("" if r["eager_vs_gpu"] <= EAGER_TARGET else " MISS") for r in ev))
    host = {r["method"]: r for r in rows if r["method"].startswith("host_") and r["provider"] == "ours"}
    parts = [what.format(host[m][v], t) + ("" if host[m][v] <= t else " MISS")
             for m, (t, v, what) in HOST_TARGETS.items() if host.get(m, {}).get(v)]
    return out + (["# ours host cost vs SPEC 7: " + "; ".join(parts)] if parts else [])


def parse_args(argv=None):
    """The options, the run's settings resolved unless --replot (--dry-run changes the defaults); SystemExit if bad."""
    a = (p := argparse.ArgumentParser(description=__doc__.split("\n")[0])).add_argument
    a("--dry-run", action="store_true", help="tiny shapes on the CPU, backend='reference', perf_counter marks")
    a("--rows", help="comma list: C values keep the grid rows of those C; SxC tokens (250340x512) add shapes")
    a("--doc-mix", action="append", help="comma list (may repeat): seed (default), uniform:A-B, ones, fixed:N, docs:N, "
      "one")
    a("--bias", choices=("both", "no", "yes"), default="both", help="bias variants (default both)")
    a("--width", default="4", help="taps per channel W, comma list of 2..8 (default 4)")
    a("--activation", default="silu", help="comma list of silu, none (default silu)")
    a("--passes", default="fwd,bwd,fwdbwd", help="GPU-time passes, comma list ('none': no GPU-time rows)")
    a("--providers", default="ours,fla,dao,dao_det", help=f"comma list among {','.join(PROVIDERS)}")
    a("--reps", type=int, help="timed calls per provider, pass and shape (default 25; 5 --dry-run)")
    a("--warmup", type=int, default=3, help="untimed rounds first: compilation, autotuning (default 3; 1 --dry-run)")
    a("--seed", type=int, default=0, help="seed of the inputs and document lengths")
    a("--max-sets", type=int, default=8, help="at most this many rotating input sets per shape (default 8)")
    a("--no-check", action="store_true", help="skip the correctness check against the reference")
    a("--eager", action="store_true", help="also the eager loop (chain, step) at every row's shape")
    a("--eager-c", help="comma list of C: the eager loop only at these C")
    a("--eager-mix", action="append", help="mixes, comma list: the eager loop only at these mixes of the run")
    a("--host-cost", action="store_true", help="host cost per call at S=4096 C=256 beside trivial and silu")
    a("--no-plot", action="store_true")
    a("--out", help="output folder (default benchmarks/results; with --replot the file's folder)")
    a("--name", help="stem of the files written (default op; with --replot the file's)")
    a("--replot", metavar="RUN.jsonl", help="redraw the table and plot of a run's .jsonl or .partial.jsonl (no GPU)")
    st = p.parse_args(argv)
    if st.replot:
        return st
    dry = st.dry_run
    if not dry and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --dry-run to exercise the pipeline on the CPU")
    st.device = torch.device("cpu") if dry else torch.device("cuda", torch.cuda.current_device())
    st.passes = [p for p in choices(st.passes, PASSES + ("none",), "passes") if p != "none"]
    st.mixes, st.eager_mixes = parse_mixes(st.doc_mix), st.eager_mix and parse_mixes(st.eager_mix)
    if set(st.eager_mixes or []) - set(st.mixes):
        raise SystemExit(f"--eager-mix {st.eager_mixes} not all among the run's mixes {st.mixes}")
    if not st.passes and not st.eager and not st.host_cost:
        raise SystemExit("nothing to time: --passes none without --eager or --host-cost")
    if os.sep in (st.name or ""):
        raise SystemExit(f"--name must be a file stem (no folder), got {st.name!r}")
    # --rows: C values keep the grid's rows of those C, SxC tokens add shapes (alone: exactly those shapes)
    grid = (DRY_SHAPES if dry else GRID) if st.passes or st.eager else []  # no shapes: the host cost alone
    toks = [t for t in (st.rows or "").replace(" ", "").lower().split(",") if t and grid]
    keep_c, extra = {int(t) for t in toks if "x" not in t}, [tuple(map(int, t.split("x"))) for t in toks if "x" in t]
    st.shapes = [sc for sc in grid if sc[1] in keep_c] if keep_c else [] if extra else list(grid)
    if keep_c - {c for _, c in st.shapes}:
        log(f"note: --rows C values not in the grid, ignored: {sorted(keep_c - {c for _, c in st.shapes})} "
            "(use SxC to add a shape)")
    st.shapes += [sc for sc in dict.fromkeys(extra) if sc not in st.shapes]
    if any(c % 8 for _, c in st.shapes):
        raise SystemExit(f"C must be a multiple of 8, got {[c for _, c in st.shapes if c % 8]}")
    st.widths = [int(w) for w in choices(st.width, [str(w) for w in WIDTHS], "width", True)]
    st.activations = choices(st.activation, ACTIVATIONS, "activation", True)
    st.width_acts = [(w, a) for w in st.widths for a in st.activations]
    st.providers = choices(st.providers, PROVIDERS, "providers")
    st.bias_variants = {"both": [False, True], "no": [False], "yes": [True]}[st.bias]
    st.eager_c = {int(c) for c in st.eager_c.split(",") if c} if st.eager_c else None
    st.backend, st.name = "reference" if dry else "auto", st.name or "op"
    st.out = st.out or os.path.join(REPO_ROOT, "benchmarks", "results")
    st.reps = st.reps if st.reps is not None else (5 if dry else 25)
    st.warmup = 1 if dry and st.warmup == 3 else st.warmup
    for k, (run, dry_value) in PROTOCOL.items():
        setattr(st, k, dry_value if dry else run)
    return st


def prepare(provs, sh, notes: list, use_bias=None, need_bwd_graph=False) -> list:
    """The providers that prepared this shape (use_bias None) or this bias variant; the others are noted."""
    ready = []
    for p in provs:
        try:
            sh.extra.update(p.prepare(sh)) if use_bias is None else p.prepare_bias(sh, use_bias, need_bwd_graph)
            ready.append(p)
        except Exception as exc:  # noqa: BLE001 - a provider that fails is reported and dropped
            note(notes, f"{p.name} {'failed to prepare' if use_bias is None else 'failed'} {sh.where(use_bias)}: "
                        f"{type(exc).__name__}: {exc}")
    return ready


def run_grid(st, provs, clock, notes, record, checks, t_start) -> None:
    """Every mix x shape x (W, activation) x bias variant: the check, GPU time and eager loop, progress lines."""
    grid = [(mix, S, C) for mix in st.mixes for S, C in st.shapes]
    total = sum(S * C for _, S, C in grid) * len(st.bias_variants) * len(st.width_acts)
    done, counter, noted = 0, 0, set()
    for i_shape, (mix, S, C) in enumerate(grid):
        sh = Shape(S, C, st.device, st.seed, st.mean_doc_len, st.l2_bytes, st.max_sets, mix)
        live = prepare(provs, sh, notes)
        for (width, act), use_bias in itertools.product(st.width_acts, st.bias_variants):
            sh.use_taps(width, act)
            why = {p.name: p.supports(width, sh.activation) for p in live}
            for name in [n for n, w in why.items() if w and (n, width, act) not in noted]:
                noted.add((name, width, act))
                note(notes, f"{name}: skipped at W={width}, activation {act}: {why[name]}")
            tag, t0 = f"[{i_shape + 1}/{len(grid)}] {sh.where(use_bias)}", time.perf_counter()
            active = prepare([p for p in live if not why[p.name]], sh, notes, use_bias, "bwd" in st.passes)
            if not st.no_check and active:
                log(f"{tag}: {sh.n_docs} documents ({sh.doc_min}-{sh.doc_max}); checking {[p.name for p in active]} "
                    "against the FP32 reference")
                checks += check_shape(sh, active, use_bias, notes)
            calls = [(p, p_, p.around(p.callable_for(p_, sh, use_bias))) for p in active for p_ in st.passes]
            g = time_gpu(clock, calls, len(sh.sets), counter, st.reps, st.warmup,
                         lambda name, p_, exc, where=sh.where(use_bias): note(
                             notes, f"{name} {p_} failed {where}: {type(exc).__name__}: {exc}"))
            counter, calls, summary = g.counter, None, []  # drop the closures (they hold this shape's tensors)
            for (name, p_), ts in g.times.items():
                if name not in g.failed and ts:
                    record({**sh.row_base(use_bias), "method": "gpu", "pass": p_, "provider": name, "times": ts,
                            "host_ms": statistics.median(g.host_times[(name, p_)]), "n_sets": len(sh.sets),
                            "host_ahead_us": g.window_us[(name, p_)] if clock.can_sleep else 0.0})
                    summary.append(f"{name}:{PASS_LABEL[p_]}={statistics.median(ts):.3f}ms")
            if st.eager and (st.eager_c is None or sh.C in st.eager_c) and sh.mix in (st.eager_mixes or [sh.mix]):
                for (name, mode), ts in eager_at_shape(sh, active, use_bias, st, clock.sync, notes).items():
                    record({**sh.row_base(use_bias), "method": EAGER_METHOD[mode], "pass": "fwdbwd", "provider": name,
                            "times": ts, "host_ms": 0.0, "chain": st.chain if mode == "chain" else 1, "n_sets": 1})
                    summary.append(f"{name}:{EAGER_METHOD[mode]}={statistics.median(ts):.3f}ms/call")
            for p in active:
                p.release_bias()
            done, el = done + S * C, time.perf_counter() - t_start
            log(f"{tag}: {len(sh.sets)} sets, {sh.n_docs} docs, {time.perf_counter() - t0:.1f}s  "
                f"{'  '.join(summary)}  elapsed {fmt_secs(el)} ETA {fmt_secs(el / max(1, done) * (total - done))}")
        del sh, live
        torch.cuda.empty_cache()  # a no-op without CUDA


def finish(rows, checks, env, notes, st, elapsed, write_rows=True) -> str:
    """Write <name>.jsonl and .csv (write_rows), the plot and <name>_table.txt; return the table."""
    os.makedirs(st.out, exist_ok=True)
    path, paths = lambda ext: os.path.join(st.out, st.name + ext), []  # noqa: E731
    if write_rows:
        run = {"date": env["date"], "commit": env.get("commit"), "gpu": env["gpu"]}
        write_jsonl(path(".jsonl"), [{"kind": "env", **env, "elapsed_s": elapsed, "notes": notes}, *rows,
                                     *({**c, **run} for c in checks)])
        write_csv(path(".csv"), rows, CSV_FIELDS)
        paths += [path(".jsonl"), path(".csv")]
    if not st.no_plot:  # at the sweep's S (250340, 1531 in --dry-run), else the commonest S
        counts = collections.Counter(r["S"] for r in rows if not r["method"].startswith("host_"))
        sweep_s = next((s for s in (SWEEP_S, DRY_SWEEP_S) if s in counts), max(counts, key=counts.get, default=SWEEP_S))
        paths += op_plots(rows, sweep_s, env, st.out, notes, st.name, target_steps)
    worst, bad, ovf = {}, [c for c in checks if not c["ok"]], [c for c in checks if c["provider"] == "ours_vs_fla"]
    for c, k in itertools.product(checks, ("y_rel", "dx_rel", "dw_rel", "db_rel")):  # the worst error of each
        if c["provider"] != "ours_vs_fla" and c.get(k) is not None:
            worst.setdefault(c["provider"], {})[k] = max(worst.get(c["provider"], {}).get(k, 0.0), c[k])
    lines = [f"# check vs FP32 reference (worst rel. L2 error, tol {CHECK_TOL:.0e}): " + "; ".join(
        f"{p}: {', '.join(f'{k[:-4]} {v:.1e}' for k, v in ks.items())}" for p, ks in worst.items())
        + (f"  ** {len(bad)} FAILED **" if bad else "  all ok")] if checks else []
    if ovf:
        lines.append(f"# ours y vs fla y: worst rel {max(c['y_rel'] for c in ovf):.1e}, "
                     f"worst max|diff| {max(c['y_max_abs'] for c in ovf):.3g}")
    lines += [f"#   FAILED check: {c}" for c in bad[:10]]
    text = op_table(rows, env, lines, target_lines(rows, env), notes, paths + [path("_table.txt")], elapsed)
    with open(path("_table.txt"), "w") as f:
        f.write(text + "\n")
    return text


def replot(st) -> str:
    """The table of a run's .jsonl (its plot redrawn); a .partial.jsonl is rated against its start copy reading."""
    lines = read_jsonl(st.replot)
    env = next((r for r in lines if r.get("kind") == "env"), {})
    rows, checks, partial = ([r for r in lines if r.get("kind") == k] for k in ("timing", "check", "partial"))
    notes = list(env.get("notes", []))
    if partial and not rows:
        env.update(copy_gbs=env["copy_gbs_start"], copy_gbs_end=float("nan"))
        rows = [timing_row(env, env["copy_gbs"], r, r["median_ms"]) for r in partial]
        notes.append(f"run cut short: {len(rows)} rows of the partial file, rated against the copy bandwidth "
                     f"measured at the start ({env['copy_gbs']:.0f} GB/s; no end reading)")
    if not rows:
        raise SystemExit(f"no timing rows in {st.replot}")
    rows = add_speedups([with_defaults(r) for r in rows])
    st.out = st.out or os.path.dirname(os.path.abspath(st.replot))
    st.name = st.name or re.sub(r"(\.partial\.jsonl|\.[^.]*)$", "", os.path.basename(st.replot))
    return finish(rows, checks, env, notes, st, env.get("elapsed_s", float("nan")), write_rows=bool(partial))


def main(argv=None) -> int:
    t_start, st, notes = time.perf_counter(), parse_args(argv), []
    if st.replot:
        print(replot(st))
        return 0
    provs, cakeconv, versions = load_providers(st, notes)
    if not provs:
        raise SystemExit("no provider available")
    env = run_environment(torch, st.device, "cpu (dry-run)")
    env.update(cakeconv=getattr(cakeconv, "__version__", None),
               cakeconv_path=cakeconv and os.path.dirname(os.path.abspath(cakeconv.__file__)), **versions,
               ours_backend=st.backend, doc_mixes=st.mixes, widths=st.widths, activations=st.activations,
               chain=st.chain, calls_per_sample=st.calls, host_ahead="auto",
               argv=list(sys.argv[1:] if argv is None else argv))
    st.l2_bytes = env["l2_bytes"] or 60 * 2**20
    clock = DeviceClock(torch, st.device, flush=True)
    copy0 = copy_bandwidth(torch, clock, st.copy_bytes, 10, HOST_AHEAD_MIN_US)[0]
    log(f"copy bandwidth (start): {copy0:.0f} GB/s (read + write, median of 10)")
    os.makedirs(st.out, exist_ok=True)
    partial = os.path.join(st.out, st.name + ".partial.jsonl")  # rows as they are measured: a run cut short keeps them
    write_jsonl(partial, [{"kind": "env", **env, "copy_gbs_start": copy0, "partial": True}])
    log(f"{env['gpu']}  torch {env['torch']}  triton {env['triton']}  providers {[p.name for p in provs]}  "
        f"mixes {st.mixes}  shapes {len(st.shapes)}  bias {st.bias_variants}  passes {st.passes}  reps {st.reps} "
        f"(+{st.warmup} warm-up)  eager {'on' if st.eager else 'off'}  host cost {'on' if st.host_cost else 'off'}")
    results, checks = [], []  # the samples: the rows are built once the copy bandwidth is final

    def record(r):
        results.append(r)
        with open(partial, "a") as f:
            f.write(json.dumps({"kind": "partial", **{k: v for k, v in r.items() if k != "times"},
                                "median_ms": statistics.median(r["times"]), "n": len(r["times"])}) + "\n")
    run_grid(st, provs, clock, notes, record, checks, t_start)
    if st.host_cost:
        host_cost(st, provs, clock.sync, notes, record)
    copy1 = copy_bandwidth(torch, clock, st.copy_bytes, 10, HOST_AHEAD_MIN_US)[0]
    copy_gbs = max(copy0, copy1)  # a copy that slows down during the run must not inflate the fractions
    log(f"copy bandwidth (end): {copy1:.0f} GB/s; used: {copy_gbs:.0f} GB/s (the higher reading)")
    env.update(copy_gbs=copy_gbs, copy_gbs_start=copy0, copy_gbs_end=copy1)
    rows = add_speedups([timing_row(env, copy_gbs, r, statistics.median(r["times"]), r["times"],
                                    *((st.warmup, True) if r["method"] == "gpu" else (None, False)))
                         for r in results])
    gpu = [r for r in rows if r["method"] == "gpu"] if clock.can_sleep else []  # host times near their windows
    slow = sorted((r for r in gpu if r["host_ms"] > 0.8 * r["host_ahead_us"] * 1e-3), key=lambda r: -r["host_ms"])
    if slow:
        notes.append(f"{len(slow)} rows took the host longer than 80% of their host-ahead window to enqueue "
                     "(host-bound, or a host sync inside the call): their spans include host time; worst: "
                     + ", ".join(f"{r['provider']} {PASS_LABEL[r['pass']]} {r['mix']} S={r['S']} C={r['C']} "
                                 f"W={r['width']} {r['activation']} {r['host_ms']:.2f} ms of "
                                 f"{r['host_ahead_us'] / 1e3:.1f}" for r in slow[:6]))
    longer = sorted({(r["provider"], round(r["host_ahead_us"] / 1e3, 1)) for r in gpu
                     if r["host_ahead_us"] > HOST_AHEAD_MIN_US})
    if longer:
        notes.append(f"host-ahead windows longer than {HOST_AHEAD_MIN_US / 1e3:.1f} ms (auto: 3x the host time of the "
                     "call): " + ", ".join(f"{p} {w} ms" for p, w in longer[:12]))
    print(finish(rows, checks, env, notes, st, time.perf_counter() - t_start), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
