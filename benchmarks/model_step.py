"""Training-step time of real layers and models with the library's own conv, cakeconv, and no conv.

FLA's KDA layer and KDAForCausalLM, mamba_ssm's Mamba2 layer, and their convs alone, timed in ``timing.wall_samples``
rounds after a determinism check; KDA in one process, each mamba_ssm mode in its own (benchmarks/README.md)."""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import importlib.machinery
import itertools
import os
import re
import sys
import time
import types

import torch

from benchmarks.op import mix_lengths, parse_mixes
from benchmarks.report import (REPO_ROOT, cell, choices, ended, option_parser, package_version, run_child,
                               run_environment, stamped, write_json, write_result_files)
from benchmarks.timing import percentile, wall_samples

VARIANTS = {  # per workload; the first is the library's own conv (the base of "vs lib")
    "kda_layer": ("fla", "cakeconv", "noconv"), "kda_model": ("fla", "cakeconv", "noconv"),
    "kda_conv": ("fla", "cakeconv"), "mamba2_layer": ("dao", "cakeconv", "noconv"), "mamba2_conv": ("dao", "cakeconv")}
PART_WORKLOADS = {"kda": ("kda_layer", "kda_model", "kda_conv"), "mamba": ("mamba2_layer", "mamba2_conv")}
MODE_ENV = {"default": {"MAMBA_DETERMINISTIC": "0", "CAUSAL_CONV1D_DETERMINISTIC": "0"},
            "deterministic": {"MAMBA_DETERMINISTIC": "1", "CAUSAL_CONV1D_DETERMINISTIC": "1"}}
MAMBA_SRC_GUESSES = ("/tmp/mamba/mamba_ssm-2.3.2.post1", ".fla/mamba_ssm-2.3.2.post1")
RUNS = {"fla": "FLA's ShortConvolution (as installed)", "cakeconv": "cakeconv (swap_short_convolutions)",
        "noconv": "no conv (use_short_conv=False: SiLU of the projections)",
        "dao": "causal-conv1d's causal_conv1d_fwd/bwd_function", "mamba_cakeconv":
        "cakeconv (cakeconv.integrations.mamba_ssm.swap)", "mamba_noconv": "no conv (identity functions, no SiLU)"}
OPTIONS = (  # (name, default, help); --dry-run replaces the defaults in DRY
    ("parts", "kda,mamba", "parts, each in its own process: kda (the KDA workloads), mamba (the Mamba2 ones)"),
    ("mamba-modes", "default,deterministic", "mamba_ssm modes, a process each: default (MAMBA_DETERMINISTIC and "
     "CAUSAL_CONV1D_DETERMINISTIC 0), deterministic (both 1)"),
    ("workloads", ",".join(VARIANTS), "workloads: the KDA layer, KDAForCausalLM, the KDA layer's q/k/v convs, "
     "the Mamba2 layer, its conv's fwd/bwd functions"),
    ("kda-mixes", "seed,uniform:1-64", "document mixes of the KDA workloads: benchmarks.op's (seed, uniform:A-B, "
     "fixed:N, ones, one, docs:N: N - 1 random cut points)"),
    ("mamba-mixes", "docs:10", "document mixes of the Mamba2 workloads (as --kda-mixes)"),
    ("tokens", 32768, "packed tokens per batch"), ("kda-hidden", 2048, "KDA hidden size"),
    ("kda-head-dim", 128, "KDA head dim (heads: hidden / head dim)"), ("kda-layers", 4, "KDAForCausalLM's layers"),
    ("vocab", 32000, "KDAForCausalLM's vocabulary"), ("mamba-d-model", 2048, "Mamba2's d_model (expand 2)"),
    ("mamba-d-state", 128, "Mamba2's d_state"), ("mamba-headdim", 64, "Mamba2's headdim"),
    ("steps", 20, "timed rounds, one training step per variant each"), ("warmup", 3, "untimed rounds before"),
    ("repeats", 5, "passes of the determinism check"), ("batches", 4, "distinct batches, cycled"),
    ("seed", 0, "seed of the weights, inputs and batches"), ("part-timeout", 900.0, "seconds per process at most"),
    ("time-limit", 0.0, "seconds for the whole run (0: none)"),
    ("out", ".", "folder for NAME.json and NAME_table.txt"), ("name", "model_step", "the result files' NAME"))
