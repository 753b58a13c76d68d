"""The rows and files of a run: one timing row per measurement, written as JSON lines and CSV.

Files under ``--out``, named ``<stem>.*`` (``--name``; default ``bench_cake_causal_conv1d_det``):
``<stem>.jsonl`` (an ``env`` line, the timing rows, the check rows), ``<stem>.csv`` (the timing rows) and,
written as the run goes, ``<stem>.partial.jsonl`` (an ``env`` line with the start copy reading, then one
``partial`` line per measurement: a run cut short by a time limit keeps its rows there). Every row
carries its width W and activation ("silu" or "none"; rows of files written before these were recorded
read as 4 and "silu"), and the run's date, commit, GPU and the versions of torch, triton, cakeconv and the
peers.
"""

from __future__ import annotations

import csv
import json
import os
import statistics

from doc_mixes import DEFAULT_MIX
from measures import BASELINES, DEFAULT_ACTIVATION, DEFAULT_WIDTH, FLOOR_FACTOR, PEERS
from timing import percentile

FILE_STEM = "bench_cake_causal_conv1d_det"
ENV_FIELDS = ("date", "commit", "gpu", "torch", "triton", "cakeconv", "ours_backend", "fla", "causal_conv1d")


def mix_of(r) -> str:
    return r.get("mix") or DEFAULT_MIX


def method_of(r) -> str:
    return r.get("method") or "gpu"


def width_of(r) -> int:
    return r.get("width") or DEFAULT_WIDTH


def act_of(r) -> str:
    return r.get("activation") or DEFAULT_ACTIVATION


def timing_row(env, copy_gbs, r, ms, ts=None, warmup=None, l2_flush=None, host_ahead_us=None):
    """One timing row: a measurement r (mix, method, S, C, width, activation, pass, provider, bias, host_ms, n_docs,
    n_sets) with
    median ms (per call); ts (all samples) gives the percentiles and n when known (else r["n"])."""
    method = method_of(r)
    floor = FLOOR_FACTOR[r["pass"]] * r["S"] * r["C"] * 2
    gbs = floor / (ms * 1e-3) / 1e9
    return {
        "kind": "timing",
        **{k: env.get(k) for k in ENV_FIELDS},
        "method": method,
        "mix": mix_of(r),
        "S": r["S"],
        "C": r["C"],
        "width": width_of(r),
        "activation": act_of(r),
        "pass": r["pass"],
        "provider": r["provider"],
        "bias": r["bias"],
        "ms": ms,
        "us": ms * 1e3,
        "ms_p10": percentile(ts, 0.1) if ts else None,
        "ms_p90": percentile(ts, 0.9) if ts else None,
        "n": len(ts) if ts else r.get("n"),
        "warmup": warmup,
        "floor_bytes": floor,
        "gbs": gbs,
        "fraction": gbs / copy_gbs,
        "copy_gbs": copy_gbs,
        "host_ms": r.get("host_ms", 0.0),
        "n_docs": r.get("n_docs"),
        "doc_min": r.get("doc_min"),
        "doc_max": r.get("doc_max"),
        "n_sets": r.get("n_sets"),
        "chain": r.get("chain"),
        "l2_flush": l2_flush if method == "gpu" else False,
        "host_ahead_us": (host_ahead_us if host_ahead_us is not None else r.get("host_ahead_us")) if method == "gpu" else 0.0,
    }


def row_key(r, provider=None, method=None, pass_=None, width=None, act=None):
    """(mix, method, S, C, width, activation, pass, bias, provider) of row r, any of them replaced."""
    return (mix_of(r), method or method_of(r), r["S"], r["C"], width or width_of(r), act or act_of(r),
            pass_ or r["pass"], r["bias"], provider or r["provider"])


