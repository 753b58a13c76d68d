"""The plots of a run: fraction of copy bandwidth against C per mix and pass, against the width W, and the host cost.

``<stem>.png``: at S = sweep_s and one (W, activation), W = 4 + SiLU when the run has it (else its first),
one row of panels per document mix, one panel per GPU-time pass and per eager form (where the provider's GPU
time of fwd+bwd is drawn dotted beside it), one line per provider (solid: no bias, dashed: bias), SPEC 7's
targets dotted grey. ``<stem>_widths.png`` (runs of two or more (W, activation)): GPU time at S = sweep_s
against W, one row of panels per (mix, C), one panel per pass, one line per provider and activation (solid:
SiLU, dashed: none), the rows without bias (with bias when the run has only those).
``<stem>_host_cost.png`` (with host-cost rows): host time per call, one group of bars per item. matplotlib
is imported lazily; without it the plots are skipped with a note.
"""

from __future__ import annotations

import os

from measures import ALL_PROVIDERS, HOST_ITEMS, HOST_METHOD, METHOD_LABEL, PASS_LABEL, PASSES, PROVIDER_ORDER
from measures import DEFAULT_ACTIVATION, DEFAULT_WIDTH, SMALL_C_BELOW, target_steps
from report_rows import FILE_STEM, act_of, method_of, mix_of, width_of

COLORS = {"ours": "tab:blue", "ours_search": "tab:purple", "ours_ag": "tab:cyan", "fla": "tab:orange",
          "dao": "tab:green", "dao_det": "tab:red", "trivial": "tab:gray", "silu": "tab:olive"}


def _pyplot(notes):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:  # noqa: BLE001
        msg = f"plot skipped: matplotlib did not import ({exc})"
        if msg not in notes:
            notes.append(msg)
        return None
    return plt


def _provider_lines(ax, sel, cur, mix, method):
    """One line per provider and bias variant; beside an eager form, the provider's GPU time of fwd+bwd."""
    for prov in ALL_PROVIDERS:
        for bias in (False, True):
            pts = sorted((r["C"], r["fraction"]) for r in cur if r["provider"] == prov and r["bias"] == bias)
            if not pts:
                continue
            label = f"{prov}{' +bias' if bias else ''}"
            ax.plot([c for c, _ in pts], [f for _, f in pts], marker="o", ms=3,
                    color=COLORS.get(prov), linestyle="--" if bias else "-", label=label)
            if method == "gpu":
                continue
            cs = {c for c, _ in pts}
            gpts = sorted((r["C"], r["fraction"]) for r in sel if mix_of(r) == mix and method_of(r) == "gpu"
                          and r["pass"] == "fwdbwd" and r["provider"] == prov and r["bias"] == bias and r["C"] in cs)
            if gpts:
                ax.plot([c for c, _ in gpts], [f for _, f in gpts], color=COLORS.get(prov), lw=0.8,
                        linestyle=":", label=f"{label} GPU time")


def _panel(ax, sel, mix, method, p_, n_docs, sweep_s):
    """The panel of one mix and one GPU-time pass or eager form (off when it has no rows)."""
    cur = [r for r in sel if mix_of(r) == mix and method_of(r) == method and r["pass"] == p_]
    if not cur:
        ax.axis("off")
        return
    _provider_lines(ax, sel, cur, mix, method)
    cs = sorted({r["C"] for r in cur}) or sorted({r["C"] for r in sel})
    if method == "gpu" and cs:
        for lo, hi, t in target_steps(mix, p_):
            x0, x1 = max(lo, cs[0]), (hi if hi is not None else max(cs[-1], SMALL_C_BELOW))
            if x1 > x0 or (hi is None and x1 >= x0):
                ax.hlines(t, x0, x1, color="gray", lw=0.8, ls=":")
    if cs:
        ax.set_xscale("log", base=2)
        ax.set_xticks(cs)
        ax.set_xticklabels([str(c) for c in cs], rotation=60, fontsize=7)
        ax.minorticks_off()
    ax.set_xlabel("C (channels)")
    ax.set_ylabel("fraction of copy bandwidth")
    ax.set_ylim(0, 1.05)
    what = PASS_LABEL[p_] if method == "gpu" else METHOD_LABEL[method] + " (per call, fwd+bwd floor)"
    docs_txt = (f"{n_docs[0]}" if len(set(n_docs)) == 1 else f"{n_docs[0]}-{n_docs[-1]}") if n_docs else "?"
    ax.set_title(f"{what}\n{mix} ({docs_txt} docs), S={sweep_s}", fontsize=9)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def plot(rows, sweep_s, env, out_dir, notes, stem=FILE_STEM):
    """``<stem>.png``: fraction of copy bandwidth against C at S = sweep_s (see the module docstring); its path,
    or None (with a note) when there is nothing to draw or no matplotlib."""
    sel = [r for r in rows if r["S"] == sweep_s and method_of(r) in ("gpu", "eager", "eager_step")]
    if not sel:
        notes.append(f"plot skipped: no GPU-time or eager rows at S={sweep_s}")
        return None
    was = list(dict.fromkeys((width_of(r), act_of(r)) for r in sel))
    wa = (DEFAULT_WIDTH, DEFAULT_ACTIVATION) if (DEFAULT_WIDTH, DEFAULT_ACTIVATION) in was else was[0]
    sel = [r for r in sel if (width_of(r), act_of(r)) == wa]
    plt = _pyplot(notes)
    if plt is None:
        return None
    mixes = list(dict.fromkeys(mix_of(r) for r in sel))
    cols = [("gpu", p) for p in PASSES if any(method_of(r) == "gpu" and r["pass"] == p for r in sel)]
    cols += [(m, "fwdbwd") for m in ("eager", "eager_step") if any(method_of(r) == m for r in sel)]
    fig, axes = plt.subplots(len(mixes), len(cols), figsize=(5.0 * len(cols), 3.9 * len(mixes)), squeeze=False)
    for i, mix in enumerate(mixes):
        docs = {r["C"]: r.get("n_docs") for r in sel if mix_of(r) == mix and r.get("n_docs")}
        n_docs = sorted(v for v in docs.values() if v)
        for j, (method, p_) in enumerate(cols):
            _panel(axes[i][j], sel, mix, method, p_, n_docs, sweep_s)
    fig.suptitle(f"{env['gpu']}, copy {env['copy_gbs']:.0f} GB/s, {env['date']}"
                 + (f"; W = {wa[0]}, {'SiLU' if wa[1] == 'silu' else 'no activation'}" if len(was) > 1 else ""),
                 fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.3 / (3.9 * len(mixes))))
    path = os.path.join(out_dir, stem + ".png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _width_panel(ax, cur, mix, C, p_, sweep_s):
    """One (mix, C, pass) panel of the widths plot: fraction against W, a line per provider and activation."""
    for prov in ALL_PROVIDERS:
        for act in ("silu", "none"):
            pts = sorted((width_of(r), r["fraction"]) for r in cur if r["provider"] == prov and act_of(r) == act)
            if pts:
                ax.plot([w for w, _ in pts], [f for _, f in pts], marker="o" if act == "silu" else "s", ms=3,
                        color=COLORS.get(prov), linestyle="-" if act == "silu" else "--",
                        label=f"{prov} {'SiLU' if act == 'silu' else 'none'}")
    ax.set_xticks(sorted({width_of(r) for r in cur}))
    ax.set_xlabel("W (taps per channel)")
    ax.set_ylabel("fraction of copy bandwidth")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"{PASS_LABEL[p_]}, {mix}, S={sweep_s} C={C}", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=6, ncol=2)


