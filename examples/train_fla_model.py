"""Train a small flash-linear-attention model with and without cakeconv's short convolutions (GPU).

Run:  python examples/train_fla_model.py [--steps 300] [--out OUT_DIR]
Needs a CUDA GPU and flash-linear-attention 0.6.0 (``pip install flash-linear-attention==0.6.0``).
About a minute on one H200 at the defaults (most of it Triton compiling and autotuning FLA's kernels).

What it does:

1. builds a ``GatedDeltaNetForCausalLM`` from ``fla.models`` (hidden 256, 2 layers, 4 heads of 64,
   vocabulary 1000, bf16; ``--model delta_net``: a ``DeltaNetForCausalLM``, see below) and a deep
   copy of it, and calls ``swap_short_convolutions`` on the copy:
   its 6 ``ShortConvolution`` modules (q, k, v of each layer) now run cakeconv's deterministic op on
   the training path; the other is left as FLA ships it;
2. trains both with AdamW on the same packed batches: ``--tokens`` tokens per step in documents of
   varied lengths (1 to 2,048 tokens, ``cu_seqlens``), drawn from one fixed Markov chain (each
   token has 4 likely successors, so the best loss is ln 4 = 1.386);
3. alternates the two models step by step (which one goes first alternates too), times each
   training step (forward, backward, optimizer step; ``torch.cuda.synchronize`` on both sides),
   and prints the losses and step times; the first ``--warmup`` steps are left out of the times.

``--model auto`` (the default) takes GatedDeltaNet when FLA runs its backward on this GPU, else
DeltaNet: FLA 0.6.0 refuses GatedDeltaNet's backward on Hopper GPUs with Triton >= 3.4 and < 3.7.1
("produces incorrect results for gated chunk_bwd_dqkwg", its issue #640) unless tilelang is
installed, with or without cakeconv. DeltaNet holds its q, k and v ``ShortConvolution`` modules the
same way, and its backward does not use that kernel.

The two loss curves track each other (they differ only by the last bits of the convolutions'
outputs, which bf16 training then carries along). The output goes to the terminal and to
``OUT_DIR/train_fla_model.log``; the per-step numbers to ``OUT_DIR/train_fla_model.json``.

Shape legend: S packed tokens per step, N documents, V vocabulary.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import statistics
import sys
import time
import warnings

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)  # run from a checkout without installing

from cakeconv.integrations.fla import swap_short_convolutions  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300, help="training steps per model (default 300)")
    p.add_argument("--out", default="fla_train_out", help="folder for train_fla_model.log/.json")
    p.add_argument("--tokens", type=int, default=16384, help="packed tokens per step S (default 16384)")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=20, help="steps left out of the step times (default 20)")
    p.add_argument("--print-every", type=int, default=25)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda", help="default cuda (flash-linear-attention's kernels need a GPU)")
    p.add_argument("--model", default="auto", choices=("auto", "gated_deltanet", "delta_net"),
                   help="auto: gated_deltanet when FLA runs its backward on this GPU, else delta_net")
    return p.parse_args(argv)


class Log:
    """Prints to the terminal and appends to a file."""

    def __init__(self, path):
        self.file = open(path, "w")

    def __call__(self, *parts):
        line = " ".join(str(p) for p in parts)
        print(line, flush=True)
        self.file.write(line + "\n")
        self.file.flush()


def document_lengths(S, gen):
    """Lengths summing to S: log-uniform in [1, 2048] (many short documents, a few long ones)."""
    lengths = []
    while sum(lengths) < S:
        n = int(math.exp(torch.rand((), generator=gen).item() * math.log(2048)))
        lengths.append(max(1, min(n, S - sum(lengths))))
    return lengths


def make_batch(S, V, succ_VK, gen, device):
    """input_ids [1, S], labels [1, S] (-100 at document starts) and cu_seqlens [N + 1] int32."""
    lengths = document_lengths(S, gen)
    cu = torch.tensor([0] + lengths, dtype=torch.int64).cumsum(0)
    N, L = len(lengths), max(lengths)
    # All documents walk the chain together, one column per position.
    walk_NL = torch.empty(N, L, dtype=torch.int64)
    walk_NL[:, 0] = torch.randint(0, V, (N,), generator=gen)
    picks_NL = torch.randint(0, succ_VK.shape[1], (N, L), generator=gen)
    for t in range(1, L):
        walk_NL[:, t] = succ_VK[walk_NL[:, t - 1], picks_NL[:, t]]
    ids = torch.cat([walk_NL[n, :length] for n, length in enumerate(lengths)])
    labels = ids.clone()
    labels[cu[:-1]] = -100  # no prediction across a document boundary
    return ids[None].to(device), labels[None].to(device), cu.to(torch.int32).to(device)


def gated_backward_refusal(device):
    """FLA's error message if it refuses GatedDeltaNet's backward on this device, else None."""
    from fla.layers import GatedDeltaNet

    layer = GatedDeltaNet(hidden_size=128, head_dim=64, num_heads=2, mode="chunk", layer_idx=0)
    layer = layer.to(device=device, dtype=torch.bfloat16)
    x = torch.randn(1, 64, 128, device=device, dtype=torch.bfloat16, requires_grad=True)
    try:
        layer(x)[0].float().sum().backward()
    except RuntimeError as error:
        if "chunk_bwd_dqkwg" in str(error):
            return str(error)
        raise
    return None


def build_model(name, args, device):
    """(model, description): a small FLA causal LM of the family ``name``, bf16, on ``device``."""
    from fla.models import DeltaNetConfig, DeltaNetForCausalLM, GatedDeltaNetConfig, GatedDeltaNetForCausalLM

    common = dict(hidden_size=args.hidden, num_hidden_layers=args.layers, vocab_size=args.vocab,
                  num_heads=args.hidden // 64, attn_mode="chunk", max_position_embeddings=4096)
    if name == "gated_deltanet":
        config, cls = GatedDeltaNetConfig(head_dim=64, expand_v=2.0, **common), GatedDeltaNetForCausalLM
    else:
        config, cls = DeltaNetConfig(**common), DeltaNetForCausalLM
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cls(config).to(device=device, dtype=torch.bfloat16), cls.__name__


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv=None):
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("train_fla_model.py needs a CUDA GPU (flash-linear-attention's kernels are Triton GPU kernels)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import fla
            import fla.models  # noqa: F401
    except ImportError as error:
        sys.exit(f"train_fla_model.py needs flash-linear-attention 0.6.0: {error}")
    import triton

    os.makedirs(args.out, exist_ok=True)
    log = Log(os.path.join(args.out, "train_fla_model.log"))
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)
    log(f"# {device_name}, torch {torch.__version__}, triton {triton.__version__}, "
        f"fla {getattr(fla, '__version__', '?')}, python {platform.python_version()}")
    log(f"# steps {args.steps}, S = {args.tokens} tokens per step, hidden {args.hidden}, {args.layers} layers, "
        f"V = {args.vocab}, AdamW lr {args.lr}, bf16; times leave out the first {args.warmup} steps")

    name = args.model
    if name == "auto":
        refusal = gated_backward_refusal(device)
        name = "gated_deltanet" if refusal is None else "delta_net"
        if refusal is not None:
            log(f"# --model auto: DeltaNet, since FLA refuses GatedDeltaNet's backward here: {refusal}")
    torch.manual_seed(args.seed)
    fla_model, model_name = build_model(name, args, device)
    log(f"# model: {model_name}")
    cake_model = copy.deepcopy(fla_model)
    report = swap_short_convolutions(cake_model)
    swapped = report.swapped
    log("# " + str(report).replace("\n", "\n# "))
    log(f"# swap_short_convolutions: {swapped} ShortConvolution modules now run cakeconv "
        f"({sum(p.numel() for p in fla_model.parameters()) / 1e6:.2f} M parameters per model)")
    models = {"fla": fla_model, "cakeconv": cake_model}
    for model in models.values():
        model.train()

    def lr_at(step):  # linear warmup over 20 steps, then constant
        return args.lr * min(1.0, (step + 1) / 20)

    opts = {k: torch.optim.AdamW(m.parameters(), lr=args.lr, weight_decay=0.0) for k, m in models.items()}
    succ_VK = torch.randint(0, args.vocab, (args.vocab, 4), generator=torch.Generator().manual_seed(1234))
    data_gen = torch.Generator().manual_seed(args.seed + 1)
    pool = [make_batch(args.tokens, args.vocab, succ_VK, data_gen, device) for _ in range(min(args.steps, 64))]

    losses = {k: [] for k in models}
    times_ms = {k: [] for k in models}
    log(f"{'step':>5} {'loss fla':>9} {'loss cake':>9} {'rel diff':>9} {'ms fla':>8} {'ms cake':>8} {'docs':>5}")
    start = time.time()
    for step in range(args.steps):
        ids, labels, cu = pool[step % len(pool)]
        order = ("fla", "cakeconv") if step % 2 == 0 else ("cakeconv", "fla")
        for key in order:
            model, opt = models[key], opts[key]
            for group in opt.param_groups:
                group["lr"] = lr_at(step)
            sync(device)
            t0 = time.perf_counter()
            loss = model(input_ids=ids, labels=labels, cu_seqlens=cu).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            sync(device)
            times_ms[key].append((time.perf_counter() - t0) * 1e3)
            losses[key].append(loss.item())
        if step % args.print_every == 0 or step == args.steps - 1:
            lf, lc = losses["fla"][-1], losses["cakeconv"][-1]
            log(f"{step:>5} {lf:>9.4f} {lc:>9.4f} {abs(lc - lf) / lf:>9.2e} {times_ms['fla'][-1]:>8.2f} "
                f"{times_ms['cakeconv'][-1]:>8.2f} {len(cu) - 1:>5}")

    timed = {k: v[args.warmup:] or v for k, v in times_ms.items()}
    median = {k: statistics.median(v) for k, v in timed.items()}
    mean = {k: statistics.fmean(v) for k, v in timed.items()}
    tail = max(1, min(10, args.steps))
    final = {k: statistics.fmean(v[-tail:]) for k, v in losses.items()}
    max_rel = max(abs(a - b) / a for a, b in zip(losses["fla"], losses["cakeconv"]))
    log(f"# wall time {time.time() - start:.1f} s for {args.steps} steps of each model")
    log(f"# final loss (mean of the last {tail} steps): fla {final['fla']:.4f}, cakeconv {final['cakeconv']:.4f} "
        f"(first step {losses['fla'][0]:.4f}; best possible ln 4 = {math.log(4):.4f}); "
        f"largest relative loss difference over the run {max_rel:.2e}")
    for k in models:
        log(f"# step time {k:>8}: median {median[k]:.2f} ms, mean {mean[k]:.2f} ms "
            f"({args.tokens / median[k] * 1e3 / 1e6:.2f} M tokens/s)")
    log(f"# cakeconv / fla median step time: {median['cakeconv'] / median['fla']:.3f} "
        f"({(median['cakeconv'] / median['fla'] - 1) * 100:+.1f}%)")
    with open(os.path.join(args.out, "train_fla_model.json"), "w") as f:
        json.dump({"args": vars(args), "model": model_name, "device": device_name, "swapped": swapped,
                   "losses": losses, "step_ms": times_ms, "median_ms": median, "mean_ms": mean}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
