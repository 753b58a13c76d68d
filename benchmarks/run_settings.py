"""The command line of the single-GPU benchmark and the settings of a run it resolves to.

``--dry-run`` runs on the CPU with the reference backend and small defaults (a chain of 4, 2 calls per
sample, 5 reps, the tiny grid): it exercises the pipeline; its times mean nothing. ``--width`` and
``--activation`` multiply the grid: every (W, activation) runs at every mix, shape and bias variant.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from doc_mixes import parse_mixes
from measures import (ALL_PROVIDERS, CALLS_PER_SAMPLE, DEFAULT_ACTIVATION, DEFAULT_PROVIDERS, DEFAULT_WIDTH,
                      EAGER_MODES, HOST_AHEAD_MAX_US, PASSES, parse_activations, parse_widths)
from report_rows import FILE_STEM
from shapes import QUICK_C, SWEEP_S, parse_shape, select_shapes
from timing import HOST_AHEAD_MIN_US

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv=None):
    """The options (benchmarks/README.md describes each)."""
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
    p.add_argument("--width", default=str(DEFAULT_WIDTH),
                   help="taps per channel W, comma list of 2..8 (e.g. 2,3,4,8); every W runs at every row and mix")
    p.add_argument("--activation", default=DEFAULT_ACTIVATION,
                   help="comma list of silu, none (none: no activation); every one runs at every W, row and mix")
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
                   help="GPU sleep before each timed call so the host enqueues the call ahead: a number of us (0: off), "
                   "or 'auto': per provider and pass, 3x the host time to enqueue "
                   "the call in the warm-up rounds (the first excluded when there are two or more), at least "
                   f"{HOST_AHEAD_MIN_US:.0f} us, at most {HOST_AHEAD_MAX_US:.0f} us")
    p.add_argument("--no-check", action="store_true", help="skip the correctness check against the reference")
    p.add_argument("--eager", action="store_true",
                   help="also the eager loop at every row's shape (no host-ahead sleep; see the module docstring)")
    p.add_argument("--eager-modes", default=",".join(EAGER_MODES),
                   help="eager-loop forms: chain (16 calls, one backward per step), step (one call + backward per step)")
    p.add_argument("--eager-c", default=None, help="comma list of C: the eager loop only at rows of these C")
    p.add_argument("--eager-mix", action="append", default=None,
                   help="document mix(es), comma list: the eager loop only at these mixes of the run (default: all)")
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
    p.add_argument("--name", default=FILE_STEM,
                   help="stem of the files written: NAME.jsonl, NAME.csv, NAME_table.txt, NAME.png, NAME_host_cost.png, "
                   "NAME.partial.jsonl (e.g. h200_summary)")
    return p.parse_args(argv)



@dataclass
class RunSettings:
    """What a run does, resolved from its options (``--dry-run`` changes the defaults)."""

    device: object
    backend: str
    shapes: list
    sweep_s: int
    mixes: list
    bias_variants: list
    widths: list  # W, taps per channel
    activations: list  # "silu", "none"
    passes: list
    names: list
    reps: int
    warmup: int
    ahead_auto: bool
    base_ahead_us: float
    sleeping: bool  # the host-ahead sleep runs (a CUDA device with torch.cuda._sleep and a window > 0)
    eager_modes: list
    eager_c: set | None
    eager_mixes: list | None
    chain: int
    eager_steps: int
    eager_warmup: int
    n_calls: int
    host_cost: bool
    host_shape: tuple
    host_steps: int
    host_warmup: int
    check: bool
    flush: bool
    seed: int
    mean_doc_len: int
    max_sets: int
    copy_bytes: int
    out: str
    stem: str
    plot: bool
    l2_bytes: int = 0  # the device's L2 (set once the environment is known)

    @property
    def width_acts(self) -> list:
        """Every (W, activation label) of the run, W outermost."""
        return [(w, a) for w in self.widths for a in self.activations]

    def eager_at(self, mix: str, C: int) -> bool:
        """Whether the eager loop runs at this mix and C."""
        return bool(self.eager_modes) and (self.eager_c is None or C in self.eager_c) and (
            self.eager_mixes is None or mix in self.eager_mixes)


def _choices(text: str, allowed, what: str) -> list:
    """The comma list ``text`` (empty items and 'none' dropped), each among ``allowed``."""
    out = [v for v in text.split(",") if v and v != "none"]
    for v in out:
        if v not in allowed:
            raise SystemExit(f"unknown {what} {v!r}; choose among {allowed}")
    return out


def _device(torch, dry_run: bool):
    if dry_run:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --dry-run to exercise the pipeline on the CPU")
    return torch.device("cuda", torch.cuda.current_device())


def _host_ahead(text) -> tuple[bool, float]:
    """(auto, base window in us) of --host-ahead-us."""
    text = str(text).strip().lower()
    if text == "auto":
        return True, HOST_AHEAD_MIN_US
    try:
        return False, float(text)
    except ValueError:
        raise SystemExit(f"--host-ahead-us must be 'auto' or a number of microseconds, got {text!r}")


def resolve_settings(args, torch) -> RunSettings:
    """The settings of a run (raises SystemExit on bad options or nothing to time)."""
    dry = args.dry_run
    device = _device(torch, dry)
    passes = _choices(args.passes, PASSES, "pass")
    eager_modes = _choices(args.eager_modes, EAGER_MODES, "eager mode") if args.eager else []
    mixes = parse_mixes(args.doc_mix)
    eager_mixes = parse_mixes(args.eager_mix) if args.eager_mix else None
    stray = [m for m in eager_mixes or [] if m not in mixes]
    if stray:
        raise SystemExit(f"--eager-mix {stray} not among the run's mixes {mixes}")
    if not passes and not eager_modes and not args.host_cost:
        raise SystemExit("nothing to time: --passes none without --eager or --host-cost")
    if not args.name or os.sep in args.name:
        raise SystemExit(f"--name must be a file stem (no folder), got {args.name!r}")
    shapes, sweep_s = select_shapes(args.rows, dry, args.quick)
    try:
        widths, activations = parse_widths(args.width), parse_activations(args.activation)
    except ValueError as exc:
        raise SystemExit(f"--width/--activation: {exc}")
    ahead_auto, base_ahead_us = _host_ahead(args.host_ahead_us)
    return RunSettings(
        device=device, backend=args.backend or ("reference" if dry else "auto"), shapes=shapes, sweep_s=sweep_s,
        mixes=mixes, bias_variants={"both": [False, True], "no": [False], "yes": [True]}[args.bias],
        widths=widths, activations=activations,
        passes=passes, names=_choices(args.providers, ALL_PROVIDERS, "provider"),
        reps=args.reps if args.reps is not None else (5 if dry else (10 if args.quick else 25)),
        warmup=1 if dry and args.warmup == 3 else args.warmup, ahead_auto=ahead_auto, base_ahead_us=base_ahead_us,
        sleeping=device.type == "cuda" and hasattr(torch.cuda, "_sleep") and base_ahead_us > 0,
        eager_modes=eager_modes, eager_c={int(c) for c in args.eager_c.split(",") if c} if args.eager_c else None,
        eager_mixes=eager_mixes, chain=args.chain if args.chain is not None else (4 if dry else 16),
        eager_steps=args.eager_steps if args.eager_steps is not None else (2 if dry else 10),
        eager_warmup=min(args.eager_warmup, 1) if dry else args.eager_warmup,
        n_calls=args.calls if args.calls is not None else (2 if dry else CALLS_PER_SAMPLE),
        host_cost=args.host_cost, host_shape=parse_shape(args.host_shape or ("256x16" if dry else "4096x256")),
        host_steps=args.host_steps if args.host_steps is not None else (2 if dry else 30),
        host_warmup=min(args.host_warmup, 1) if dry else args.host_warmup,
        check=not args.no_check, flush=not args.no_flush, seed=args.seed,
        mean_doc_len=200 if dry and args.mean_doc_len == 3000 else args.mean_doc_len,  # many documents, tiny shapes
        max_sets=args.max_sets, copy_bytes=64 * 2**20 if dry else args.copy_bytes, out=args.out, stem=args.name,
        plot=not args.no_plot)