def plot_widths(rows, sweep_s, env, out_dir, notes, stem=FILE_STEM):
    """``<stem>_widths.png``: GPU time against W (see the module docstring); its path, or None when the run has
    fewer than two (W, activation) at S = sweep_s or no matplotlib."""
    sel = [r for r in rows if r["S"] == sweep_s and method_of(r) == "gpu"]
    if len({(width_of(r), act_of(r)) for r in sel}) < 2:
        return None
    bias = False if any(not r["bias"] for r in sel) else True
    sel = [r for r in sel if r["bias"] == bias]
    plt = _pyplot(notes)
    if plt is None:
        return None
    panels = list(dict.fromkeys((mix_of(r), r["C"]) for r in sel))
    passes = [p for p in PASSES if any(r["pass"] == p for r in sel)]
    fig, axes = plt.subplots(len(panels), len(passes), figsize=(5.0 * len(passes), 3.6 * len(panels)), squeeze=False)
    for i, (mix, C) in enumerate(panels):
        for j, p_ in enumerate(passes):
            cur = [r for r in sel if mix_of(r) == mix and r["C"] == C and r["pass"] == p_]
            _width_panel(axes[i][j], cur, mix, C, p_, sweep_s)
    fig.suptitle(f"{env['gpu']}, copy {env['copy_gbs']:.0f} GB/s, {env['date']}; GPU time, "
                 f"{'bias' if bias else 'no bias'}", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.3 / (3.6 * len(panels))))
    path = os.path.join(out_dir, stem + "_widths.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_host_cost(rows, env, out_dir, notes, stem=FILE_STEM):
    """``<stem>_host_cost.png``: host cost per call (us) at the tiny shape, one group of bars per item, one bar
    per provider; its path, or None."""
    sel = [r for r in rows if method_of(r).startswith("host_")]
    if not sel:
        return None
    plt = _pyplot(notes)
    if plt is None:
        return None
    items = [m for m in (HOST_METHOD[i] for i in HOST_ITEMS) if any(method_of(r) == m for r in sel)]
    provs = [p for p in PROVIDER_ORDER if any(r["provider"] == p for r in sel)]
    fig, ax = plt.subplots(figsize=(2.2 + 2.0 * len(items), 4.2))
    width = 0.8 / max(1, len(provs))
    for k, prov in enumerate(provs):
        xs, hs = [], []
        for i, item in enumerate(items):
            r = next((r for r in sel if method_of(r) == item and r["provider"] == prov), None)
            if r is not None:
                xs.append(i + (k - (len(provs) - 1) / 2) * width)
                hs.append(r["us"])
        bars = ax.bar(xs, hs, width, label=prov, color=COLORS.get(prov))
        for b_, h in zip(bars, hs):
            ax.annotate(f"{h:.0f}", (b_.get_x() + b_.get_width() / 2, h), ha="center", va="bottom", fontsize=6)
    ax.set_xticks(range(len(items)))
    ax.set_xticklabels([METHOD_LABEL[m] for m in items], fontsize=8)
    ax.set_ylabel("host time per call (us)")
    S, C = sel[0]["S"], sel[0]["C"]
    ax.set_title(f"host cost per call, S={S} C={C} one document (GPU idle); chain of {sel[0].get('chain') or '?'}",
                 fontsize=9)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=7)
    fig.suptitle(f"{env['gpu']}, {env['date']}", fontsize=9)
    fig.tight_layout()
    path = os.path.join(out_dir, stem + "_host_cost.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
