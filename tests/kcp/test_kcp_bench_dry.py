"""The KCP benchmark's --dry-run on 2 CPU ranks over gloo (tier 3): what CI runs of the KCP benchmark.

``torchrun ... -m benchmarks.kcp`` runs on the GPU machine; here ``benchmarks.kcp.run(argv)`` is called
inside the ranks of the test harness (tests/kcp/_dist.py), which have already initialised gloo, so the
benchmark must use that process group instead of initialising its own.
Checked on every rank: each (layout, form) row reports bitwise equality of the KCP y and dx with the
single-rank op; rank 0 wrote the JSON-lines file with 3 layouts x 2 forms timing rows, each with its
GPU-time, eager-loop and host-cost figures (KCP and local op). A second run
breaks the KCP op's y on rank 1 only and checks that every rank reports that failure (so a
``bitwise`` column of True is a verdict, not a constant); it names its files (``--name``).
"""

from __future__ import annotations

import json
import os

import pytest

from ._dist import run_on_ranks

LAYOUTS = ("contiguous", "zigzag", "zigzag_per_document")
FORMS = ("single", "multi")


def _read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _dry_run_on_rank(rank, world, out_dir):
    """Run the dry run; every rank checks its rows, rank 0 also the file. Returns picklable data."""
    from benchmarks import kcp

    rows = kcp.run(["--dry-run", "--out", out_dir])
    summary = sorted((r["layout"], r["form"], r["P"], r["bitwise"]) for r in rows)
    assert summary == sorted((layout, form, world, True) for layout in LAYOUTS for form in FORMS), \
        f"rank {rank}: rows {summary}"
    written = None
    if rank == 0:
        lines = _read_jsonl(os.path.join(out_dir, f"kcp_p{world}.jsonl"))
        assert lines[0]["kind"] == "env" and lines[0]["gpu"] == "cpu", lines[0]
        env = lines[0]
        assert env["date"] and env["torch"] and "commit" in env and "triton" in env, env
        written = sorted((r["layout"], r["form"], r["P"], r["bitwise"]) for r in lines if r["kind"] == "timing")
        for r in lines[1:]:
            # every row carries the run: date, commit, GPU, versions
            assert all(r[k] == env[k] for k in ("date", "commit", "gpu", "torch", "triton", "cakeconv")), r
            # the timings are real numbers and the overhead is derived from them
            assert r["fwdbwd_ms"] > 0 and r["local_fwdbwd_ms"] > 0, r
            expected = 100.0 * (r["fwdbwd_ms"] - r["local_fwdbwd_ms"]) / r["local_fwdbwd_ms"]
            assert abs(r["overhead_pct"] - expected) < 1e-9, r
            # the eager loop (a chain per step) and the host cost at the tiny shape, KCP vs the local op
            assert r["eager_ms"] > 0 and r["local_eager_ms"] > 0, r
            expected = 100.0 * (r["eager_ms"] - r["local_eager_ms"]) / r["local_eager_ms"]
            assert abs(r["eager_overhead_pct"] - expected) < 1e-9, r
            for item in ("chain", "step"):
                kcp_us, local_us = r[f"host_{item}_us"], r[f"local_host_{item}_us"]
                assert kcp_us > 0 and local_us > 0 and abs(r[f"host_{item}_ratio"] - kcp_us / local_us) < 1e-9, r
            assert r["host_S_local"] * world == r["host_T"], r
            assert r["T"] == sum(r["doc_lengths"]) and r["S_local"] * world == r["T"], r
            for n in r["doc_lengths"] if r["layout"] == "zigzag_per_document" else [r["T"]]:
                assert n % (2 * world) == 0, r
        assert os.path.exists(os.path.join(out_dir, f"kcp_p{world}.csv"))
    return summary, written


def _broken_on_rank(rank, world, out_dir):
    """The same dry run with the single-tensor KCP op's y shifted on rank 1: every rank must see it."""
    import cakeconv
    from benchmarks import kcp

    good = cakeconv.cake_causal_conv1d_det_kcp

    def shifted(*args, **kwargs):
        y = good(*args, **kwargs)
        return y + 1.0 if rank == 1 else y

    cakeconv.cake_causal_conv1d_det_kcp = shifted
    try:
        rows = kcp.run(["--dry-run", "--layouts", "zigzag", "--eager-steps", "0", "--host-steps", "0",
                                  "--out", out_dir, "--name", "kcp_named"])
    finally:
        cakeconv.cake_causal_conv1d_det_kcp = good
    named = sorted(os.listdir(out_dir)) if rank == 0 else None
    return sorted((r["form"], r["bitwise"], tuple(r["bitwise_failed_ranks"])) for r in rows), named


@pytest.mark.dist
def test_kcp_bench_dry_run_bitwise_and_files(tmp_path):
    out_dir = str(tmp_path / "kcpbench")
    results = run_on_ranks(_dry_run_on_rank, 2, out_dir, timeout_s=60)
    expected = sorted((layout, form, 2, True) for layout in LAYOUTS for form in FORMS)
    for rank, (summary, written) in enumerate(results):
        assert summary == expected, f"rank {rank}"
    assert results[0][1] == expected
    assert results[1][1] is None  # only rank 0 writes


@pytest.mark.dist
def test_kcp_bench_dry_run_reports_a_mismatch_on_every_rank(tmp_path):
    results = run_on_ranks(_broken_on_rank, 2, str(tmp_path / "broken"), timeout_s=60)
    for rank, (rows, _) in enumerate(results):
        assert rows == [("multi", True, ()), ("single", False, (1,))], f"rank {rank}: {rows}"
    # --name: rank 0 wrote the files under that stem
    assert {"kcp_named.jsonl", "kcp_named.csv", "kcp_named_table.txt"} <= set(results[0][1]), results[0][1]
