"""Training-step time of a small Qwen3-Next causal LM: transformers as installed, swapped to cakeconv.

``swap_causal_conv1d`` (cakeconv.integrations.transformers) puts cakeconv's deterministic op under
the short convolutions of transformers' GatedDeltaNet layers. This script builds one randomly
initialised ``Qwen3NextForCausalLM`` (config only, nothing downloaded) per variant, from the same
seed, and times full training steps (forward, loss, backward, AdamW step, zero_grad):

- ``transformers``: the model as transformers runs it: Dao's ``causal_conv1d_fn`` when causal-conv1d
  imports, else transformers' PyTorch fallback (the JSON says which);
- ``cakeconv``: the same model with what ``swap_causal_conv1d`` binds in its modeling module, forced
  around this row's steps only (the swap is process-wide: the other rows must not run it);
- ``dao``: Dao's function forced into the modeling module while that model runs (only when
  causal-conv1d imports; it is then also what ``transformers`` runs, measured twice on purpose:
  the two rows' difference is the run's noise);
- ``pytorch``: transformers' PyTorch fallback (one depthwise ``F.conv1d`` and SiLU) forced the same
  way, i.e. what a user without causal-conv1d runs (only when causal-conv1d imports, since
  ``transformers`` runs that fallback otherwise; not with ``--packed``, which it refuses).
A forced row whose function was never called (a transformers that does not read the module's
global at call time) is reported as failed.

Protocol: one step per variant per round, the order rotating every round (benchmarks/timing.py,
``wall_samples``); each sample is the CUDA-synchronised wall time of one step; the first
``--warmup`` rounds are dropped; the median and the 20/80 % quantiles of ``--steps`` rounds are
reported, with tokens per second and each variant's first loss (the variants start from equal
weights and see equal batches, so their losses agree to bf16 rounding).

The gated delta rule: transformers runs flash-linear-attention's chunked kernel when ``fla``
imports, else its PyTorch one. fla 0.6.0 refuses that kernel's backward on Hopper GPUs with
Triton 3.4-3.7.0 unless tilelang is installed; ``--delta-rule auto`` (the default) tries one step
and, if fla refuses, runs transformers' PyTorch delta rule in every variant (the JSON says which
ran). The convolution is then a smaller part of the step.

Usage:
    python benchmarks/bench_model_swap.py --out results_dir            # GPU, FP32 parameters + bf16 autocast
    python benchmarks/bench_model_swap.py --dry-run --out /tmp/swap     # CPU, tiny, 2 steps (tests)
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import subprocess
import sys

import torch
import torch.nn.functional as F

from timing import percentile, wall_samples

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from cakeconv.integrations import dao as cdao  # noqa: E402
from cakeconv.integrations.transformers import swap_causal_conv1d, unswap_causal_conv1d  # noqa: E402

STEM = "bench_model_swap"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--layer-mix", choices=("linear", "default"), default="default",
                   help="linear: every layer a GatedDeltaNet; default: every 4th full attention (Qwen3-Next's mix)")
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--batch", type=int, default=4, help="B rows of --seq-len tokens")
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--packed", action="store_true",
                   help="each row packs documents of 64-2048 tokens, kept apart by seq_idx (variants that "
                        "refuse seq_idx are reported as such)")
    p.add_argument("--steps", type=int, default=30, help="timed rounds (one step per variant each)")
    p.add_argument("--warmup", type=int, default=5, help="rounds dropped first")
    p.add_argument("--delta-rule", choices=("auto", "torch"), default="auto")
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny model, 2 rounds, no warm-up")
    p.add_argument("--precision", choices=("amp", "bf16"), default="amp",
                   help="amp: FP32 parameters under torch.autocast(bfloat16), as mixed-precision training runs "
                        "(the conv gets bf16 x and FP32 taps); bf16: every parameter bf16 (GPU only)")
    p.add_argument("--out", default=".", help="folder for the JSON file")
    p.add_argument("--name", default=STEM, help="the JSON file's stem (e.g. h200_model_swap)")
    args = p.parse_args(argv)
    if args.dry_run:
        args.hidden, args.layers, args.vocab, args.batch, args.seq_len = 64, 2, 128, 2, 48
        args.steps, args.warmup = 2, 0
    return args


# ------------------------------------------------------------------------------ model and data

def model_config(args):
    from transformers import Qwen3NextConfig

    heads_k = max(1, args.hidden // 256)
    head_dim = min(128, args.hidden // 2)
    mix = ["full_attention" if args.layer_mix == "default" and i % 4 == 3 else "linear_attention"
           for i in range(args.layers)]
    return Qwen3NextConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=3 * args.hidden,
        num_hidden_layers=args.layers, layer_types=mix, num_attention_heads=max(2, args.hidden // 128),
        num_key_value_heads=1, head_dim=head_dim, linear_conv_kernel_dim=4, linear_key_head_dim=head_dim,
        linear_value_head_dim=head_dim, linear_num_key_heads=heads_k, linear_num_value_heads=2 * heads_k,
        mlp_only_layers=list(range(args.layers)), num_experts=0, max_position_embeddings=max(4096, args.seq_len),
        use_cache=False, tie_word_embeddings=False)


def build_model(config, device, dtype):
    from transformers import Qwen3NextForCausalLM

    torch.manual_seed(0)
    model = Qwen3NextForCausalLM(config).to(device, dtype)
    model.train()
    return model


def make_batch(args, device):
    """input_ids [B, T] (labels the same) and, with --packed, seq_idx [B, T] (int32 document ids)."""
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq_len), generator=gen)
    batch = {"input_ids": ids.to(device), "labels": ids.to(device)}
    if args.packed:
        rows = []
        for _ in range(args.batch):
            row, doc = [], 0
            while len(row) < args.seq_len:
                row += [doc] * int(torch.randint(64, 2049, (), generator=gen))
                doc += 1
            rows.append(row[:args.seq_len])
        batch["seq_idx"] = torch.tensor(rows, dtype=torch.int32, device=device)
    return batch


def modeling_module():
    from transformers.models.qwen3_next import modeling_qwen3_next

    return modeling_qwen3_next


class ConvForced:
    """A context-manager factory: while its block runs, the modeling module's global
    ``causal_conv1d_fn`` is ``fn`` (transformers 5.x's layers read that global at call time, form 2
    of cakeconv.integrations.transformers), and ``calls`` counts the calls that reached it."""

    def __init__(self, fn, runs: str):
        self.fn, self.runs, self.calls = fn, runs, 0

    @contextlib.contextmanager
    def __call__(self):
        module = modeling_module()

        def counted(*args, **kwargs):
            self.calls += 1
            return self.fn(*args, **kwargs)

        saved = module.causal_conv1d_fn
        module.causal_conv1d_fn = counted
        try:
            yield
        finally:
            module.causal_conv1d_fn = saved


def dao_conv(dao_fn):
    """Dao's ``causal_conv1d_fn`` called as transformers calls it: the keyword arguments it does not
    take dropped."""
    names = ("seq_idx", "initial_states", "return_final_states", "final_states_out", "activation")

    def conv(x, weight, bias=None, **kwargs):
        return dao_fn(x, weight, bias, **{k: v for k, v in kwargs.items() if k in names})

    return conv


def pytorch_conv(x, weight, bias=None, activation=None, **kwargs):
    """transformers' PyTorch fallback, written out: y [B, D, T] = act(depthwise F.conv1d of x [B, D, T]
    with weight [D, W], W - 1 left zero columns), computed in weight's dtype, returned in x's.
    Refuses ``seq_idx`` as that fallback does (it cannot keep packed documents apart)."""
    if kwargs.get("seq_idx") is not None:
        raise ValueError("transformers' PyTorch fallback takes no seq_idx (run without --packed)")
    _, D, T = x.shape
    y = F.conv1d(x.to(weight.dtype), weight.unsqueeze(1), bias, padding=weight.shape[-1] - 1, groups=D)[..., :T]
    if activation in ("silu", "swish"):
        y = F.silu(y)
    else:
        assert activation is None, f"Qwen3-Next's activation is silu, got {activation!r}"
    return y.to(x.dtype)


def _plain_function(rule):
    """transformers' own PyTorch function behind a decorated delta rule: the ``__wrapped__`` of its
    fallback wrapper (which picks fla's kernel when fla imports), also when that wrapper sits in a
    ``kernels`` function module (transformers 5.25: its forward holds the wrapper in a closure)."""
    if isinstance(rule, torch.nn.Module):
        inner = [c.cell_contents for c in type(rule).forward.__closure__ or () if callable(c.cell_contents)]
        assert len(inner) == 1, f"a kernels function module holds one function, got {inner}"
        rule = inner[0]
    return getattr(rule, "__wrapped__", rule)


def torch_delta_rules() -> dict:
    """{name in the modeling module: transformers' PyTorch function} for its chunked and recurrent
    gated delta rules."""
    module = modeling_module()
    return {name: _plain_function(getattr(module, name))
            for name in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule")}


def use_torch_delta_rule() -> None:
    """transformers' PyTorch delta rules (chunked and recurrent) in place of fla's (every model built
    after this)."""
    module = modeling_module()
    for name, fn in torch_delta_rules().items():
        setattr(module, name, fn)


# ------------------------------------------------------------------------------------ stepping

AUTOCAST = [False]  # --precision amp on a GPU: every step under torch.autocast(bfloat16)


def make_step(model, batch, context):
    """One training step of ``model`` on ``batch`` under ``context`` (a context-manager factory);
    returns the loss tensor."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    device_type = next(model.parameters()).device.type

    def step():
        with context(), torch.autocast(device_type, torch.bfloat16, enabled=AUTOCAST[0]):
            loss = model(**batch).loss
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    return step


def delta_rule_refused(args, config, device, dtype) -> bool:
    """Whether fla's chunked delta rule refuses the backward here (a one-step probe)."""
    model = build_model(config, device, dtype)
    try:
        make_step(model, make_batch(args, device), contextlib.nullcontext)()
        return False
    except RuntimeError as error:
        if "tilelang" in str(error) or "#640" in str(error):
            return True
        raise
    finally:
        del model


def checked(step, forced: ConvForced):
    """``step``, failing (an error row) when no call reached the forced convolution."""
    def run():
        loss = step()
        if forced.calls == 0:
            raise RuntimeError(f"{forced.runs}: never called (this transformers does not read its modeling "
                               f"module's causal_conv1d_fn at call time)")
        return loss
    return run


def variants(args, config, device, dtype, batch):
    """{name: (step, what runs the convolution)}: transformers as installed, swapped, and where
    causal-conv1d imports (so that transformers runs it), also Dao's and the PyTorch fallback forced."""
    dao = cdao.dao_causal_conv1d()
    plain = build_model(config, device, dtype)
    swapped = build_model(config, device, dtype)
    # The swap rebinds the modeling module's global for every model of the process: take what it
    # binds, undo it, and force that binding around the cakeconv row's steps only.
    report = swap_causal_conv1d(swapped)
    assert report.swapped > 0, "no layer of the model was swapped"
    cake = ConvForced(modeling_module().causal_conv1d_fn,
                      f"cakeconv (swap_causal_conv1d: {len(report.on_cakeconv)} convolutions reached)")
    unswap_causal_conv1d()
    out = {
        "transformers": (make_step(plain, batch, contextlib.nullcontext),
                         "Dao's causal_conv1d_fn" if dao else "transformers' PyTorch fallback"),
        "cakeconv": (checked(make_step(swapped, batch, cake), cake), cake.runs),
    }
    if dao is not None:
        forced = {"dao": ConvForced(dao_conv(dao[0]), "Dao's causal_conv1d_fn, forced")}
        if not args.packed:
            forced["pytorch"] = ConvForced(pytorch_conv, "transformers' PyTorch fallback (F.conv1d + SiLU), forced")
        for name, conv in forced.items():
            model = build_model(config, device, dtype)
            out[name] = (checked(make_step(model, batch, conv), conv), conv.runs)
    return out


def measure(args, subjects, device):
    """{name: {"median_ms", "p20_ms", "p80_ms", "first_loss", "error"}} over interleaved rounds."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    first = {}
    errors = {}

    def recorded(name, step):
        def run():
            loss = step()
            first.setdefault(name, float(loss.detach().float()))
        return run

    samples = wall_samples({k: (recorded(k, s), 1) for k, s in subjects.items()}, args.steps, args.warmup,
                           sync, sync, on_error=lambda key, exc: errors.setdefault(key, f"{type(exc).__name__}: {exc}"))
    rows = {}
    for name in subjects:
        ms = samples.get(name, [])
        rows[name] = {"median_ms": percentile(ms, 0.5), "p20_ms": percentile(ms, 0.2), "p80_ms": percentile(ms, 0.8),
                      "first_loss": first.get(name), "error": errors.get(name)}
    return rows


# ---------------------------------------------------------------------------------- reporting

def _version(name):
    try:
        module = __import__(name)
    except Exception:  # noqa: BLE001 - absent or broken: reported as None
        return None
    return getattr(module, "__version__", None)


def environment(device) -> dict:
    try:
        commit = subprocess.run(["git", "-C", REPO, "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip() or None
    except OSError:
        commit = None
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "commit": os.environ.get("BENCH_COMMIT") or commit,
            "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
            "cpu": platform.processor() or platform.machine(), "python": platform.python_version(),
            "torch": torch.__version__, "triton": _version("triton"), "transformers": _version("transformers"),
            "causal_conv1d": _version("causal_conv1d"), "fla": _version("fla")}


def table(rows: dict, tokens: int) -> str:
    base = rows.get("transformers", {}).get("median_ms")
    lines = [f"{'variant':<14}{'median ms':>11}{'p20':>9}{'p80':>9}{'tokens/s':>12}{'vs transformers':>17}"
             f"{'first loss':>12}  convolution"]
    for name, r in rows.items():
        if r["error"] is not None:
            lines.append(f"{name:<14}  failed: {r['error'][:90]}")
            continue
        ratio = r["median_ms"] / base if base and base == base else float("nan")
        lines.append(f"{name:<14}{r['median_ms']:>11.2f}{r['p20_ms']:>9.2f}{r['p80_ms']:>9.2f}"
                     f"{tokens / r['median_ms'] * 1e3:>12.0f}{ratio:>17.3f}{r['first_loss']:>12.4f}  {r['runs']}")
    return "\n".join(lines)


def main(argv=None) -> dict:
    args = parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # transformers' one-line notes on its PyTorch fallbacks
    device = torch.device("cpu" if args.dry_run or not torch.cuda.is_available() else "cuda")
    dtype = torch.bfloat16 if device.type == "cuda" and args.precision == "bf16" else torch.float32
    AUTOCAST[0] = device.type == "cuda" and args.precision == "amp"
    config = model_config(args)
    delta_rule = "transformers' choice (fla when it imports)"
    # fla's delta rules are Triton kernels: on the CPU (the dry run) transformers' PyTorch ones run
    if args.delta_rule == "torch" or device.type == "cpu" or delta_rule_refused(args, config, device, dtype):
        use_torch_delta_rule()
        delta_rule = "transformers' PyTorch chunked delta rule"
    batch = make_batch(args, device)
    subjects = variants(args, config, device, dtype, batch)
    rows = measure(args, {k: v[0] for k, v in subjects.items()}, device)
    for name, (_, runs) in subjects.items():
        rows[name]["runs"] = runs
    tokens = args.batch * args.seq_len
    channels = (2 * config.linear_key_head_dim * config.linear_num_key_heads
                + config.linear_value_head_dim * config.linear_num_value_heads)
    settings = {k: v for k, v in vars(args).items() if k != "out"}
    result = {"env": environment(device),
              "config": {**settings, "dtype": str(dtype), "autocast_bf16": AUTOCAST[0], "delta_rule": delta_rule, "conv_channels": channels},
              "tokens_per_step": tokens, "rows": rows}
    print(f"Qwen3-Next, hidden {args.hidden}, {args.layers} layers ({args.layer_mix}), {args.batch} x {args.seq_len} "
          f"tokens{' packed' if args.packed else ''}, {dtype}{' + autocast bf16' if AUTOCAST[0] else ''}, delta rule: {delta_rule}")
    print(table(rows, tokens))
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{args.name}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