DRY = {"tokens": 128, "kda_hidden": 32, "kda_head_dim": 8, "kda_layers": 2, "vocab": 64, "mamba_d_model": 32,
       "mamba_d_state": 8, "mamba_headdim": 8, "steps": 2, "warmup": 0, "repeats": 2, "batches": 2}
CPU_KDA = ("FLA's KDA kernels are Triton and need a CUDA GPU (under TRITON_INTERPRET=1 on the CPU its autotuner "
           "finds no active Triton driver)")
VERSIONS = {}  # versions found while building (mamba_ssm's, read from its source)
progress = functools.partial(stamped, "model step")


def parse_args(argv=None):
    p = option_parser(__doc__, OPTIONS, ("part", "mode", "part-out"))  # a part's process: part, mamba mode, rows file
    p.add_argument("--mamba-src", default=os.environ.get("MAMBA_SSM_SRC"), help="the folder holding mamba_ssm/ "
                   f"(default: $MAMBA_SSM_SRC, else the first of {', '.join(MAMBA_SRC_GUESSES)} holding one)")
    p.add_argument("--dry-run", action="store_true", help="on the CPU in float32, tiny shapes: "
                   + ", ".join(f"{k}={v}" for k, v in DRY.items()))
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    vars(args).update(DRY if args.dry_run else {})
    choices(args.mamba_modes, MODE_ENV, "mamba-modes")  # checked here, split again in main
    workloads, parts = choices(args.workloads, VARIANTS, "workloads"), choices(args.parts, PART_WORKLOADS, "parts")
    mixes = {"kda": args.kda_mixes, "mamba": args.mamba_mixes}
    args.plan = {part: ([w for w in ws if w in workloads], parse_mixes([mixes[part]]))  # the parts run, in order
                 for part, ws in PART_WORKLOADS.items() if part in parts}
    return args


def make_batches(args, mix: str) -> list[dict]:
    """``--batches`` host batches of ``mix``: cu (int32 [N + 1]), seq_idx (int32 [1, S]), ids (int64 [1, S])."""
    out = []
    for i in range(args.batches):
        lengths = mix_lengths(mix, args.tokens, seed=1000 * args.seed + i)
        cu = torch.tensor([0] + lengths, dtype=torch.int64).cumsum(0).to(torch.int32)
        seq_idx = torch.repeat_interleave(torch.arange(len(lengths), dtype=torch.int32), torch.tensor(lengths))
        gen = torch.Generator().manual_seed(1000 * args.seed + i)
        out.append({"cu": cu, "seq_idx": seq_idx.view(1, -1), "ids": torch.randint(0, args.vocab, (1, args.tokens),
                    generator=gen), "n_docs": len(lengths), "doc_min": min(lengths), "doc_max": max(lengths)})
    return out


def random_tensors(shapes: dict, device, dtype, seed: int, grad=()) -> dict:
    gen = torch.Generator().manual_seed(seed)
    return {k: torch.randn(s, generator=gen).to(device, dtype).requires_grad_(k in grad) for k, s in shapes.items()}


def Variant(name, runs="", forward_backward=None, optimizer_step=None, grads=None, clear=None, skip=None, error=None):
    """forward_backward(batch) leaves gradients, grads(batch): (the conv's, all), clear() drops them."""
    return types.SimpleNamespace(**locals(), info={})