def add_speedups(rows):
    """On our rows: speedup_vs_<peer> = the peer's time over ours (same mix, method, S, C, W, activation, pass, bias).
    On eager rows: eager_vs_gpu = eager time per call / the same provider's GPU time of fwd+bwd.
    On host-cost rows: ratio_to_trivial = time per call / the trivial Function's for the same item."""
    by_key = {row_key(r): r["ms"] for r in rows}
    for row in rows:
        method = method_of(row)
        if row["provider"] not in PEERS + BASELINES:
            for peer in PEERS:
                pm = by_key.get(row_key(row, provider=peer))
                row[f"speedup_vs_{peer}"] = (pm / row["ms"]) if pm else None
        if method in ("eager", "eager_step"):
            g = by_key.get(row_key(row, method="gpu", pass_="fwdbwd"))
            row["eager_vs_gpu"] = (row["ms"] / g) if g else None
        if method.startswith("host_"):
            t = by_key.get(row_key(row, provider="trivial"))
            row["ratio_to_trivial"] = (row["ms"] / t) if t else None
    return rows


def build_rows(results, env, copy_gbs, warmup, l2_flush: bool):
    """The timing rows of the measurements ``results`` (each with all its samples, ``times``)."""
    rows = []
    for r in results:
        gpu = method_of(r) == "gpu"
        rows.append(timing_row(env, copy_gbs, r, statistics.median(r["times"]), r["times"],
                               warmup if gpu else None, l2_flush if gpu else False,
                               r.get("host_ahead_us", 0.0) if gpu else 0.0))
    return add_speedups(rows)


CSV_FIELDS = list(ENV_FIELDS) + [
    "method", "mix", "S", "C", "width", "activation", "pass", "provider", "bias", "ms", "us", "ms_p10", "ms_p90", "n",
    "floor_bytes", "gbs", "fraction", "copy_gbs", "speedup_vs_fla", "speedup_vs_dao", "speedup_vs_dao_det",
    "eager_vs_gpu", "ratio_to_trivial", "host_ms",
    "n_docs", "doc_min", "doc_max", "n_sets", "chain", "host_ahead_us"]


def write_json(path: str, data) -> None:
    """``data`` as indented JSON, written to a temporary file first (a reader never sees half a file)."""
    with open(path + ".tmp", "w") as f:
        json.dump(data, f, indent=1)
    os.replace(path + ".tmp", path)


def write_result_files(out_dir: str, name: str, result: dict, text: str) -> None:
    """A one-file benchmark's outputs: ``<name>.json`` (``result``) and ``<name>_table.txt`` (``text``,
    also printed, then the JSON's path)."""
    path = os.path.join(out_dir, f"{name}.json")
    write_json(path, result)
    with open(os.path.join(out_dir, f"{name}_table.txt"), "w") as f:
        f.write(text + "\n")
    print(text)
    print(f"# wrote {path}")


def write_jsonl(path: str, lines) -> None:
    with open(path, "w") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")


def write_csv(path: str, rows, fields) -> None:
    """The rows' ``fields`` columns (a field a row lacks is empty)."""
    with open(path, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        wr.writeheader()
        for r in rows:
            wr.writerow({k: r.get(k) for k in fields})


def write_outputs(rows, checks, env, notes, out_dir, elapsed, stem=FILE_STEM) -> list[str]:
    """``<stem>.jsonl`` (env line, timing rows, check rows) and ``<stem>.csv`` (timing rows); their paths."""
    jl, cs = os.path.join(out_dir, stem + ".jsonl"), os.path.join(out_dir, stem + ".csv")
    run = {"date": env["date"], "commit": env.get("commit"), "gpu": env["gpu"]}
    write_jsonl(jl, [{"kind": "env", **env, "elapsed_s": elapsed, "notes": notes}, *rows,
                     *({**c, **run} for c in checks)])
    write_csv(cs, rows, CSV_FIELDS)
    return [jl, cs]


class PartialFile:
    """``<stem>.partial.jsonl``: the env line with the start copy reading, then one line per measurement."""

    def __init__(self, out_dir, stem, env, copy_gbs_start):
        os.makedirs(out_dir, exist_ok=True)
        self.path = os.path.join(out_dir, stem + ".partial.jsonl")
        with open(self.path, "w") as f:
            f.write(json.dumps({"kind": "env", **env, "copy_gbs_start": copy_gbs_start, "partial": True}) + "\n")

    def add(self, r) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps({"kind": "partial", **{k: v for k, v in r.items() if k != "times"},
                                "median_ms": statistics.median(r["times"]), "n": len(r["times"])}) + "\n")
