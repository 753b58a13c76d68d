#!/usr/bin/env python3
"""Training-step time of real layers and models: the library's own conv, cakeconv, and no conv.

Workloads (``--workloads``), each on packed documents, a fresh ``cu_seqlens`` (and ``seq_idx``) copied
from the host inside every step:

- ``kda_layer``: ``fla.layers.KimiDeltaAttention`` (hidden 2048, 16 heads of 128: three short convs of
  2048 channels), input x [1, S, hidden] that requires grad (as inside a model), loss sum(o * dy) with a
  fixed random dy;
- ``kda_model``: ``fla.models.KDAForCausalLM`` (4 layers, hidden 2048, vocabulary 32,000), input_ids
  [1, S] and their labels, FLA's loss;
- ``kda_conv``: the layer's three ``ShortConvolution`` modules alone, forward and backward (their share
  of the layer's step);
- ``mamba2_layer``: ``mamba_ssm.modules.mamba2.Mamba2`` (d_model 2048, d_state 128, headdim 64: a conv
  of 4,352 channels) on mamba_ssm's fused training path (``use_mem_eff_path=True``:
  ``mamba_split_conv1d_scan_combined``, which calls causal-conv1d's ``causal_conv1d_fwd_function`` and
  ``causal_conv1d_bwd_function``), ``seq_idx`` and ``cu_seqlens`` passed to its forward, loss sum(o * dy);
- ``mamba2_conv``: that pair of functions alone, called as mamba_ssm calls them (x the channel-last view
  of a slice of the in_proj output, dx written into a slice of its gradient).

Variants, all from the same seed (equal weights), on the same batches:

- KDA: ``fla`` (FLA's ShortConvolution as installed), ``cakeconv``
  (``cakeconv.integrations.fla.swap_short_convolutions``), ``noconv`` (``use_short_conv=False``: FLA then
  applies SiLU to the projections; its other weights are loaded from the conv model's);
- Mamba2: ``dao`` (causal-conv1d's functions, what mamba_ssm binds at import), ``cakeconv`` (the
  functions ``cakeconv.integrations.mamba_ssm.swap()`` binds), ``noconv`` (the conv replaced by the
  identity: the forward function returns its input, without SiLU; the backward copies dout into the dx
  buffer mamba_ssm passes and returns zero weight and bias gradients). Each variant binds its pair into
  ``mamba_ssm.ops.triton.ssd_combined`` around its own steps; calls are counted, so each row says how many
  calls per step reached its pair.

Mamba modes: mamba_ssm reads ``MAMBA_DETERMINISTIC`` when its kernels are defined (the autotuning
configurations, at import) and on every call; causal-conv1d 1.7.0 reads ``CAUSAL_CONV1D_DETERMINISTIC``
on every call. So each mode runs in its own process (``--mamba-modes``): ``default`` (both 0) and
``deterministic`` (both 1). The KDA workloads run in a third process. This script starts the processes one
after the other (``--part``, with ``--part-timeout`` each) and merges their rows.

Timing (benchmarks/timing.py, ``wall_samples``): a step is forward, loss, backward, AdamW step and
``zero_grad(set_to_none=True)`` (the conv workloads: forward and backward only), eager, between two
``torch.cuda.synchronize()``; one step per variant per round, the order rotating every round; the first
``--warmup`` rounds dropped; the median and the 20/80 % quantiles of ``--steps`` rounds. Round r takes
batch r mod ``--batches`` in every variant.

Determinism over repeats: before the timing, from the fresh weights, one untimed forward and backward
(compiling, autotuning), then ``--repeats`` forward and backward passes of batch 0 with no optimizer step;
after each, SHA-256 digests of the conv's weight (and bias) gradients and of every gradient (parameters
and the layer's input): the row gives the number of distinct digests of each (1: bitwise repeatable),
the loss, and the relative L2 difference of the conv gradients from the library's variant (same weights,
same batch).

Precision (``--precision``): ``bf16`` (default), bf16 parameters and inputs; ``amp``, FP32 parameters
(AdamW's master weights), bf16 inputs, the forward and backward under ``torch.autocast(bfloat16)``.

Document mixes (``--kda-mixes``, ``--mamba-mixes``): doc_mixes.py's tokens (``seed``: mostly exponential
around 3,000 tokens, 15 % of 1-63; ``uniform:1-64``; ...) and ``docs:N`` (N documents, N - 1 random cut
points); batch i draws its lengths with its own seed.

The CPU (``--dry-run``): tiny shapes, 2 rounds, no peers needed. FLA's KDA kernels and mamba_ssm's
kernels are Triton and need a CUDA GPU: under ``TRITON_INTERPRET=1`` on the CPU, FLA's autotuner finds
no active Triton driver to benchmark its configurations, and mamba_ssm's launchers enter
``torch.cuda.device(x.device.index)`` (None on the CPU). So the dry run builds every variant whose
library imports (swaps included), runs the cakeconv variants of the conv workloads on the reference
backend (timing and determinism), and skips the rest with the reason in its row.

Usage:
    python benchmarks/bench_model_step.py --out results_dir --mamba-src /tmp/mamba/mamba_ssm-2.3.2.post1
    python benchmarks/bench_model_step.py --parts kda --workloads kda_model --kda-mixes seed --steps 10
    python benchmarks/bench_model_step.py --dry-run --out /tmp/step     # CPU, tiny, 2 rounds (tests)
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import gc
import hashlib
import json
import os
import random
import re
import subprocess
import sys
import time
import types
from typing import Callable

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
if BENCH_DIR not in sys.path:  # the modules beside this file
    sys.path.insert(0, BENCH_DIR)

import torch  # noqa: E402

from doc_mixes import SEED_MEAN_LEN, mix_lengths, parse_mix  # noqa: E402
from environment import REPO_ROOT, run_environment  # noqa: E402
from report_rows import write_json, write_result_files  # noqa: E402
from timing import percentile, wall_samples  # noqa: E402

if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

STEM = "bench_model_step"
VARIANTS = {  # per workload; the first is the library's own conv (the base of "vs lib")
    "kda_layer": ("fla", "cakeconv", "noconv"),
    "kda_model": ("fla", "cakeconv", "noconv"),
    "kda_conv": ("fla", "cakeconv"),
    "mamba2_layer": ("dao", "cakeconv", "noconv"),
    "mamba2_conv": ("dao", "cakeconv"),
}
PART_WORKLOADS = {"kda": ("kda_layer", "kda_model", "kda_conv"), "mamba": ("mamba2_layer", "mamba2_conv")}
MODE_ENV = {"default": {"MAMBA_DETERMINISTIC": "0", "CAUSAL_CONV1D_DETERMINISTIC": "0"},
            "deterministic": {"MAMBA_DETERMINISTIC": "1", "CAUSAL_CONV1D_DETERMINISTIC": "1"}}
CPU_KDA = ("FLA's KDA kernels are Triton and need a CUDA GPU (under TRITON_INTERPRET=1 on the CPU its "
           "autotuner finds no active Triton driver)")
CPU_MAMBA = ("mamba_ssm's kernels are Triton and need a CUDA GPU (its launchers enter "
             "torch.cuda.device(x.device.index))")
CPU_FLA_CONV = "FLA's causal_conv1d is Triton and needs a CUDA GPU"
MAMBA_SRC_GUESSES = ("/tmp/mamba/mamba_ssm-2.3.2.post1", ".fla/mamba_ssm-2.3.2.post1")
VERSIONS = {}  # versions found while building (mamba_ssm's, read from its source)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", default="kda,mamba", help="kda, mamba (each its own process)")
    p.add_argument("--mamba-modes", default="default,deterministic", help="default, deterministic")
    p.add_argument("--workloads", default=",".join(VARIANTS), help="a comma list of " + ", ".join(VARIANTS))
    p.add_argument("--tokens", type=int, default=32768, help="S packed tokens per step")
    p.add_argument("--kda-mixes", default="seed,uniform:1-64")
    p.add_argument("--mamba-mixes", default="docs:10")
    p.add_argument("--kda-hidden", type=int, default=2048)
    p.add_argument("--kda-head-dim", type=int, default=128, help="heads = hidden / head_dim")
    p.add_argument("--kda-layers", type=int, default=4, help="layers of the KDA model")
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--mamba-d-model", type=int, default=2048)
    p.add_argument("--mamba-d-state", type=int, default=128)
    p.add_argument("--mamba-headdim", type=int, default=64)
    p.add_argument("--mamba-src", default=os.environ.get("MAMBA_SSM_SRC"),
                   help="the unpacked mamba_ssm source (the folder holding mamba_ssm/); default: $MAMBA_SSM_SRC, "
                        "an installed mamba_ssm, or " + ", ".join(MAMBA_SRC_GUESSES))
    p.add_argument("--precision", choices=("bf16", "amp"), default="bf16",
                   help="bf16: bf16 parameters and inputs; amp: FP32 parameters, bf16 inputs, autocast to bf16")
    p.add_argument("--cake-backend", choices=("auto", "triton", "reference"), default="auto",
                   help="cakeconv's backend (auto: Triton on a GPU, the reference on the CPU)")
    p.add_argument("--steps", type=int, default=20, help="timed rounds (one step per variant each)")
    p.add_argument("--warmup", type=int, default=3, help="rounds dropped first")
    p.add_argument("--repeats", type=int, default=5, help="forward+backward repeats of the determinism check")
    p.add_argument("--batches", type=int, default=4, help="distinct batches (document lengths) cycled")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--part-timeout", type=float, default=900.0, help="seconds per process at most")
    p.add_argument("--time-limit", type=float, default=0.0,
                   help="seconds for the whole run (0: none): a part gets what is left, so the JSON is always written")
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes, 2 rounds, no peers needed")
    p.add_argument("--out", default=".", help="folder for NAME.json and NAME_table.txt")
    p.add_argument("--name", default=STEM)
    p.add_argument("--part", help=argparse.SUPPRESS)       # internal: run one part in this process
    p.add_argument("--mode", help=argparse.SUPPRESS)       # internal: the part's mamba mode
    p.add_argument("--part-out", help=argparse.SUPPRESS)   # internal: where the part writes its rows
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.dry_run:
        args.tokens, args.kda_hidden, args.kda_head_dim, args.kda_layers, args.vocab = 128, 32, 8, 2, 64
        args.mamba_d_model, args.mamba_d_state, args.mamba_headdim = 32, 8, 8
        args.steps, args.warmup, args.repeats, args.batches = 2, 0, 2, 2
    for w in split(args.workloads):
        if w not in VARIANTS:
            p.error(f"unknown workload {w!r}: use {', '.join(VARIANTS)}")
    for part in split(args.parts):
        if part not in PART_WORKLOADS:
            p.error(f"unknown part {part!r}: use kda, mamba")
    for m in split(args.mamba_modes):
        if m not in MODE_ENV:
            p.error(f"unknown mamba mode {m!r}: use default, deterministic")
    for mix in split(args.kda_mixes) + split(args.mamba_mixes):
        canonical_mix(mix)
    return args


def split(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


# ------------------------------------------------------------------------------------- batches

def canonical_mix(mix: str) -> str:
    m = re.fullmatch(r"docs:(\d+)", mix.strip().lower())
    if m:
        if int(m[1]) < 1:
            raise SystemExit(f"docs:N needs N >= 1, got {mix!r}")
        return f"docs:{int(m[1])}"
    return parse_mix(mix)


def document_lengths(mix: str, S: int, seed: int) -> list[int]:
    """Lengths of ``mix``'s documents summing to S (``docs:N``: N - 1 random cut points)."""
    mix = canonical_mix(mix)
    if mix.startswith("docs:"):
        n = min(int(mix.split(":")[1]), S)
        cuts = sorted(random.Random(seed).sample(range(1, S), n - 1)) if n > 1 else []
        edges = [0] + cuts + [S]
        return [b - a for a, b in zip(edges, edges[1:])]
    return mix_lengths(mix, S, seed, mean_len=SEED_MEAN_LEN)


