#!/usr/bin/env python3
"""Redraw the plots and reprint the table of bench_cake_causal_conv1d_det.py from its JSON-lines output.

    python benchmarks/plot_results.py benchmarks/results/h200_mixes.jsonl [--out DIR] [--name STEM]

Also reads the ``.partial.jsonl`` file a run writes as it goes (a run cut short by a time limit): its
rows are rated against the copy bandwidth measured at the start (the only reading it has), and the
CSV and JSON-lines files of a finished run are written beside the plot. The files written are named
after the input (``h200_mixes.jsonl`` -> ``h200_mixes.png``; ``--name`` another stem).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from measures import PASSES  # noqa: E402
from report_plots import plot, plot_host_cost, plot_widths  # noqa: E402
from report_rows import add_speedups, method_of, timing_row, write_outputs  # noqa: E402
from report_table import format_table  # noqa: E402
from shapes import SWEEP_S  # noqa: E402


def read_jsonl(path):
    """(env, timing rows, check rows, partial rows) of a results file."""
    env, rows, checks, partial = {}, [], [], []
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            kind = r.get("kind")
            if kind == "env":
                env = r
            elif kind == "timing":
                rows.append(r)
            elif kind == "check":
                checks.append(r)
            elif kind == "partial":
                partial.append(r)
    return env, rows, checks, partial


def file_stem(path: str) -> str:
    """``DIR/NAME.jsonl`` or ``DIR/NAME.partial.jsonl`` -> NAME."""
    name = os.path.basename(path)
    for suffix in (".partial.jsonl", ".jsonl"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return os.path.splitext(name)[0]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("jsonl")
    p.add_argument("--out", default=None, help="folder for the PNG (default: the JSON-lines file's folder)")
    p.add_argument("--name", default=None, help="stem of the files written (default: the input's, e.g. h200_mixes)")
    p.add_argument("--sweep-s", type=int, default=None, help="S of the C sweep to plot (default 250340, or the most common S)")
    p.add_argument("--ceiling", choices=("stored", "max"), default="max",
                   help="copy ceiling: the one stored in the file, or the higher of its start/end readings")
    args = p.parse_args(argv)
    env, rows, checks, partial = read_jsonl(args.jsonl)
    if partial and not rows:
        rows = partial_rows(partial, env)
    if not rows:
        raise SystemExit(f"no timing rows in {args.jsonl}")
    if args.ceiling == "max" and "copy_gbs_end" in env:
        # Fractions against the higher copy reading (files written before the benchmark used it
        # stored the median of both readings).
        env["copy_gbs"] = max(env["copy_gbs_start"], env["copy_gbs_end"])
        for r in rows:
            r["copy_gbs"] = env["copy_gbs"]
            r["fraction"] = r["gbs"] / env["copy_gbs"]
    sweep_s = args.sweep_s
    if sweep_s is None:
        counts = {}
        for r in rows:
            counts[r["S"]] = counts.get(r["S"], 0) + 1
        sweep_s = SWEEP_S if SWEEP_S in counts else max(counts, key=counts.get)
    out = args.out or os.path.dirname(os.path.abspath(args.jsonl))
    stem = args.name or file_stem(args.jsonl)
    os.makedirs(out, exist_ok=True)
    notes = list(env.get("notes", []))
    if partial:
        notes.append(f"run cut short: {len(rows)} rows of the partial file, rated against the copy bandwidth "
                     f"measured at the start ({env['copy_gbs']:.0f} GB/s; no end reading)")
        write_outputs(rows, checks, env, notes, out, env.get("elapsed_s", float("nan")), stem)
    pngs = [plot(rows, sweep_s, env, out, notes, stem), plot_host_cost(rows, env, out, notes, stem),
            plot_widths(rows, sweep_s, env, out, notes, stem)]
    passes = [p_ for p_ in PASSES if any(r["pass"] == p_ and method_of(r) == "gpu" for r in rows)]
    biases = [b for b in (False, True) if any(r["bias"] == b for r in rows)]
    print(format_table(rows, checks, env, notes, passes, biases, sweep_s, [p for p in pngs if p],
                       env.get("elapsed_s", float("nan"))))
    return 0


def partial_rows(partial, env):
    """Timing rows (as the benchmark builds them) from the rows of a partial file."""
    env["copy_gbs"] = env["copy_gbs_start"]
    env["copy_gbs_end"] = float("nan")
    rows = [timing_row(env, env["copy_gbs"], r, r["median_ms"]) for r in partial]
    return add_speedups(rows)


if __name__ == "__main__":
    sys.exit(main())
