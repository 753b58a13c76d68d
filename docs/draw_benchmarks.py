"""Draw docs/benchmarks.png from the measured rows in benchmarks/results/ (the benchmark's own plot).

Run:  python docs/draw_benchmarks.py [RESULTS]     (needs matplotlib)

RESULTS is a JSON-lines file written by benchmarks/bench_cake_causal_conv1d_det.py or a progress
log of it (the stderr lines ``[i/n] S=.. C=.. bias=..: ... ours:fwd=0.172ms ...``, used when a run
was cut before it wrote its JSON lines). Default: the newest ``bench_cake_causal_conv1d_det*.jsonl``
under benchmarks/results/ with timing rows, else the newest ``*bench*progress*.log``.

From a log, each time is turned into the benchmark's own measure (benchmarks/README.md):
``fraction = floor bytes / time / copy bandwidth`` with floor bytes 4*S*C (fwd), 6*S*C (bwd) and
10*S*C (fwd+bwd) for bf16 x, and the copy bandwidth printed at the start of the run. The plot is
drawn by ``bench_cake_causal_conv1d_det.plot`` so it looks like the benchmark's own PNG.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import shutil
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
OUT_PATH = REPO / "docs" / "benchmarks.png"
FLOOR_BYTES_PER_SC = {"fwd": 4, "bwd": 6, "fwdbwd": 10}
PASS_NAMES = {"fwd": "fwd", "bwd": "bwd", "fwd+bwd": "fwdbwd"}

sys.path.insert(0, str(REPO / "benchmarks"))
import bench_cake_causal_conv1d_det as bench  # noqa: E402


def load_jsonl(path: pathlib.Path):
    env, rows = {}, []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        if record.get("kind") == "env":
            env = record
        elif record.get("kind") == "timing":
            rows.append(record)
    return env, rows


def load_progress_log(path: pathlib.Path):
    """Timing rows from a progress log (the per-shape stderr lines) and its environment line."""
    text = path.read_text()
    copy = re.search(r"copy bandwidth \(start\): (\d+(?:\.\d+)?) GB/s", text)
    if copy is None:
        raise SystemExit(f"{path}: no 'copy bandwidth (start)' line")
    copy_gbs = float(copy.group(1))
    gpu = re.search(r"^(NVIDIA [^\n]*?)\s{2}torch", text, re.M)
    date = re.search(r"(\d{4}-\d{2}-\d{2})", path.name)
    env = {"gpu": gpu.group(1) if gpu else "GPU", "copy_gbs": copy_gbs, "date": date.group(1) if date else "?"}
    rows = []
    shape_line = re.compile(r"^\[\d+/\d+\] S=(\d+) C=(\d+) bias=(yes|no): \d+ sets.*$", re.M)
    timing = re.compile(r"(\w+):(fwd\+bwd|fwd|bwd)=([\d.]+)ms")
    for match in shape_line.finditer(text):
        S, C, bias = int(match.group(1)), int(match.group(2)), match.group(3) == "yes"
        for provider, pass_label, ms in timing.findall(match.group(0)):
            pass_name = PASS_NAMES[pass_label]
            gbs = FLOOR_BYTES_PER_SC[pass_name] * S * C / (float(ms) * 1e-3) / 1e9
            rows.append({"S": S, "C": C, "bias": bias, "provider": provider, "pass": pass_name,
                         "ms": float(ms), "gbs": gbs, "fraction": gbs / copy_gbs})
    if not rows:
        raise SystemExit(f"{path}: no timing lines")
    return env, rows


def default_source() -> pathlib.Path:
    jsonls = sorted(RESULTS.glob("**/bench_cake_causal_conv1d_det*.jsonl"), key=lambda p: p.stat().st_mtime)
    for path in reversed(jsonls):
        if load_jsonl(path)[1]:
            return path
    logs = sorted(RESULTS.glob("*bench*progress*.log"), key=lambda p: p.stat().st_mtime)
    if not logs:
        raise SystemExit(f"no benchmark results under {RESULTS}")
    return logs[-1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="?", type=pathlib.Path, default=None)
    args = parser.parse_args()
    source = args.results.resolve() if args.results else default_source()
    env, rows = load_jsonl(source) if source.suffix == ".jsonl" else load_progress_log(source)
    counts = {}
    for row in rows:
        counts[row["S"]] = counts.get(row["S"], 0) + 1
    sweep_s = bench.SWEEP_S if bench.SWEEP_S in counts else max(counts, key=counts.get)
    notes = []
    with tempfile.TemporaryDirectory() as tmp_dir:
        png = bench.plot(rows, sweep_s, env, tmp_dir, notes)
        if png is None:
            raise SystemExit("; ".join(notes))
        shutil.copyfile(png, OUT_PATH)
    print(f"wrote {OUT_PATH} from {source.relative_to(REPO)} ({len(rows)} timing rows, S = {sweep_s})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