def make_batches(args, mix: str) -> list[dict]:
    """``--batches`` batches of ``mix`` on the host: cu_seqlens (int32 [N + 1]), seq_idx (int32 [1, S]),
    input_ids (int64 [1, S]); each step copies them to the device."""
    out = []
    for i in range(args.batches):
        lengths = document_lengths(mix, args.tokens, seed=1000 * args.seed + i)
        cu = torch.tensor([0] + lengths, dtype=torch.int64).cumsum(0).to(torch.int32)
        seq_idx = torch.repeat_interleave(torch.arange(len(lengths), dtype=torch.int32),
                                          torch.tensor(lengths)).view(1, -1)
        gen = torch.Generator().manual_seed(1000 * args.seed + i)
        ids = torch.randint(0, args.vocab, (1, args.tokens), generator=gen)
        out.append({"cu": cu, "seq_idx": seq_idx, "ids": ids, "n_docs": len(lengths),
                    "doc_min": min(lengths), "doc_max": max(lengths)})
    return out


def random_tensors(shapes: dict, device, dtype, seed: int, grad=()) -> dict:
    """Seeded standard-normal tensors of the given shapes (``grad``: the names that require grad)."""
    gen = torch.Generator().manual_seed(seed)
    return {k: torch.randn(s, generator=gen).to(device, dtype).requires_grad_(k in grad) for k, s in shapes.items()}