def module_variant(name, module, loss_fn, inputs: dict, context=contextlib.nullcontext, conv_params=None, runs=None):
    """``module`` trained by AdamW on ``loss_fn(module, batch)`` in ``context()``; conv: ``*conv1d*`` if not given."""
    params = list(module.parameters())
    conv = conv_params if conv_params is not None else [p for n, p in module.named_parameters() if "conv1d" in n]
    optimizer = torch.optim.AdamW(params, lr=1e-4, foreach=True)
    leaves = [t for t in inputs.values() if t.requires_grad]

    def forward_backward(batch):
        with context():
            loss = loss_fn(module, batch)
            loss.backward()
        return loss

    def clear():
        optimizer.zero_grad(set_to_none=True)
        for t in leaves:
            t.grad = None
    return Variant(name, runs or RUNS[name], forward_backward, optimizer.step, clear=clear, grads=lambda batch: (
        [p.grad for p in conv], [p.grad for p in params if p.grad is not None] + [t.grad for t in leaves]))


def skip_all(variants, reason):
    for v in variants:
        v.skip = v.skip or reason
    return variants


def kda_variants(args, device, dtype, workload) -> list:
    """KimiDeltaAttention (loss sum(o * dy)), KDAForCausalLM or the layer's q, k, v convs: fla, cakeconv (swapped),
    noconv (use_short_conv=False) with fla's other weights."""
    from cakeconv.integrations.fla import swap_short_convolutions
    H, hd, S, heads = args.kda_hidden, args.kda_head_dim, args.tokens, args.kda_hidden // args.kda_head_dim
    if workload == "kda_layer":
        from fla.layers import KimiDeltaAttention
        inputs = random_tensors({"x": (1, S, H), "dy": (1, S, H)}, device, dtype, args.seed + 1, grad=("x",))
        make = functools.partial(KimiDeltaAttention, hidden_size=H, head_dim=hd, num_heads=heads, conv_size=4,
                                 layer_idx=0)

        def loss_fn(layer, batch):
            o, _, _ = layer(inputs["x"], cu_seqlens=batch["cu"].to(device))
            return (o * inputs["dy"]).sum(dtype=torch.float32)
    elif workload == "kda_model":
        from fla.models import KDAConfig, KDAForCausalLM
        inputs = {}

        def make(use_short_conv):
            return KDAForCausalLM(KDAConfig(hidden_size=H, num_hidden_layers=args.kda_layers, head_dim=hd,
                                            num_heads=heads, conv_size=4, use_short_conv=use_short_conv,
                                            vocab_size=args.vocab, use_cache=False)).train()

        def loss_fn(model, batch):
            ids = batch["ids"].to(device)
            return model(input_ids=ids, labels=ids, cu_seqlens=batch["cu"].to(device)).loss
    else:  # fla-core's ShortConvolution: no fla.layers needed
        from fla.modules import ShortConvolution
        names = ("q", "k", "v")
        inputs = random_tensors({f"{t}{n}": (1, S, heads * hd) for t in "xd" for n in names}, device, dtype,
                                args.seed + 2, grad=tuple(f"x{n}" for n in names))

        def make(use_short_conv):
            return torch.nn.ModuleList([ShortConvolution(hidden_size=heads * hd, kernel_size=4, bias=False,
                                                         activation="silu") for _ in names])

        def loss_fn(convs, batch):
            cu = batch["cu"].to(device)
            return sum((conv(x=inputs[f"x{n}"], cu_seqlens=cu)[0] * inputs[f"d{n}"]).sum(dtype=torch.float32)
                       for conv, n in zip(convs, names))

    def build(use_short_conv):
        torch.manual_seed(args.seed)
        return make(use_short_conv=use_short_conv).to(device, dtype)
    fla, cake, conv_only = build(True), build(True), workload == "kda_conv"
    report = swap_short_convolutions(cake)
    out = [module_variant(n, m, loss_fn, inputs, conv_params=list(m.parameters()) if conv_only else None)
           for n, m in (("fla", fla), ("cakeconv", cake))]
    out[1].info = {"swapped": report.swapped} if conv_only else {"swapped": report.swapped, "swap_report": str(report)}
    if conv_only:
        out[0].optimizer_step = out[1].optimizer_step = None
        out[0].skip = None if device.type == "cuda" else "FLA's causal_conv1d is Triton and needs a CUDA GPU"
        return out
    noconv = build(False)
    noconv.load_state_dict({k: v for k, v in fla.state_dict().items() if k in noconv.state_dict()})
    out.append(module_variant("noconv", noconv, loss_fn, inputs))
    return out if device.type == "cuda" else skip_all(out, CPU_KDA)


