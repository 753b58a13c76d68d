"""Draw docs/benchmarks.png from a document-mix run of the single-GPU benchmark.

Run:  python docs/draw_benchmarks.py [RESULTS]      (needs matplotlib: pip install -e ".[bench]")

RESULTS is the JSON-lines file that ``benchmarks/bench_cake_causal_conv1d_det.py`` writes; default
``benchmarks/results/h200_mixes.jsonl`` (``bash benchmarks/device_run.sh daobuild mixes``). Only its
GPU-time rows without bias are drawn, as fractions of the copy bandwidth of the same run
(benchmarks/README.md, Protocol):

- top row: cakeconv's forward and forward+backward against C, one line per document mix;
- bottom row: at one C (``--bar-c``, default 512), cakeconv beside each peer in the file
  (flash-linear-attention, Dao's causal-conv1d), one group of bars per mix. A peer that has no row
  for a mix (it failed its correctness check there) is marked "fails".
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_RESULTS = REPO / "benchmarks" / "results" / "h200_mixes.jsonl"
OUT_PATH = REPO / "docs" / "benchmarks.png"
PASSES = (("fwd", "forward"), ("fwdbwd", "forward + backward"))
MIX_ORDER = ("seed", "uniform:1-1024", "uniform:1-64", "uniform:1-8", "ones")
MIX_LABEL = {"seed": "seed mix", "uniform:1-1024": "uniform 1-1,024", "uniform:1-64": "uniform 1-64",
             "uniform:1-8": "uniform 1-8", "ones": "every document 1 token"}
PROVIDER_LABEL = {"ours": "cakeconv", "fla": "flash-linear-attention", "dao": "Dao causal-conv1d"}
PROVIDER_COLOR = {"ours": "tab:blue", "fla": "tab:orange", "dao": "tab:green"}
MARKERS = ("o", "s", "^", "v", "D")  # one per mix: mixes with equal figures stay visible


def load_rows(path: pathlib.Path):
    """(env record, GPU-time rows without bias) of a benchmark's JSON-lines file."""
    if not path.is_file():
        raise SystemExit(f"{path}: no such file (the results of bash benchmarks/device_run.sh daobuild mixes)")
    env, rows = None, []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        if record.get("kind") == "env":
            env = record
        elif record.get("kind") == "timing" and record.get("method", "gpu") == "gpu" and not record["bias"]:
            rows.append(record)
    if env is None or not rows:
        raise SystemExit(f"{path}: no env line or no GPU-time rows without bias")
    return env, rows


def fraction(rows, provider, mix, C, pass_name):
    """The row's fraction of the copy bandwidth, or None when the run has no such row."""
    for r in rows:
        if (r["provider"], r.get("mix", "seed"), r["C"], r["pass"]) == (provider, mix, C, pass_name):
            return r["fraction"]
    return None


def draw_ours_against_c(ax, rows, mixes, pass_name, title):
    """cakeconv's fraction against C, one line per mix."""
    cs = sorted({r["C"] for r in rows if r["provider"] == "ours"})
    for i, mix in enumerate(mixes):
        points = [(C, fraction(rows, "ours", mix, C, pass_name)) for C in cs]
        points = [(C, f) for C, f in points if f is not None]
        ax.plot([C for C, _ in points], [f for _, f in points], marker=MARKERS[i % len(MARKERS)], ms=5,
                fillstyle="none", label=MIX_LABEL.get(mix, mix))
    ax.set_xscale("log", base=2)
    ax.set_xticks(cs)
    ax.set_xticklabels([str(C) for C in cs])
    ax.minorticks_off()
    ax.set_xlabel("C (channels)")
    ax.set_ylabel("fraction of copy bandwidth")
    ax.set_ylim(0.5, 1.0)
    ax.set_title(f"cakeconv, {title}", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")


def draw_peers_at_c(ax, rows, mixes, providers, C, pass_name, title):
    """One group of bars per mix at C: each provider's fraction, "fails" where it has no row."""
    width = 0.8 / len(providers)
    for k, provider in enumerate(providers):
        offset = (k - (len(providers) - 1) / 2) * width
        for i, mix in enumerate(mixes):
            f = fraction(rows, provider, mix, C, pass_name)
            x = i + offset
            if f is None:
                ax.text(x, 0.02, "fails", rotation=90, ha="center", va="bottom", fontsize=7)
                continue
            ax.bar(x, f, width, color=PROVIDER_COLOR.get(provider),
                   label=PROVIDER_LABEL.get(provider, provider) if i == 0 else None)
            ax.text(x, f + 0.01, f"{f:.2f}", ha="center", va="bottom", fontsize=6)
    ax.set_xticks(range(len(mixes)))
    ax.set_xticklabels([MIX_LABEL.get(m, m) for m in mixes], fontsize=7, rotation=15)
    ax.set_ylabel("fraction of copy bandwidth")
    ax.set_ylim(0, 1.15)
    ax.set_title(f"{title} at C = {C}", fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", ncol=len(providers))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="?", type=pathlib.Path, default=DEFAULT_RESULTS)
    parser.add_argument("--bar-c", type=int, default=512, help="C of the bottom row's bars")
    parser.add_argument("--out", type=pathlib.Path, default=OUT_PATH)
    args = parser.parse_args()
    env, rows = load_rows(args.results)
    found = {r.get("mix", "seed") for r in rows}
    mixes = [m for m in MIX_ORDER if m in found] + sorted(found - set(MIX_ORDER))
    providers = [p for p in ("ours", "fla", "dao") if any(r["provider"] == p for r in rows)]
    if not any(r["C"] == args.bar_c for r in rows):
        raise SystemExit(f"{args.results}: no rows at C = {args.bar_c} (--bar-c)")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11.0, 8.0))
    for j, (pass_name, title) in enumerate(PASSES):
        draw_ours_against_c(axes[0][j], rows, mixes, pass_name, title)
        draw_peers_at_c(axes[1][j], rows, mixes, providers, args.bar_c, pass_name, title)
    S = sorted({r["S"] for r in rows})
    fig.suptitle(f"{env['gpu']}, S = {', '.join(f'{s:,}' for s in S)}, bf16, no bias; GPU time as a fraction of "
                 f"the copy bandwidth ({env['copy_gbs']:.0f} GB/s, same run)", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(args.out, dpi=100)
    plt.close(fig)
    print(f"wrote {args.out} from {args.results} ({len(rows)} rows, mixes {', '.join(mixes)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