# ------------------------------------------------------------------------------------ variants

@dataclasses.dataclass
class Variant:
    """One variant of a workload. ``forward_backward(batch)`` runs the forward, the loss and the backward
    (returns the loss or None) and leaves the gradients; ``optimizer_step()`` steps (None: no optimizer);
    ``grads(batch)`` gives (the conv's gradients, every gradient) after a ``forward_backward``; ``clear()``
    drops every gradient. ``skip``: why it does not run here; ``error``: why it failed to build. ``info``:
    what the JSON row adds."""

    name: str
    runs: str = ""
    forward_backward: Callable | None = None
    optimizer_step: Callable | None = None
    grads: Callable | None = None
    clear: Callable | None = None
    skip: str | None = None
    error: str | None = None
    info: dict = dataclasses.field(default_factory=dict)


AUTOCAST = ["cuda", False]  # --precision amp on a GPU: the forward and backward under torch.autocast(bfloat16)


def module_variant(name, runs, module, loss_fn, inputs: dict, context=contextlib.nullcontext, conv_params=None):
    """A Variant training ``module`` with AdamW: ``loss_fn(module, batch)`` under ``context()``, the
    gradients of ``module``'s parameters and of ``inputs`` (tensors that require grad); the conv's
    parameters are those whose name holds ``conv1d`` unless ``conv_params`` is given."""
    params = list(module.parameters())
    conv = conv_params if conv_params is not None else [p for n, p in module.named_parameters() if "conv1d" in n]
    optimizer = torch.optim.AdamW(params, lr=1e-4, foreach=True)
    leaves = [t for t in inputs.values() if t.requires_grad]

    def forward_backward(batch):
        with context(), torch.autocast(AUTOCAST[0], torch.bfloat16, enabled=AUTOCAST[1]):
            loss = loss_fn(module, batch)
            loss.backward()
        return loss

    def clear():
        optimizer.zero_grad(set_to_none=True)
        for t in leaves:
            t.grad = None

    def grads(batch):
        return [p.grad for p in conv], [p.grad for p in params if p.grad is not None] + [t.grad for t in leaves]

    return Variant(name, runs, forward_backward, optimizer.step, grads, clear)



def swapped_count(report) -> int:
    """A swap's count: its SwapReport's ``swapped``, or the int older code returns."""
    return int(getattr(report, "swapped", report))


def skip_all(variants, reason):
    for v in variants:
        v.skip = v.skip or reason
    return variants


# ------------------------------------------------------------------------------------------ KDA

def kda_shapes(args) -> tuple[int, int]:
    """(heads, channels of each of the layer's q, k and v convs): hidden / head_dim heads, expand_v 1."""
    heads = args.kda_hidden // args.kda_head_dim
    return heads, heads * args.kda_head_dim


def kda_trio(args, build, loss_fn, inputs, swap) -> list:
    """The fla, cakeconv and noconv variants: ``build(short_conv)`` from the seed; the cakeconv one
    swapped; the noconv one takes the conv model's other weights."""
    fla_module, cake_module, noconv_module = build(True), build(True), build(False)
    report = swap(cake_module, cake_backend=args.cake_backend)
    reference = fla_module.state_dict()
    noconv_module.load_state_dict({k: v for k, v in reference.items() if k in noconv_module.state_dict()})
    cake = module_variant("cakeconv", "cakeconv (swap_short_convolutions)", cake_module, loss_fn, inputs)
    cake.info = {"swapped": swapped_count(report)}
    if not isinstance(report, int):
        cake.info["swap_report"] = str(report)
    fla = module_variant("fla", "FLA's ShortConvolution (as installed)", fla_module, loss_fn, inputs)
    fla.info = {"fla_conv_backend": sorted({str(getattr(m, "backend", None)) for m in fla_module.modules()
                                            if type(m).__name__ == "ShortConvolution"})}
    return [fla, cake,
            module_variant("noconv", "no conv (use_short_conv=False: SiLU of the projections)", noconv_module,
                           loss_fn, inputs)]