def import_mamba(args):
    """(modules.mamba2, ops.triton.ssd_combined, version) of mamba_ssm as a namespace package (no __init__)."""
    if "mamba_ssm" not in sys.modules:
        places = [os.path.join(REPO_ROOT, g) for g in MAMBA_SRC_GUESSES]  # an absolute guess stays as it is
        folder = args.mamba_src or next((g for g in places if os.path.isdir(os.path.join(g, "mamba_ssm"))), None)
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
    """Its backward: dout into the dx buffer mamba_ssm passes, zero weight and bias gradients."""
    dx = dout if dx is None else dx.copy_(dout)
    return dx, torch.zeros_like(weight), None if bias is None else torch.zeros_like(bias), None


class CallCounter:
    """A (fwd, bwd) pair counting its calls; ``bound(module)`` binds it as ``module.causal_conv1d_*_function``."""

    def __init__(self, pair):
        self.calls, self.steps = {"fwd": 0, "bwd": 0}, 0
        self.pair = tuple(functools.partial(self._call, kind, fn) for kind, fn in zip(self.calls, pair))

    def _call(self, kind, fn, *a, **k):
        self.calls[kind] += 1
        return fn(*a, **k)

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
        return {"conv_calls_per_step": {k: n / self.steps for k, n in self.calls.items()}} if self.steps else {}


def mamba_layer_variants(args, device, dtype):
    """Mamba2 (expand 2, d_conv 4, use_mem_eff_path), loss sum(o * dy), each variant's pair bound into ssd_combined
    for its steps: Dao's (bound at import), the one cakeconv.integrations.mamba_ssm.swap() binds, the identity."""
    mamba2, ssd, VERSIONS["mamba_ssm"] = import_mamba(args)
    dao = (ssd.causal_conv1d_fwd_function, ssd.causal_conv1d_bwd_function)
    pairs = {"dao": dao if dao[0] is not None else None, "noconv": (noconv_fwd, noconv_bwd)}
    reasons, cake_info = {"dao": "causal-conv1d does not import (causal_conv1d.cpp_functions)"}, {}
    try:
        from cakeconv.integrations import mamba_ssm as cake_mamba
        report = cake_mamba.swap()
        try:
            cake = (ssd.causal_conv1d_fwd_function, ssd.causal_conv1d_bwd_function)
        finally:
            cake_mamba.unswap()
        if cake == dao or cake[0] is None:
            raise RuntimeError("it left ssd_combined's causal_conv1d_fwd_function unchanged")
        pairs["cakeconv"], cake_info = cake, {"swapped": report.swapped, "swap_report": str(report)}
    except Exception as exc:  # noqa: BLE001 - reported in the row
        reasons["cakeconv"] = f"cakeconv.integrations.mamba_ssm.swap(): {type(exc).__name__}: {exc}"
    d, out = args.mamba_d_model, []
    inputs = random_tensors({"x": (1, args.tokens, d), "dy": (1, args.tokens, d)}, device, dtype, args.seed + 3,
                            grad=("x",))

    def loss_fn(layer, batch):
        o = layer(inputs["x"], seq_idx=batch["seq_idx"].to(device), cu_seqlens=batch["cu"].to(device))
        return (o * inputs["dy"]).sum(dtype=torch.float32)
    for name in VARIANTS["mamba2_layer"]:
        runs = RUNS["dao" if name == "dao" else "mamba_" + name]
        if pairs.get(name) is None:
            out.append(Variant(name, runs, skip=reasons[name]))
            continue
        torch.manual_seed(args.seed)
        layer = mamba2.Mamba2(d_model=d, d_state=args.mamba_d_state, d_conv=4, expand=2, headdim=args.mamba_headdim,
                              use_mem_eff_path=True, layer_idx=0, device=device, dtype=dtype)
        counter = CallCounter(pairs[name])
        out.append(module_variant(name, layer, loss_fn, inputs, context=functools.partial(counter.bound, ssd),
                                  conv_params=[] if name == "noconv" else None, runs=runs))
        out[-1].info = {"calls": counter, **(cake_info if name == "cakeconv" else {})}
    return out if device.type == "cuda" else skip_all(out, "mamba_ssm's kernels are Triton and need a CUDA GPU (its "
                                                      "launchers enter torch.cuda.device(x.device.index))")


