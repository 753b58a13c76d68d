"""Draw docs/layouts.png: the three KCP layouts for P = 2, 3, 4 ranks and where the halo rows come from.

Run:  python docs/draw_layouts.py        (needs matplotlib: pip install matplotlib)

One panel per layout, one strip per P. Each strip is the packed batch in global token order, one cell per token, coloured by the rank that
holds it (the fragments come from the library's own ``layout_fragments``, so the picture is the
code's layout). Thick black lines are document boundaries. For every fragment piece that continues a
document, arrows run from the (up to) 3 preceding tokens of that document -- its forward halo,
hatched -- to the piece's first token: solid when they live on another rank (they travel in the halo
exchange), dashed when on the same rank (another fragment of that rank: read locally). The backward
exchanges the same pairs the other way (FP32 g rows of the 3 tokens after a piece).

Each strip's batch has three documents of 2P, 6P and 4P tokens (T = 12P), so that every layout
is valid: T % 2P == 0 for zigzag and every document length % 2P == 0 for zigzag_per_document. The
2P-token document cut into 2P chunks shows the multi-hop case (fragments of 1 token whose halo spans
several ranks).
"""

from __future__ import annotations

import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import FancyArrowPatch, Patch, Rectangle  # noqa: E402

from cakeconv.cake_causal_conv1d_det_train_backend.kcp.plan import HALO_ROWS, LAYOUTS, layout_fragments  # noqa: E402

OUT_PATH = pathlib.Path(__file__).resolve().parent / "layouts.png"
RANK_COLORS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52"]
WORLD_SIZES = (2, 3, 4)


LAYOUT_TITLES = {
    "contiguous": "contiguous: rank r holds [r*T/P, (r+1)*T/P)",
    "zigzag": "zigzag: T cut into 2P chunks; rank r holds chunk r, then chunk 2P-1-r",
    "zigzag_per_document": "zigzag_per_document: each document cut into 2P chunks; rank r holds chunk r, "
                           "then chunk 2P-1-r, of each document",
}


def batch(P: int) -> list[int]:
    """cu_seqlens of one strip's batch: documents of 2P, 6P and 4P tokens."""
    cu = [0]
    for length in (2 * P, 6 * P, 4 * P):
        cu.append(cu[-1] + length)
    return cu


def halo_links(cu: list[int], fragments) -> list[tuple[int, int, int, int]]:
    """(source token, target token, source rank, target rank) for every halo row of every piece.

    A piece is the part of a fragment inside one document; its halo is the up to 3 tokens before
    its first token that belong to the same document.
    """
    owner = {}
    for rank, spans in enumerate(fragments):
        for start, stop in spans:
            for t in range(start, stop):
                owner[t] = rank
    links = []
    for rank, spans in enumerate(fragments):
        for start, stop in spans:
            for d in range(len(cu) - 1):
                piece_start = max(start, cu[d])
                if piece_start >= min(stop, cu[d + 1]) or piece_start == cu[d]:
                    continue  # no overlap with document d, or the piece starts the document
                for src in range(max(cu[d], piece_start - HALO_ROWS), piece_start):
                    links.append((src, piece_start, owner[src], rank))
    return links


STRIP_PITCH = 2.8  # vertical distance between the strips of P = 2, 3, 4 in one panel


def draw_strip(ax, layout: str, P: int, y0: float) -> None:
    """One packed batch as a strip of cells at height y0..y0+1, with its halo arrows above it."""
    cu = batch(P)
    fragments = layout_fragments(cu, P, layout)

    for rank, spans in enumerate(fragments):
        for start, stop in spans:
            for t in range(start, stop):
                ax.add_patch(Rectangle((t, y0), 1, 1, facecolor=RANK_COLORS[rank], edgecolor="white", lw=0.6))
            ax.add_patch(Rectangle((start, y0), stop - start, 1, fill=False, edgecolor="black", lw=0.9))
            # label the fragment in the middle of its longest piece (clear of document boundaries)
            pieces = [(max(start, cu[d]), min(stop, cu[d + 1])) for d in range(len(cu) - 1)]
            lo, hi = max(pieces, key=lambda piece: piece[1] - piece[0])
            if hi - lo >= 2:
                ax.text((lo + hi) / 2, y0 + 0.5, f"r{rank}", ha="center", va="center", fontsize=9,
                        color="white", fontweight="bold")

    links = halo_links(cu, fragments)
    for src, _, _, _ in links:
        ax.add_patch(Rectangle((src, y0), 1, 1, fill=False, hatch="///", edgecolor="black", lw=0))
    for src, dst, src_rank, dst_rank in links:
        same_rank = src_rank == dst_rank
        span = dst - src  # 1..3: higher arcs for rows further back
        ax.add_patch(FancyArrowPatch((src + 0.5, y0 + 1), (dst + 0.15, y0 + 1),
                                     connectionstyle=f"arc3,rad=-{0.3 + 0.12 * span}", arrowstyle="-|>",
                                     mutation_scale=8, lw=1.1, color="dimgray" if same_rank else RANK_COLORS[src_rank],
                                     linestyle="--" if same_rank else "-", shrinkA=0, shrinkB=0))

    for d, boundary in enumerate(cu):
        ax.plot([boundary, boundary], [y0 - 0.3, y0 + 1.3], color="black", lw=2.6)
        if d < len(cu) - 1:
            ax.text((cu[d] + cu[d + 1]) / 2, y0 - 0.45, f"doc {d}: {cu[d + 1] - cu[d]} tokens", ha="center",
                    va="center", fontsize=8)
    ax.text(-1.0, y0 + 0.5, f"P = {P}\nT = {cu[-1]}", ha="right", va="center", fontsize=10)


def main() -> None:
    T_max = batch(max(WORLD_SIZES))[-1]
    fig, axes = plt.subplots(len(LAYOUTS), 1, figsize=(13, 11.5))
    for ax, layout in zip(axes, LAYOUTS):
        for i, P in enumerate(WORLD_SIZES):
            draw_strip(ax, layout, P, y0=-i * STRIP_PITCH)
        ax.set_xlim(-6, T_max + 0.5)
        ax.set_ylim(-(len(WORLD_SIZES) - 1) * STRIP_PITCH - 0.9, 2.2)
        ax.axis("off")
        ax.set_title(LAYOUT_TITLES[layout], fontsize=11, loc="left")
    handles = [Patch(facecolor=RANK_COLORS[r], label=f"rank {r}") for r in range(max(WORLD_SIZES))]
    handles += [
        Line2D([0], [0], color="black", lw=2.6, label="document boundary"),
        Patch(facecolor="white", edgecolor="black", hatch="///", label="halo row"),
        Line2D([0], [0], color=RANK_COLORS[0], lw=1.2, label="halo from another rank (exchanged)"),
        Line2D([0], [0], color="dimgray", lw=1.2, linestyle="--", label="halo from the same rank (local)"),
    ]
    fig.legend(handles=handles, loc="lower center", ncol=4, fontsize=10, frameon=False)
    fig.suptitle("KCP layouts: the rank of each token (global order; black boxes = fragments)\n"
                 "and the up to 3 history rows each fragment reads from the tokens before it", fontsize=12)
    fig.tight_layout(rect=(0, 0.06, 1, 0.95))
    fig.savefig(OUT_PATH, dpi=110)
    print(f"wrote {OUT_PATH}")


if __name__ == "__main__":
    main()