def kda_layer_variants(args, device, dtypes):
    from fla.layers import KimiDeltaAttention

    from cakeconv.integrations.fla import swap_short_convolutions

    heads, _ = kda_shapes(args)
    H = args.kda_hidden
    inputs = random_tensors({"x": (1, args.tokens, H), "dy": (1, args.tokens, H)}, device, dtypes[1], args.seed + 1,
                            grad=("x",))

    def build(short_conv):
        torch.manual_seed(args.seed)
        return KimiDeltaAttention(hidden_size=H, head_dim=args.kda_head_dim, num_heads=heads, conv_size=4,
                                  use_short_conv=short_conv, layer_idx=0).to(device, dtypes[0])

    def loss_fn(layer, batch):
        o, _, _ = layer(inputs["x"], cu_seqlens=batch["cu"].to(device))
        return (o * inputs["dy"]).sum(dtype=torch.float32)

    variants = kda_trio(args, build, loss_fn, inputs, swap_short_convolutions)
    return skip_all(variants, CPU_KDA) if device.type != "cuda" else variants


def kda_model_variants(args, device, dtypes):
    from fla.models import KDAConfig, KDAForCausalLM

    from cakeconv.integrations.fla import swap_short_convolutions

    heads, _ = kda_shapes(args)

    def build(short_conv):
        config = KDAConfig(hidden_size=args.kda_hidden, num_hidden_layers=args.kda_layers, head_dim=args.kda_head_dim,
                           num_heads=heads, conv_size=4, use_short_conv=short_conv, vocab_size=args.vocab,
                           use_cache=False)
        torch.manual_seed(args.seed)
        return KDAForCausalLM(config).to(device, dtypes[0]).train()

    def loss_fn(model, batch):
        ids = batch["ids"].to(device)
        return model(input_ids=ids, labels=ids, cu_seqlens=batch["cu"].to(device)).loss

    variants = kda_trio(args, build, loss_fn, {}, swap_short_convolutions)
    return skip_all(variants, CPU_KDA) if device.type != "cuda" else variants


def kda_conv_variants(args, device, dtypes):
    """The KDA layer's q, k and v ShortConvolutions alone (fla-core's module: no fla.layers needed)."""
    from fla.modules import ShortConvolution

    from cakeconv.integrations.fla import swap_short_convolutions

    _, D = kda_shapes(args)
    names = ("q", "k", "v")
    shapes = {f"x{n}": (1, args.tokens, D) for n in names} | {f"d{n}": (1, args.tokens, D) for n in names}
    inputs = random_tensors(shapes, device, dtypes[1], args.seed + 2, grad=tuple(f"x{n}" for n in names))

    def build():
        torch.manual_seed(args.seed)
        return torch.nn.ModuleList([ShortConvolution(hidden_size=D, kernel_size=4, bias=False, activation="silu")
                                    for _ in names]).to(device, dtypes[0])

    def loss_fn(convs, batch):
        cu = batch["cu"].to(device)
        return sum((conv(x=inputs[f"x{n}"], cu_seqlens=cu)[0] * inputs[f"d{n}"]).sum(dtype=torch.float32)
                   for conv, n in zip(convs, names))

    fla_convs, cake_convs = build(), build()
    report = swap_short_convolutions(cake_convs, cake_backend=args.cake_backend)
    fla = module_variant("fla", "FLA's ShortConvolution (as installed)", fla_convs, loss_fn, inputs,
                         conv_params=list(fla_convs.parameters()))
    cake = module_variant("cakeconv", "cakeconv (swap_short_convolutions)", cake_convs, loss_fn, inputs,
                          conv_params=list(cake_convs.parameters()))
    fla.optimizer_step = cake.optimizer_step = None  # forward and backward only
    cake.info = {"swapped": swapped_count(report)}
    if device.type != "cuda":
        fla.skip = CPU_FLA_CONV
    return [fla, cake]


# ---------------------------------------------------------------------------------------- Mamba2

def mamba_source(args) -> str | None:
    """The folder holding ``mamba_ssm/``: --mamba-src, an installed mamba_ssm's, or a known place."""
    if args.mamba_src:
        return args.mamba_src
    import importlib.util

    try:
        spec = importlib.util.find_spec("mamba_ssm")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        return os.path.dirname(list(spec.submodule_search_locations)[0])
    for guess in MAMBA_SRC_GUESSES:
        folder = guess if os.path.isabs(guess) else os.path.join(REPO_ROOT, guess)
        if os.path.isdir(os.path.join(folder, "mamba_ssm")):
            return folder
    return None


def import_mamba(args):
    """(``mamba_ssm.modules.mamba2``, ``mamba_ssm.ops.triton.ssd_combined``, mamba_ssm's version).

    ``mamba_ssm/__init__.py`` imports Mamba1's CUDA extension (``selective_scan_cuda``), which Mamba2's
    training path does not use: ``mamba_ssm`` is registered as a namespace package whose ``__path__`` is the
    source folder, so that file never runs."""
    import importlib.machinery

    if "mamba_ssm" not in sys.modules:
        folder = mamba_source(args)
        if folder is None or not os.path.isdir(os.path.join(folder, "mamba_ssm")):
            raise ImportError(f"no mamba_ssm source (--mamba-src; looked at {folder or ', '.join(MAMBA_SRC_GUESSES)})")
        package = types.ModuleType("mamba_ssm")
        package.__path__ = [os.path.join(folder, "mamba_ssm")]
        package.__spec__ = importlib.machinery.ModuleSpec("mamba_ssm", None, is_package=True)
        package.__spec__.submodule_search_locations = package.__path__
        sys.modules["mamba_ssm"] = package
    from mamba_ssm.modules import mamba2
    from mamba_ssm.ops.triton import ssd_combined

    init = os.path.join(sys.modules["mamba_ssm"].__path__[0], "__init__.py")
    found = re.search(r"__version__\s*=\s*[\"']([^\"']+)", open(init).read()) if os.path.exists(init) else None
    return mamba2, ssd_combined, found[1] if found else None