def pair_variant(name, runs, pair, args, device, dtype):
    """The pair as a Mamba2 step calls it: fwd, fwd (the recompute), bwd, on its slice of the in_proj output."""
    d_inner = 2 * args.mamba_d_model  # expand 2, one group
    C = d_inner + 2 * args.mamba_d_state
    width = 2 * d_inner + 2 * args.mamba_d_state + d_inner // args.mamba_headdim
    t = random_tensors({"zx": (1, args.tokens, width), "dout": (1, args.tokens, C)}, device, dtype, args.seed + 4)
    taps = random_tensors({"w": (C, 4), "b": (C,)}, device, dtype, args.seed + 5)
    w, b = taps["w"] * 0.25, taps["b"] * 0.1
    dzx, (fwd, bwd), res = torch.empty_like(t["zx"]), pair, {}

    def forward_backward(batch):
        seq_idx = batch["seq_idx"].to(device)
        x = t["zx"][..., d_inner:d_inner + C].transpose(1, 2)
        fwd(x, w, b, seq_idx, None, None, True)
        fwd(x, w, b, seq_idx, None, None, True)
        dx = dzx[..., d_inner:d_inner + C].transpose(1, 2)
        res["dx"], res["dw"], res["db"], _ = bwd(x, w, b, t["dout"].transpose(1, 2), seq_idx, None, None, dx,
                                                 False, True)
    return Variant(name, runs, forward_backward, None, clear=res.clear, grads=lambda batch: (
        [res["dw"], res["db"]], [res["dw"], res["db"], res["dx"]]))


def mamba_conv_variants(args, device, dtype):
    from cakeconv.integrations import dao as cdao
    try:
        from causal_conv1d.cpp_functions import causal_conv1d_bwd_function, causal_conv1d_fwd_function
        dao = pair_variant("dao", RUNS["dao"], (causal_conv1d_fwd_function, causal_conv1d_bwd_function), args, device,
                           dtype)
        dao.skip = None if device.type == "cuda" else "causal-conv1d's kernels need a CUDA GPU"
    except ImportError as exc:
        dao = Variant("dao", RUNS["dao"], skip=f"causal-conv1d does not import: {exc}")
    return [dao, pair_variant("cakeconv", "cakeconv.integrations.dao's causal_conv1d_fwd/bwd_function",
                              (cdao.causal_conv1d_fwd_function, cdao.causal_conv1d_bwd_function), args, device, dtype)]


BUILDERS = {"mamba2_layer": mamba_layer_variants, "mamba2_conv": mamba_conv_variants,
            **{w: functools.partial(kda_variants, workload=w) for w in PART_WORKLOADS["kda"]}}


def determinism(v, batch, repeats: int):
    """An untimed pass, then ``repeats``: (the row's fields, the first repeat's conv gradients in FP32 or None)."""
    def digest(tensors) -> str | None:  # SHA-256 of the tensors' bytes, in order
        h = hashlib.sha256()
        for t in tensors or ():
            h.update(t.detach().reshape(-1).contiguous().view(torch.uint8).cpu().numpy().tobytes())
        return h.hexdigest() if tensors else None
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


def train_step(v, batches) -> None:
    v.forward_backward(next(batches))
    if v.optimizer_step is not None:
        v.optimizer_step()
    v.clear()


