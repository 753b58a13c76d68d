"""The op benchmark's --dry-run (CPU, reference backend) and its --replot on the files it writes.

A run writes its rows twice: as it goes (``.partial.jsonl``: an env line, then one row per
measurement, so a run cut short by a time limit keeps them) and at the end (JSON lines, CSV, table).
--replot must rebuild, from the partial file alone, the same rows (same medians, same floor
bytes) as the finished run, rated against the start copy reading. The run covers every timing
method (GPU time, the eager loop and the host cost beside the trivial Function and silu) and two
document mixes, on small shapes so that it stays fast. A second run, named (``--name``), writes its
files under that stem, with the eager loop only where ``--eager-c`` and ``--eager-mix`` put it, and
every row carries the run's date, commit, GPU and versions. A third run takes several widths and both
activations: every (W, activation) is checked against the reference at that W and activation and timed,
and every row and check row records its width and activation.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = ["-m", "benchmarks.op"]  # run from the repository root
STEM = "op"


def _run(args):
    env = dict(os.environ, PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               BENCH_COMMIT="commit-of-the-test")  # the commit when the tree has no .git
    out = subprocess.run([sys.executable, *BENCH, *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return out.stdout


def _csv_rows(path):
    with open(path) as f:
        return {(r["method"], r["mix"], r["S"], r["C"], r["pass"], r["provider"], r["bias"]): r
                for r in csv.DictReader(f)}


def test_dry_run_partial_file_rebuilds_the_finished_rows(tmp_path):
    run_dir, re_dir = tmp_path / "run", tmp_path / "replot"
    table = _run(["--dry-run", "--no-plot", "--rows", "1531x16,2053x32", "--doc-mix", "seed,uniform:1-8",
                  "--bias", "no", "--eager", "--host-cost", "--reps", "2", "--out", str(run_dir)])
    assert "fwd+bwd" in table and "== eager loop" in table and "== host cost" in table and "== document mixes" in table
    with open(run_dir / f"{STEM}.partial.jsonl") as f:
        lines = [json.loads(line) for line in f]
    assert lines[0]["kind"] == "env" and lines[0]["copy_gbs_start"] > 0
    partial = [r for r in lines[1:] if r["kind"] == "partial"]
    assert len(partial) == len(lines) - 1 and partial

    final = _csv_rows(run_dir / f"{STEM}.csv")
    assert len(final) == len(partial)
    methods = {(k[0], k[1]) for k in final}
    for mix in ("seed", "uniform:1-8"):
        assert {("gpu", mix), ("eager", mix), ("eager_step", mix)} <= methods, methods
    host = {(k[0], k[5]) for k in final if k[0].startswith("host_")}
    assert {("host_chain", p) for p in ("ours", "trivial", "silu")} <= host, host
    assert {("host_step", "ours"), ("host_nograd", "ours"), ("host_ws", "ours")} <= host, host
    for key, row in final.items():
        if key[0] == "host_chain" and key[5] == "ours":
            assert float(row["ratio_to_trivial"]) > 0
        if key[0] == "eager":
            assert float(row["eager_vs_gpu"]) > 0
    re_table = _run(["--replot", str(run_dir / f"{STEM}.partial.jsonl"), "--out", str(re_dir)])
    assert "run cut short" in re_table
    rebuilt = _csv_rows(re_dir / f"{STEM}.csv")
    assert rebuilt.keys() == final.keys()
    start = lines[0]["copy_gbs_start"]
    for key, row in rebuilt.items():
        assert float(row["ms"]) == float(final[key]["ms"])
        assert row["floor_bytes"] == final[key]["floor_bytes"]
        assert abs(float(row["fraction"]) - float(row["gbs"]) / start) < 1e-12


def test_named_run_writes_its_stem_and_records_the_run(tmp_path):
    out = tmp_path / "named"
    table = _run(["--dry-run", "--rows", "1531x16,1531x32", "--doc-mix", "seed,uniform:1-8", "--bias", "no",
                  "--passes", "fwd,fwdbwd", "--eager", "--eager-c", "16", "--eager-mix", "seed", "--reps", "2",
                  "--name", "cpu_summary", "--out", str(out)])
    names = {p.name for p in out.iterdir()}
    assert {"cpu_summary.jsonl", "cpu_summary.csv", "cpu_summary_table.txt", "cpu_summary.partial.jsonl"} <= names
    assert all(n.startswith("cpu_summary") for n in names), names
    assert (out / "cpu_summary_table.txt").read_text().strip() == table.strip()
    with open(out / "cpu_summary.jsonl") as f:
        lines = [json.loads(line) for line in f]
    env = lines[0]
    assert env["kind"] == "env" and env["gpu"] == "cpu (dry-run)" and env["commit"]
    assert env["torch"] and env["triton"] and env["date"] and env["argv"][-4:] == ["--name", "cpu_summary", "--out",
                                                                                  str(out)]
    timing = [r for r in lines if r["kind"] == "timing"]
    for r in timing + [r for r in lines if r["kind"] == "check"]:
        assert (r["date"], r["commit"], r["gpu"]) == (env["date"], env["commit"], env["gpu"]), r
    for r in timing:
        assert (r["torch"], r["triton"], r["cakeconv"]) == (env["torch"], env["triton"], env["cakeconv"]), r
        assert "fla" in r and "causal_conv1d" in r  # the peers' versions (None: not run)
    gpu = {(r["mix"], r["C"]) for r in timing if r["method"] == "gpu"}
    assert gpu == {(m, c) for m in ("seed", "uniform:1-8") for c in (16, 32)}, gpu
    eager = {(r["method"], r["mix"], r["C"]) for r in timing if r["method"].startswith("eager")}
    assert eager == {("eager", "seed", 16), ("eager_step", "seed", 16)}, eager
    with open(out / "cpu_summary.csv") as f:
        assert all(row["commit"] == env["commit"] for row in csv.DictReader(f))


def test_widths_and_activations_each_get_rows(tmp_path):
    out = tmp_path / "widths"
    table = _run(["--dry-run", "--no-plot", "--rows", "1531x16", "--bias", "no", "--passes", "fwdbwd",
                  "--width", "3,8", "--activation", "none,silu", "--reps", "1", "--name", "cpu_widths",
                  "--out", str(out)])
    for heading in ("W = 3, no activation", "W = 3, SiLU", "W = 8, no activation", "W = 8, SiLU"):
        assert f"== GPU time, seed (9 documents), {heading}, no bias ==" in table, heading
    assert "== widths and activations" in table and "all ok" in table
    with open(out / "cpu_widths.jsonl") as f:
        lines = [json.loads(line) for line in f]
    pairs = {(w, a) for w in (3, 8) for a in ("none", "silu")}
    assert lines[0]["widths"] == [3, 8] and lines[0]["activations"] == ["none", "silu"]
    timing = [r for r in lines if r["kind"] == "timing"]
    assert {(r["width"], r["activation"]) for r in timing} == pairs
    checks = [r for r in lines if r["kind"] == "check"]
    assert {(r["width"], r["activation"]) for r in checks} == pairs and all(r["ok"] for r in checks)
    with open(out / "cpu_widths.csv") as f:
        assert {(int(r["width"]), r["activation"]) for r in csv.DictReader(f)} == pairs