def noconv_fwd(x, weight, bias, seq_idx, initial_states, final_states_out, silu_activation):
    """``causal_conv1d_fwd_function`` with the conv replaced by the identity: x itself (no SiLU)."""
    return x


def noconv_bwd(x, weight, bias, dout, seq_idx, initial_states, dfinal_states, dx, return_dinitial_states,
               silu_activation):
    """Its ``causal_conv1d_bwd_function``: dout into the dx buffer mamba_ssm passes (the one pass a conv's
    backward writes too), zero weight and bias gradients."""
    if dx is None:
        dx = dout
    else:
        dx.copy_(dout)
    return dx, torch.zeros_like(weight), None if bias is None else torch.zeros_like(bias), None


class CallCounter:
    """A (fwd, bwd) pair that counts its calls; ``bound(module)`` binds it as the module's
    ``causal_conv1d_fwd_function`` / ``causal_conv1d_bwd_function`` for one step."""

    def __init__(self, pair):
        self.fwd_calls = self.bwd_calls = self.steps = 0
        fwd, bwd = pair

        def counted_fwd(*a, **k):
            self.fwd_calls += 1
            return fwd(*a, **k)

        def counted_bwd(*a, **k):
            self.bwd_calls += 1
            return bwd(*a, **k)

        self.pair = (counted_fwd, counted_bwd)

    @contextlib.contextmanager
    def bound(self, module):
        saved = (module.causal_conv1d_fwd_function, module.causal_conv1d_bwd_function)
        module.causal_conv1d_fwd_function, module.causal_conv1d_bwd_function = self.pair
        self.steps += 1
        try:
            yield
        finally:
            module.causal_conv1d_fwd_function, module.causal_conv1d_bwd_function = saved

    def info(self) -> dict:
        if not self.steps:
            return {}
        return {"conv_calls_per_step": {"fwd": self.fwd_calls / self.steps, "bwd": self.bwd_calls / self.steps}}


def mamba_pairs(args, ssd) -> tuple[dict, dict, dict]:
    """({variant: (fwd, bwd)}, {variant: why it has none}, the cakeconv variant's info): Dao's pair as
    ssd_combined bound it at import, the pair ``cakeconv.integrations.mamba_ssm.swap()`` binds there (read,
    then ``unswap()``), the identity."""
    dao = (ssd.causal_conv1d_fwd_function, ssd.causal_conv1d_bwd_function)
    pairs = {"dao": dao if dao[0] is not None else None, "noconv": (noconv_fwd, noconv_bwd)}
    reasons = {"dao": "causal-conv1d does not import (causal_conv1d.cpp_functions)"}
    info = {}
    try:
        from cakeconv.integrations import mamba_ssm as cake_mamba

        report = cake_mamba.swap(cake_backend=args.cake_backend)
        try:
            cake = (ssd.causal_conv1d_fwd_function, ssd.causal_conv1d_bwd_function)
        finally:
            cake_mamba.unswap()
        if cake == dao or cake[0] is None:
            raise RuntimeError("it left ssd_combined's causal_conv1d_fwd_function unchanged")
        pairs["cakeconv"] = cake
        info = {"swapped": swapped_count(report), "swap_report": str(report)}
    except Exception as exc:  # noqa: BLE001 - reported in the row
        reasons["cakeconv"] = f"cakeconv.integrations.mamba_ssm.swap(): {type(exc).__name__}: {exc}"
    return pairs, reasons, info


MAMBA_RUNS = {"dao": "causal-conv1d's causal_conv1d_fwd/bwd_function",
              "cakeconv": "cakeconv (cakeconv.integrations.mamba_ssm.swap)",
              "noconv": "no conv (identity functions, no SiLU)"}


def mamba_layer_variants(args, device, dtypes):
    mamba2, ssd, version = import_mamba(args)
    VERSIONS["mamba_ssm"] = version
    pairs, reasons, cake_info = mamba_pairs(args, ssd)
    d = args.mamba_d_model
    inputs = random_tensors({"x": (1, args.tokens, d), "dy": (1, args.tokens, d)}, device, dtypes[1], args.seed + 3,
                            grad=("x",))

    def loss_fn(layer, batch):
        o = layer(inputs["x"], seq_idx=batch["seq_idx"].to(device), cu_seqlens=batch["cu"].to(device))
        return (o * inputs["dy"]).sum(dtype=torch.float32)

    out = []
    for name in VARIANTS["mamba2_layer"]:
        if pairs.get(name) is None:
            out.append(Variant(name, MAMBA_RUNS[name], skip=reasons[name]))
            continue
        torch.manual_seed(args.seed)
        layer = mamba2.Mamba2(d_model=d, d_state=args.mamba_d_state, d_conv=4, expand=2, headdim=args.mamba_headdim,
                              use_mem_eff_path=True, layer_idx=0, device=device, dtype=dtypes[0])
        counter = CallCounter(pairs[name])
        v = module_variant(name, MAMBA_RUNS[name], layer, loss_fn, inputs,
                           context=functools.partial(counter.bound, ssd),
                           conv_params=[] if name == "noconv" else None)
        v.info = {"calls": counter, **(cake_info if name == "cakeconv" else {})}
        out.append(v)
    return skip_all(out, CPU_MAMBA) if device.type != "cuda" else out


