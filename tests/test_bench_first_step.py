"""benchmarks/first_step.py on the CPU: its dry run, and the rows of processes cut short.

The dry run starts the ``cakeconv`` row's two processes (cold cache, then warm cache; the reference
backend, S = 2,048) and skips the other rows with the reason. Every planned row must come back, in
order, with its measures or a reason; the JSON carries the run's date, commit, GPU and versions (also
in every row); the table is printed last and written beside the JSON; the row's temporary Triton
cache is removed.
"""

import json
import os
import subprocess
import sys

import pytest

import benchmarks.first_step as bench_module

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLANNED = ["cakeconv", "cakeconv_no_quick", "cakeconv_one_thread", "cakeconv_after_warmup", "fla", "dao", "dao_det"]
MEASURES = ["import_s", "inputs_s", "first_call_s", "first_step_s", "new_c_s", "new_stride_s", "steady_ms",
            "steady_max_ms", "warm_cache_import_s", "warm_cache_first_call_s", "warm_cache_first_step_s"]
COUNTS = ["first_step_compiled", "first_step_cache_hits", "new_c_compiled", "new_c_cache_hits",
          "new_stride_compiled", "new_stride_cache_hits", "steady_compiled", "steady_cache_hits",
          "warm_cache_compiled", "warm_cache_cache_hits"]
RUN_FIELDS = ["gpu", "torch", "triton", "date", "commit", "version"]


@pytest.fixture(scope="module")
def bench():
    return bench_module


def run(tmp_path, *options, timeout=120):
    """The benchmark with ``options`` into tmp_path/out, its temporary folders under tmp_path/tmp."""
    (tmp_path / "tmp").mkdir()
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), BENCH_COMMIT="test",
               TMPDIR=str(tmp_path / "tmp"))
    proc = subprocess.run([sys.executable, "-m", "benchmarks.first_step", *options, "--out", str(tmp_path / "out")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc, json.loads((tmp_path / "out" / "first_step.json").read_text())


def test_dry_run_rows(tmp_path, bench):
    proc, result = run(tmp_path, "--dry-run")
    env, rows = result["env"], result["rows"]
    assert env["commit"] == "test" and env["date"] and env["torch"] and env["gpu"] == "cpu (dry-run)"
    assert result["config"]["dry_run"] and result["config"]["tokens"] == 2048
    assert result["config"]["file_warmup_s"] > 0  # the untimed process of imports ran before the rows
    assert [r["library"] for r in rows] == PLANNED
    for r in rows:
        assert set(bench.ROW_FIELDS) == set(r), sorted(set(bench.ROW_FIELDS) ^ set(r))
        assert r["error"] is None, r
        assert all(r[k] == env[k] for k in ("gpu", "date", "commit")) and r["torch"] == env["torch"]
        assert r["first_step_s"] is not None or r["skip"], f"neither numbers nor a skip reason: {r}"

    cake = rows[0]
    assert cake["skip"] is None and cake["version"] and cake["steady_calls"] == 5
    assert all(isinstance(cake[k], float) and cake[k] > 0 for k in MEASURES), {k: cake[k] for k in MEASURES}
    assert cake["first_step_s"] >= cake["import_s"] + cake["first_call_s"]  # from the process start
    assert cake["startup_s"] >= 0 and cake["cold_process_s"] >= cake["first_step_s"]
    assert cake["steady_max_ms"] >= cake["steady_ms"]
    assert cake["first_step_s"] <= cake["kernels_ready_s"]  # waited for the full kernels before the steady calls
    assert all(cake[k] == 0 for k in COUNTS), {k: cake[k] for k in COUNTS}  # the reference backend compiles nothing
    # a third process on the warm cache profiled its first fwd+bwd: the call itself heads the list
    top = cake["warm_profile"]
    assert cake["profile_process_s"] > 0 and 0 < len(top) <= 25 and "fwd_bwd" in top[0][3], top[:3]
    assert all(a[0] >= b[0] for a, b in zip(top, top[1:])), "not sorted by cumulative time"
    for r in rows[1:]:
        assert r["skip"].startswith("dry run: ")
        assert all(r[k] is None for k in MEASURES + COUNTS)

    table = proc.stdout.strip().splitlines()
    assert table[0].startswith("First fwd+bwd from a cold start") and table[1].startswith("library")
    assert table[-1].startswith("# wrote")
    for name, line in zip(PLANNED, table[2:-1]):
        assert line.startswith(name)
    assert "skipped: dry run" in table[3]
    assert (tmp_path / "out" / "first_step_table.txt").read_text().splitlines() == table[:-1]
    assert not list((tmp_path / "tmp").iterdir()), "a row's Triton cache folder was left behind"
    assert "cold-cache process" in proc.stderr and "warm-cache process" in proc.stderr


def test_a_process_cut_short_is_a_row_with_the_reason(tmp_path):
    _, result = run(tmp_path, "--dry-run", "--libraries", "cakeconv", "--process-timeout", "0.5")
    (row,) = result["rows"]
    assert row["error"] == "cold process killed after 0.5 s (--process-timeout, --time-limit)"  # torch takes longer
    assert row["first_step_s"] is None and row["warm_cache_first_step_s"] is None


def test_a_spent_time_limit_starts_nothing(tmp_path):
    _, result = run(tmp_path, "--dry-run", "--libraries", "cakeconv,fla", "--time-limit", "5")
    assert [r["error"] for r in result["rows"]] == ["cold process not started: --time-limit spent", None]
    assert result["rows"][1]["skip"].startswith("dry run: ")


def test_command_line_errors(bench):
    for bad in (["--libraries", "cakeconv,foo"], ["--channels", "500"], ["--new-channels", "512"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)
    args = bench.parse_args(["--libraries", "dao,cakeconv"])
    assert args.libraries == ["dao", "cakeconv"] and args.tokens == 32768 and args.steady_calls == 20


def test_help_names_every_option_and_its_default(bench, capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--help"])
    text = capsys.readouterr().out
    assert all(f"--{name} " in text for name, _, _ in bench.OPTIONS) and "--dry-run" in text
    assert text.count("(default:") == len(bench.OPTIONS)