def workload_rows(args, workload, mix, mode, variants, batches, device) -> list[dict]:
    """Determinism, then the interleaved timing, of ``variants``: one row each."""
    fields, conv0, label = {}, {}, " ".join(t for t in (workload, mix, mode) if t)
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
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    errors, samples = {}, {}
    if live:
        progress(f"{label}: timing {', '.join(live)} ({args.warmup} + {args.steps} rounds)")
        subjects = {k: (functools.partial(train_step, v, itertools.cycle(batches)), 1) for k, v in live.items()}
        samples = wall_samples(subjects, args.steps, args.warmup, sync, sync,
                               on_error=lambda k, exc: errors.setdefault(k, f"{type(exc).__name__}: {exc}"))
    base, rows = conv0.get(VARIANTS[workload][0]), []
    for v in variants:
        ms, mine = samples.get(v.name, []), conv0.get(v.name)
        q = {f"{k}_ms": percentile(ms, f) if ms else None for k, f in (("median", 0.5), ("p20", 0.2), ("p80", 0.8))}
        other = v.name != VARIANTS[workload][0] and mine is not None and base is not None and mine.shape == base.shape
        diff = float((mine - base).norm() / base.norm().clamp_min(1e-30)) if other else None  # relative L2, vs lib
        row = {"part": "kda" if workload.startswith("kda") else "mamba", "mode": mode, "workload": workload,
               "mix": mix, "tokens": args.tokens, "n_docs": [b["n_docs"] for b in batches],
               "doc_min": min(b["doc_min"] for b in batches), "doc_max": max(b["doc_max"] for b in batches),
               "variant": v.name, "runs": v.runs, **fields[v.name], **q, "steps": len(ms),
               "conv_grad_rel_diff_vs_lib": diff, "error": fields[v.name]["error"] or errors.get(v.name)}
        row["tokens_per_s"] = args.tokens / row["median_ms"] * 1e3 if row["median_ms"] else None
        calls = v.info.get("calls")  # a CallCounter: its calls per step
        rows.append({**row, **{k: x for k, x in v.info.items() if k != "calls"}, **(calls.info() if calls else {})})
    return rows


