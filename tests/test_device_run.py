"""benchmarks/device_run.sh on the CPU: a named benchmark step runs end to end with ``BENCH_ARGS=--dry-run``.

The GPU machine runs this script with nothing to fix in between, so the step's command line must be one
the op benchmark takes: ``summary`` (the README's table: GPU time, eager loop, host cost; cakeconv, FLA and
Dao in both modes, the peers skipped with a note where they do not run) writes its packed folder with the
results files and prints its table last. The warm-up before it finds no GPU and says so; the step goes on.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import tarfile

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_summary_step_runs_and_packs_its_results(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), BENCH_ARGS="--dry-run", BENCH_COMMIT="test", WARM_JOBS="1")
    proc = subprocess.run(["bash", "benchmarks/device_run.sh", "summary"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "summary: rc 0" in proc.stdout, proc.stdout[-3000:]
    with tarfile.open(out / "summary.tgz") as tar:
        names = set(tar.getnames())
    for suffix in (".jsonl", ".csv", "_table.txt"):
        assert f"summary/cpu_summary{suffix}" in names, sorted(names)
    assert "summary/warmup.log" in names and "summary/progress.log" in names
    table = proc.stdout.split("summary: rc 0", 1)[1]
    assert "fwd+bwd" in table and "host" in table.lower(), table[:2000]


def test_hostcost_step_times_two_trees_in_alternation(tmp_path):
    """``hostcost`` with HOSTCOST_BASE: each round times the other tree first, then this one, and each
    run says which cakeconv it imported (the A/B of a host-side change); on the CPU, the interpreter."""
    base = tmp_path / "base"
    base.mkdir()
    (base / "cakeconv").symlink_to(ROOT / "cakeconv")  # another folder holding a cakeconv/
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), HOSTCOST_BASE=str(base), HOSTCOST_DEVICE="cpu", HOSTCOST_ROUNDS="1",
               HOSTCOST_ARGS="--steps 2 --rounds 1 --rungs full")
    proc = subprocess.run(["bash", "benchmarks/device_run.sh", "hostcost"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0 and "hostcost: rc 0" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    with tarfile.open(out / "hostcost.tgz") as tar:
        table = tar.extractfile("hostcost/cpu_host_cost_table.txt").read().decode()
    headers = [line for line in table.splitlines() if line.startswith("# host")]
    assert len(headers) == 2, table
    assert headers[0].endswith(f"cakeconv from {base}") and headers[1].endswith(f"cakeconv from {ROOT}"), headers
    assert table.count("\nfull ") + table.startswith("full ") == 2 and table.count("trivial ") == 2, table
