#!/usr/bin/env python3
"""Redraw the plots and reprint the table of bench_cake_causal_conv1d_det.py from its JSON-lines output.

    python benchmarks/plot_results.py benchmarks/results/bench_cake_causal_conv1d_det.jsonl [--out DIR]

Also reads the ``.partial.jsonl`` file a run writes as it goes (a run cut short by a time limit): its
rows are rated against the copy bandwidth measured at the start (the only reading it has), and the
CSV and JSON-lines files of a finished run are written beside the plot.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_cake_causal_conv1d_det as bench  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("jsonl")
    p.add_argument("--out", default=None, help="folder for the PNG (default: the JSON-lines file's folder)")
    p.add_argument("--sweep-s", type=int, default=None, help="S of the C sweep to plot (default 250340, or the most common S)")
    p.add_argument("--ceiling", choices=("stored", "max"), default="max",
                   help="copy ceiling: the one stored in the file, or the higher of its start/end readings")
    args = p.parse_args(argv)
    env, rows, checks, partial = {}, [], [], []
    with open(args.jsonl) as f:
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
        sweep_s = bench.SWEEP_S if bench.SWEEP_S in counts else max(counts, key=counts.get)
    out = args.out or os.path.dirname(os.path.abspath(args.jsonl))
    os.makedirs(out, exist_ok=True)
    notes = list(env.get("notes", []))
    if partial:
        notes.append(f"run cut short: {len(rows)} rows of the partial file, rated against the copy bandwidth "
                     f"measured at the start ({env['copy_gbs']:.0f} GB/s; no end reading)")
        bench.write_outputs(rows, checks, env, notes, out, env.get("elapsed_s", float("nan")))
    pngs = [bench.plot(rows, sweep_s, env, out, notes), bench.plot_host_cost(rows, env, out, notes)]
    passes = [p_ for p_ in bench.PASSES if any(r["pass"] == p_ and bench.method_of(r) == "gpu" for r in rows)]
    biases = [b for b in (False, True) if any(r["bias"] == b for r in rows)]
    print(bench.format_table(rows, checks, env, notes, passes, biases, sweep_s, [p for p in pngs if p],
                             env.get("elapsed_s", float("nan"))))
    return 0


def partial_rows(partial, env):
    """Timing rows (as the benchmark builds them) from the rows of a partial file."""
    env["copy_gbs"] = env["copy_gbs_start"]
    env["copy_gbs_end"] = float("nan")
    rows = [bench.timing_row(env, env["copy_gbs"], r, r["median_ms"]) for r in partial]
    return bench.add_speedups(rows)


if __name__ == "__main__":
    sys.exit(main())