def mamba_conv_shapes(args) -> tuple[int, int, int]:
    """(d_inner, conv channels, in_proj width) of the Mamba2 layer (expand 2, one group)."""
    d_inner = 2 * args.mamba_d_model
    conv = d_inner + 2 * args.mamba_d_state
    return d_inner, conv, 2 * d_inner + 2 * args.mamba_d_state + d_inner // args.mamba_headdim


def pair_variant(name, runs, pair, args, device, dtypes) -> Variant:
    """The conv pair alone, called as one Mamba2 step calls it: fwd, fwd again (the backward's
    recompute) and bwd, x the channel-last view of the conv's slice of the in_proj output, dx written
    into that slice of its gradient buffer."""
    d_inner, C, width = mamba_conv_shapes(args)
    t = random_tensors({"zx": (1, args.tokens, width), "dout": (1, args.tokens, C)}, device, dtypes[1], args.seed + 4)
    taps = random_tensors({"w": (C, 4), "b": (C,)}, device, dtypes[0], args.seed + 5)
    w, b = taps["w"] * 0.25, taps["b"] * 0.1
    dzx = torch.empty_like(t["zx"])
    fwd, bwd = pair
    res = {}

    def forward_backward(batch):
        seq_idx = batch["seq_idx"].to(device)
        x = t["zx"][..., d_inner:d_inner + C].transpose(1, 2)
        fwd(x, w, b, seq_idx, None, None, True)
        fwd(x, w, b, seq_idx, None, None, True)
        dx = dzx[..., d_inner:d_inner + C].transpose(1, 2)
        res["dx"], res["dw"], res["db"], _ = bwd(x, w, b, t["dout"].transpose(1, 2), seq_idx, None, None, dx,
                                                 False, True)
        return None

    def grads(batch):
        return [res["dw"], res["db"]], [res["dw"], res["db"], res["dx"]]

    return Variant(name, runs, forward_backward, None, grads, res.clear)


def mamba_conv_variants(args, device, dtypes):
    from cakeconv.integrations import dao as cdao

    out = []
    try:
        from causal_conv1d.cpp_functions import causal_conv1d_bwd_function, causal_conv1d_fwd_function
        dao = pair_variant("dao", MAMBA_RUNS["dao"], (causal_conv1d_fwd_function, causal_conv1d_bwd_function),
                           args, device, dtypes)
        if device.type != "cuda":
            dao.skip = "causal-conv1d's kernels need a CUDA GPU"
    except ImportError as exc:
        dao = Variant("dao", MAMBA_RUNS["dao"], skip=f"causal-conv1d does not import: {exc}")
    out.append(dao)
    if hasattr(cdao, "causal_conv1d_fwd_function"):
        pair = (functools.partial(cdao.causal_conv1d_fwd_function, backend=args.cake_backend),
                functools.partial(cdao.causal_conv1d_bwd_function, backend=args.cake_backend))
        out.append(pair_variant("cakeconv", "cakeconv.integrations.dao's causal_conv1d_fwd/bwd_function", pair,
                                args, device, dtypes))
    else:
        out.append(Variant("cakeconv", skip="cakeconv.integrations.dao has no causal_conv1d_fwd_function"))
    return out


BUILDERS = {"kda_layer": kda_layer_variants, "kda_model": kda_model_variants, "kda_conv": kda_conv_variants,
            "mamba2_layer": mamba_layer_variants, "mamba2_conv": mamba_conv_variants}


# ------------------------------------------------------------------------- determinism and timing

def digest(tensors) -> str | None:
    """SHA-256 of the tensors' bytes, in order (None for none)."""
    if not tensors:
        return None
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().reshape(-1).contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()


def determinism(v: Variant, batch, repeats: int):
    """One untimed forward and backward (compiles, autotunes), then ``repeats`` of the same pass of
    ``batch`` from the same weights (no optimizer step): (the row's fields, the first repeat's conv
    gradients flattened in FP32 on the host, or None)."""
    v.forward_backward(batch)
    v.clear()
    conv_digests, all_digests, loss0, conv0 = [], [], None, None
    for i in range(repeats):
        loss = v.forward_backward(batch)
        conv, every = v.grads(batch)
        conv_digests.append(digest(conv))
        all_digests.append(digest(every))
        if i == 0:
            loss0 = None if loss is None else float(loss.detach().float())
            conv0 = torch.cat([g.detach().float().reshape(-1).cpu() for g in conv]) if conv else None
        v.clear()
    return {"loss": loss0, "repeats": repeats,
            "distinct_conv_grads": len(set(conv_digests)) if conv_digests and conv_digests[0] else None,
            "distinct_grads": len(set(all_digests)) if all_digests else None}, conv0


def timed_step(v: Variant, batches):
    """One training step per call, the k-th call on batch k mod len(batches)."""
    calls = [0]

    def step():
        batch = batches[calls[0] % len(batches)]
        calls[0] += 1
        v.forward_backward(batch)
        if v.optimizer_step is not None:
            v.optimizer_step()
        v.clear()

    return step


