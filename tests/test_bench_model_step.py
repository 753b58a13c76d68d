"""benchmarks/model_step.py on the CPU: its dry run, and the pieces the GPU run relies on.

The dry run starts one process per part (kda, mamba default, mamba deterministic); the cakeconv
variants of the conv workloads run on the reference backend, every other variant is skipped with its
reason (FLA's and mamba_ssm's kernels need a GPU, peers that are not installed). The rows must
name every planned variant, each with a time or a reason.
"""

import importlib.util
import json
import os
import subprocess
import sys
import tarfile

import pytest
import torch

import benchmarks.model_step as bench_module

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAMBA_TARBALL = os.path.join(os.path.dirname(REPO), "shared", "peers", "mamba_ssm-2.3.2.post1.tar.gz")
ROW_FIELDS = {"part", "mode", "workload", "mix", "variant", "runs", "tokens", "n_docs", "doc_min", "doc_max",
              "median_ms", "p20_ms", "p80_ms", "tokens_per_s", "steps", "skip", "error", "gpu", "date"}


@pytest.fixture(scope="module")
def bench():
    return bench_module


def run_dry(out, *extra):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), BENCH_COMMIT="test")
    proc = subprocess.run([sys.executable, "-m", "benchmarks.model_step", "--dry-run", "--out", str(out), *extra],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc, json.loads((out / "model_step.json").read_text())


def test_dry_run_rows(tmp_path, bench):
    proc, result = run_dry(tmp_path)
    rows = result["rows"]
    assert result["env"]["commit"] == "test" and result["env"]["date"] and result["env"]["torch"]
    assert "versions" in result["env"] and [p["rc"] for p in result["parts"]] == [0, 0, 0]
    planned = {(part, w, v) for part, ws in bench.PART_WORKLOADS.items() for w in ws for v in bench.VARIANTS[w]}
    assert {(r["part"], r["workload"], r["variant"]) for r in rows} == planned
    assert {r["mode"] for r in rows if r["part"] == "mamba"} == {"default", "deterministic"}
    for r in rows:
        assert ROW_FIELDS <= set(r), sorted(ROW_FIELDS - set(r))
        assert r["error"] is None, r
        assert (r["median_ms"] or 0) > 0 or r["skip"], f"neither a time nor a skip reason: {r}"
        assert r["gpu"] == "cpu (dry-run)" and sum(r["n_docs"]) > 0
    timed = [r for r in rows if r["median_ms"]]
    expected = {("mamba2_conv", "cakeconv")}
    if importlib.util.find_spec("fla") is not None:  # fla-core's ShortConvolution, swapped
        expected.add(("kda_conv", "cakeconv"))
    assert {(r["workload"], r["variant"]) for r in timed} == expected
    for r in timed:  # cakeconv's gradients are bitwise repeatable, on the reference backend too
        assert r["repeats"] == 2 and r["distinct_conv_grads"] == 1 and r["distinct_grads"] == 1, r
        assert r["steps"] == 2 and r["tokens_per_s"] > 0
    assert all(r["swapped"] == 3 for r in timed if r["workload"] == "kda_conv")
    table = proc.stdout.strip().splitlines()
    assert table[1].startswith("workload") and "median ms" in table[1] and table[-1].startswith("# wrote")
    assert (tmp_path / "model_step_table.txt").read_text().startswith(table[0])
    assert not list(tmp_path.glob("*.part.json"))


def test_dry_run_with_mamba_source(tmp_path):
    """With mamba_ssm's source (the peers' tarball), the Mamba2 layer is built through the namespace
    import (its __init__ never runs) and cakeconv's mamba_ssm swap is read; the rows are then
    skipped on the CPU with the reason."""
    if not os.path.exists(MAMBA_TARBALL):
        pytest.skip("no mamba_ssm source tarball beside the repository")
    pytest.importorskip("einops")
    pytest.importorskip("huggingface_hub")
    with tarfile.open(MAMBA_TARBALL) as tar:
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(tmp_path / "src", **safe)
    src = tmp_path / "src" / "mamba_ssm-2.3.2.post1"
    _, result = run_dry(tmp_path, "--parts", "mamba", "--mamba-modes", "default", "--workloads", "mamba2_layer",
                        "--mamba-src", str(src))
    rows = {r["variant"]: r for r in result["rows"]}
    assert set(rows) == {"dao", "cakeconv", "noconv"}
    assert result["parts"][0]["env"]["versions"]["mamba_ssm"] == "2.3.2.post1"
    assert "CUDA GPU" in rows["noconv"]["skip"]
    if "mamba_ssm.swap()" not in rows["cakeconv"]["skip"]:  # cakeconv.integrations.mamba_ssm is there
        assert "CUDA GPU" in rows["cakeconv"]["skip"] and rows["cakeconv"]["swapped"] > 0


def test_document_mixes(bench):
    for mix in ("docs:10", "docs:1", "seed", "uniform:1-64"):
        lengths = bench.mix_lengths(mix, 4096, seed=3)
        assert sum(lengths) == 4096 and min(lengths) >= 1
    assert len(bench.mix_lengths("docs:10", 32768, seed=0)) == 10
    assert bench.mix_lengths("docs:10", 32768, seed=0) != bench.mix_lengths("docs:10", 32768, seed=1)
    batch = bench.make_batches(bench.parse_args(["--dry-run"]), "docs:5")[0]
    assert batch["cu"].dtype == torch.int32 and batch["cu"][-1] == 128 and batch["n_docs"] == 5
    assert torch.equal(torch.bincount(batch["seq_idx"][0]), batch["cu"].diff())
    with pytest.raises(SystemExit):
        bench.parse_args(["--kda-mixes", "docs:x"])


def test_noconv_pair_and_call_counter(bench):
    """Mamba2's no-conv stand-in: the forward returns x itself; the backward writes dout into the given
    dx buffer and returns zero weight and bias gradients. The counter binds a pair for one step only."""
    x = torch.randn(1, 8, 16).transpose(1, 2)
    w, b = torch.randn(8, 4), torch.randn(8)
    assert bench.noconv_fwd(x, w, b, None, None, None, True) is x
    dout, dx = torch.randn(1, 8, 16), torch.empty(1, 16, 8).transpose(1, 2)
    got = bench.noconv_bwd(x, w, b, dout, None, None, None, dx, False, True)
    assert got[0] is dx and torch.equal(dx, dout) and not got[1].any() and not got[2].any() and got[3] is None

    class Module:
        causal_conv1d_fwd_function = causal_conv1d_bwd_function = None

    counter = bench.CallCounter((bench.noconv_fwd, bench.noconv_bwd))
    with counter.bound(Module):
        Module.causal_conv1d_fwd_function(x, w, b, None, None, None, True)
        Module.causal_conv1d_bwd_function(x, w, b, dout, None, None, None, dx, False, True)
    assert Module.causal_conv1d_fwd_function is None
    assert counter.info() == {"conv_calls_per_step": {"fwd": 1.0, "bwd": 1.0}}


def test_help_names_every_option_and_its_default(bench, capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--help"])
    text = capsys.readouterr().out
    assert all(f"--{name} " in text for name, _, _ in bench.OPTIONS) and "--mamba-src" in text and "--dry-run" in text
    assert text.count("(default:") == len(bench.OPTIONS) + 1  # and --mamba-src's