def run_part(args) -> dict:
    """One part in this process, bf16 on a GPU; --part-out is rewritten after every workload and mix."""
    device = torch.device("cuda" if torch.cuda.is_available() and not args.dry_run else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32  # parameters and inputs
    mode, (workloads, mixes) = args.mode if args.part == "mamba" else None, args.plan[args.part]
    result = {"part": args.part, "mode": mode, "rows": []}
    for workload, mix in [(w, m) for w in workloads for m in mixes]:
        batches = make_batches(args, mix)
        try:
            variants = BUILDERS[workload](args, device, dtype)
        except ImportError as exc:  # a library that is not installed: skipped
            variants = skip_all([Variant(n) for n in VARIANTS[workload]], f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # noqa: BLE001 - one that does not build here: failed
            variants = [Variant(n, error=f"building: {type(exc).__name__}: {exc}") for n in VARIANTS[workload]]
        result["rows"] += workload_rows(args, workload, mix, mode, variants, batches, device)
        del variants
        gc.collect()
        torch.cuda.empty_cache()  # a no-op without CUDA
        result["env"] = run_environment(torch, device, "cpu (dry-run)")
        result["env"]["versions"] = {"fla": package_version("fla", "flash-linear-attention", "fla-core"), **VERSIONS,
                                     **{m: package_version(m) for m in ("causal_conv1d", "transformers", "einops")}}
        result["env"]["variables"] = {k: v for k, v in sorted(os.environ.items()) if k.startswith("FLA_") or k in (
            "MAMBA_DETERMINISTIC", "CAUSAL_CONV1D_DETERMINISTIC", "TRITON_INTERPRET", "TRITON_CACHE_AUTOTUNING")}
        write_json(args.part_out, result)
    return result


def table(rows) -> str:
    """vs lib / vs noconv: the median over the library's conv's / no conv's; grads: distinct digests / repeats."""
    cols = (("median ms", 10, ".2f"), ("p20", 9, ".2f"), ("p80", 9, ".2f"), ("tokens/s", 11, ".0f"),
            ("vs lib", 8, ".3f"), ("vs noconv", 10, ".3f"), ("loss", 9, ".4f"), ("conv grads", 11, ""),
            ("all grads", 10, ""), ("dW vs lib", 10, ".1e"))

    lines = [f"{'workload':<13}{'mix':<14}{'mode':<14}{'variant':<10}" + "".join(f"{h:>{w}}" for h, w, _ in cols)
             + "  conv"]
    ms = {(r["workload"], r["mix"], r["mode"], r["variant"]): r.get("median_ms") for r in rows}
    for r in rows:
        line = f"{r['workload']:<13}{r['mix']:<14}{r['mode'] or '-':<14}{r['variant']:<10}"
        if r.get("median_ms") is None:
            why = f"skipped: {r['skip']}" if r.get("skip") else f"failed: {r.get('error')}"
            lines.append(line + "  " + why[:160])
            continue
        others = [ms.get((r["workload"], r["mix"], r["mode"], v)) for v in (VARIANTS[r["workload"]][0], "noconv")]
        values = [r["median_ms"], r["p20_ms"], r["p80_ms"], r["tokens_per_s"], *(r["median_ms"] / o if o else None
                  for o in others), r.get("loss"), *(f"{r[k]}/{r['repeats']}" if r.get(k) is not None else None
                  for k in ("distinct_conv_grads", "distinct_grads")), r.get("conv_grad_rel_diff_vs_lib")]
        calls = r.get("conv_calls_per_step")
        lines.append(line + "".join(cell(v, f, w) for v, (_, w, f) in zip(values, cols)) + f"  {r.get('runs', '')}"
                     + (f" ({calls['fwd']:g} fwd + {calls['bwd']:g} bwd calls per step)" if calls else ""))
    return "\n".join(lines)


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.part:
        return run_part(args)
    os.makedirs(args.out, exist_ok=True)
    rows, done = [], []
    deadline = time.perf_counter() + args.time_limit if args.time_limit > 0 else float("inf")
    for part in [p for p, (workloads, _) in args.plan.items() if workloads]:
        for mode in choices(args.mamba_modes, MODE_ENV, "mamba-modes") if part == "mamba" else [None]:
            path = os.path.abspath(os.path.join(args.out, f"{args.name}.{part}{'_' + mode if mode else ''}.part.json"))
            variables = MODE_ENV[mode] if mode else {}  # the part's process (report.run_child), its mode's variables
            progress(f"part {part}{f' ({mode})' if mode else ''} {' '.join(f'{k}={v}' for k, v in variables.items())}")
            cmd = [sys.executable, "-m", "benchmarks.model_step", *args.argv, "--part", part, "--part-out", path]
            found, rc, seconds = run_child(cmd + ["--mode", mode] * bool(mode), path, args.part_timeout, deadline,
                                           "--part-timeout", variables)
            env, (workloads, mixes) = found.get("env") or {}, args.plan[part]
            have = {(r["workload"], r["mix"], r["variant"]): r for r in found.get("rows", [])}
            why = f"not measured: the part's process {ended(rc)}"
            rows += [{**(have.get((w, mix, v)) or {"part": part, "mode": mode, "workload": w, "mix": mix,
                                                   "variant": v, "skip": None, "median_ms": None, "error": why}),
                      "gpu": env.get("gpu"), "date": env.get("date")}
                     for w in workloads for mix in mixes for v in VARIANTS[w]]
            done.append({"part": part, "mode": mode, "rc": rc, "seconds": round(seconds or 0.0, 1), "env": env or None})
    env = next((p["env"] for p in done if p.get("env")), None)
    config = {k: v for k, v in vars(args).items() if k not in ("out", "argv", "part", "mode", "part_out", "plan")}
    title = (f"Training step, {args.tokens} packed tokens, bf16{' (CPU dry run: float32)' * args.dry_run}"
             f", median of {args.steps} rounds after {args.warmup}; GPU: {(env or {}).get('gpu')}")
    result = {"env": env, "config": config, "parts": done, "rows": rows}
    write_result_files(args.out, args.name, result, title + "\n" + table(rows))
    return result


if __name__ == "__main__":
    main()