def measure(args, live: dict, batches, device) -> tuple[dict, dict]:
    """({variant: [ms per step]}, {variant: error}) over interleaved rounds (timing.wall_samples)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    errors = {}
    samples = wall_samples({k: (timed_step(v, batches), 1) for k, v in live.items()}, args.steps, args.warmup,
                           sync, sync, on_error=lambda key, exc: errors.setdefault(key, f"{type(exc).__name__}: {exc}"))
    return samples, errors


def rel_diff(a, b) -> float | None:
    if a is None or b is None or a.shape != b.shape:
        return None
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def workload_rows(args, workload, mix, mode, variants, batches, device) -> list[dict]:
    """Determinism, then timing, of ``variants``: one row each."""
    base_fields = {"part": "kda" if workload.startswith("kda") else "mamba", "mode": mode, "workload": workload,
                   "mix": mix, "tokens": args.tokens, "n_docs": [b["n_docs"] for b in batches],
                   "doc_min": min(b["doc_min"] for b in batches), "doc_max": max(b["doc_max"] for b in batches)}
    fields, conv0 = {}, {}
    label = " ".join(t for t in (workload, mix, mode) if t)
    for v in variants:
        fields[v.name] = {"skip": v.skip, "error": v.error}
        if v.skip or v.error:
            continue
        progress(f"{label}: {v.name}: determinism ({args.repeats} repeats)")
        try:
            found, conv0[v.name] = determinism(v, batches[0], args.repeats)
            fields[v.name].update(found)
        except Exception as exc:  # noqa: BLE001 - reported in the row
            fields[v.name]["error"] = f"{type(exc).__name__}: {exc}"
    live = {v.name: v for v in variants if not v.skip and fields[v.name]["error"] is None}
    samples, errors = {}, {}
    if live:
        progress(f"{label}: timing {', '.join(live)} ({args.warmup} + {args.steps} rounds)")
        samples, errors = measure(args, live, batches, device)
    base = VARIANTS[workload][0]
    rows = []
    for v in variants:
        ms = samples.get(v.name, [])
        row = {**base_fields, "variant": v.name, "runs": v.runs, **fields[v.name],
               "median_ms": percentile(ms, 0.5) if ms else None, "p20_ms": percentile(ms, 0.2) if ms else None,
               "p80_ms": percentile(ms, 0.8) if ms else None, "steps": len(ms),
               "conv_grad_rel_diff_vs_lib": rel_diff(conv0.get(v.name), conv0.get(base)) if v.name != base else None}
        row["error"] = row["error"] or errors.get(v.name)
        row["tokens_per_s"] = args.tokens / row["median_ms"] * 1e3 if row["median_ms"] else None
        info = dict(v.info)
        if "calls" in info:
            info.update(info.pop("calls").info())
        rows.append({**row, **info})
    return rows


def progress(text: str) -> None:
    print(f"[model step {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------ processes

def part_mixes(args, part) -> list[str]:
    return [canonical_mix(m) for m in split(args.kda_mixes if part == "kda" else args.mamba_mixes)]


def part_workloads(args, part) -> list[str]:
    return [w for w in PART_WORKLOADS[part] if w in split(args.workloads)]


def version_of(module: str, *distributions: str) -> str | None:
    """The version of ``module`` if this process imported it, else of its installed distribution
    (nothing is imported here: importing fla takes seconds)."""
    if module in sys.modules:
        return getattr(sys.modules[module], "__version__", None)
    import importlib.metadata

    for name in distributions or (module,):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def part_environment(device) -> dict:
    env = run_environment(torch, device, "cpu (dry-run)")
    env["versions"] = {"fla": version_of("fla", "flash-linear-attention", "fla-core"),
                       "causal_conv1d": version_of("causal_conv1d"), "transformers": version_of("transformers"),
                       "einops": version_of("einops")}
    env["versions"].update(VERSIONS)
    env["variables"] = {k: v for k, v in sorted(os.environ.items())
                        if k in ("MAMBA_DETERMINISTIC", "CAUSAL_CONV1D_DETERMINISTIC", "TRITON_INTERPRET",
                                 "TRITON_CACHE_AUTOTUNING") or k.startswith("FLA_")}
    return env


def run_part(args) -> dict:
    """One part (kda, or mamba in --mode) in this process; its rows are rewritten to --part-out after
    every workload and mix, so a part cut short keeps what it finished."""
    device = torch.device("cuda" if torch.cuda.is_available() and not args.dry_run else "cpu")
    if device.type == "cuda":
        dtypes = (torch.bfloat16, torch.bfloat16) if args.precision == "bf16" else (torch.float32, torch.bfloat16)
    else:
        dtypes = (torch.float32, torch.float32)
    AUTOCAST[:] = [device.type, device.type == "cuda" and args.precision == "amp"]
    mode = args.mode if args.part == "mamba" else None
    result = {"part": args.part, "mode": mode, "rows": []}
    for workload in part_workloads(args, args.part):
        for mix in part_mixes(args, args.part):
            batches = make_batches(args, mix)
            try:
                variants = BUILDERS[workload](args, device, dtypes)
            except ImportError as exc:  # a library that is not installed: skipped
                variants = skip_all([Variant(n) for n in VARIANTS[workload]], f"{type(exc).__name__}: {exc}")
            except Exception as exc:  # noqa: BLE001 - one that does not build here: failed
                variants = [Variant(n, error=f"building: {type(exc).__name__}: {exc}") for n in VARIANTS[workload]]
            result["rows"] += workload_rows(args, workload, mix, mode, variants, batches, device)
            del variants
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
            result["env"] = part_environment(device)
            write_json(args.part_out, result)
    result["env"] = part_environment(device)
    write_json(args.part_out, result)
    return result


def run_child(args, part, mode, path, timeout: float) -> dict:
    """``part`` in its own process (with ``mode``'s variables for mamba), at most ``timeout`` seconds;
    returns what it wrote, with ``rc`` and ``seconds``."""
    if timeout <= 0:
        return {"part": part, "mode": mode, "rc": "not started: --time-limit spent", "seconds": 0.0}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH")) if p))
    env.update(MODE_ENV[mode] if mode else {})
    cmd = [sys.executable, os.path.abspath(__file__), *args.argv, "--part", part, "--part-out", path]
    cmd += ["--mode", mode] if mode else []
    variables = " ".join(f"{k}={v}" for k, v in (MODE_ENV[mode] if mode else {}).items())
    progress(f"part {part}{' (' + mode + ')' if mode else ''} {variables}")
    t0 = time.perf_counter()
    try:
        rc = subprocess.run(cmd, env=env, timeout=timeout, stdout=_stderr_fd()).returncode
    except subprocess.TimeoutExpired:
        rc = f"killed after {timeout:.0f} s (--part-timeout, --time-limit)"
    found = {}
    if os.path.exists(path):
        with open(path) as f:
            found = json.load(f)
    return {**found, "part": part, "mode": mode, "rc": rc, "seconds": round(time.perf_counter() - t0, 1)}


def _stderr_fd():
    """The part's output goes to this process's stderr, so that stdout ends with the table."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return None


def planned_rows(args, part, mode) -> list[dict]:
    return [{"part": part, "mode": mode, "workload": w, "mix": mix, "variant": name}
            for w in part_workloads(args, part) for mix in part_mixes(args, part) for name in VARIANTS[w]]


def ended(rc) -> str:
    return f"exited with {rc}" if isinstance(rc, int) else str(rc)


def merged_rows(args, part, mode, found: dict) -> list[dict]:
    """The part's planned rows, each as its process wrote it, or with the reason it has none."""
    done = {(r["workload"], r["mix"], r["variant"]): r for r in found.get("rows", [])}
    out = []
    for plan in planned_rows(args, part, mode):
        row = done.get((plan["workload"], plan["mix"], plan["variant"]))
        out.append(row if row is not None else {**plan, "skip": None, "median_ms": None,
                                                "error": f"not measured: the part's process {ended(found['rc'])}"})
    return out


# ----------------------------------------------------------------------------------- reporting

def _num(value, fmt: str, width: int) -> str:
    return f"{value:>{width}{fmt}}" if isinstance(value, (int, float)) else f"{'-':>{width}}"


def _ratio(row, other) -> float | None:
    if other is None or not row.get("median_ms") or not other.get("median_ms"):
        return None
    return row["median_ms"] / other["median_ms"]


def _distinct(row, key) -> str:
    return f"{row[key]}/{row['repeats']}" if row.get(key) is not None else "-"


def table(rows) -> str:
    """One line per row; vs lib / vs noconv: the median over the library's conv's / the no-conv
    variant's, same workload, mix and mode; grads: distinct digests / repeats."""
    head = (f"{'workload':<13}{'mix':<14}{'mode':<14}{'variant':<10}{'median ms':>10}{'p20':>9}{'p80':>9}"
            f"{'tokens/s':>11}{'vs lib':>8}{'vs noconv':>10}{'loss':>9}{'conv grads':>11}{'all grads':>10}"
            f"{'dW vs lib':>10}  conv")
    lines = [head]
    by_group = {}
    for r in rows:
        by_group.setdefault((r["workload"], r["mix"], r["mode"]), {})[r["variant"]] = r
    for (workload, mix, mode), group in by_group.items():
        base, noconv = group.get(VARIANTS[workload][0]), group.get("noconv")
        for name, r in group.items():
            line = f"{workload:<13}{mix:<14}{mode or '-':<14}{name:<10}"
            if r.get("median_ms") is None:
                why = f"skipped: {r['skip']}" if r.get("skip") else f"failed: {r.get('error')}"
                lines.append(line + "  " + why[:160])
                continue
            lines.append(line + _num(r["median_ms"], ".2f", 10) + _num(r["p20_ms"], ".2f", 9)
                         + _num(r["p80_ms"], ".2f", 9) + _num(r["tokens_per_s"], ".0f", 11)
                         + _num(_ratio(r, base), ".3f", 8) + _num(_ratio(r, noconv), ".3f", 10)
                         + _num(r.get("loss"), ".4f", 9) + f"{_distinct(r, 'distinct_conv_grads'):>11}"
                         + f"{_distinct(r, 'distinct_grads'):>10}" + _num(r.get("conv_grad_rel_diff_vs_lib"), ".1e", 10)
                         + f"  {r.get('runs', '')}{calls_text(r)}")
    return "\n".join(lines)


def calls_text(row) -> str:
    calls = row.get("conv_calls_per_step")
    return f" ({calls['fwd']:g} fwd + {calls['bwd']:g} bwd calls per step)" if calls else ""


def settings(args) -> dict:
    return {k: v for k, v in vars(args).items() if k not in ("out", "argv", "part", "mode", "part_out")}


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.part:
        return run_part(args)
    os.makedirs(args.out, exist_ok=True)
    parts = split(args.parts)
    plan = [("kda", None)] if "kda" in parts and part_workloads(args, "kda") else []
    plan += [("mamba", m) for m in split(args.mamba_modes) if "mamba" in parts and part_workloads(args, "mamba")]
    rows, done = [], []
    deadline = time.perf_counter() + args.time_limit if args.time_limit > 0 else float("inf")
    for part, mode in plan:
        path = os.path.join(args.out, f"{args.name}.{part}{'_' + mode if mode else ''}.part.json")
        left = deadline - time.perf_counter()
        found = run_child(args, part, mode, path, min(args.part_timeout, left) if left >= 10 else 0)
        env = found.get("env") or {}
        rows += [{**r, "gpu": env.get("gpu"), "date": env.get("date")} for r in merged_rows(args, part, mode, found)]
        done.append({k: found.get(k) for k in ("part", "mode", "rc", "seconds", "env")})
        if os.path.exists(path):
            os.remove(path)
    env = next((p["env"] for p in done if p.get("env")), None)
    result = {"env": env, "config": settings(args), "parts": done, "rows": rows}
    title = (f"Training step, {args.tokens} packed tokens, {args.precision}"
             f"{' (CPU dry run: float32)' if args.dry_run else ''}, median of {args.steps} rounds after "
             f"{args.warmup}; GPU: {(env or {}).get('gpu')}")
    write_result_files(args.out, args.name, result, title + "\n" + table(rows))
    return result


if __name__ == "__main__":
    main()
