"""What every benchmark writes: the run's environment (date, commit, GPU, torch, triton, Python, host), progress on
stderr, JSON lines, CSV, JSON, text tables, plots; and the op benchmark's table and plot (op.py measures)."""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime
import functools
import importlib.metadata
import itertools
import json
import os
import platform
import signal
import subprocess
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def note(notes: list, msg: str) -> None:
    notes.append(msg)
    log("note: " + msg)


def stamped(who: str, text: str) -> None:
    log(f"[{who} {time.strftime('%H:%M:%S')}] {text}")


def fmt_secs(s: float) -> str:
    return f"{int(max(0.0, s) // 60)}m{int(max(0.0, s) % 60):02d}s"


def git_commit() -> str | None:
    """BENCH_COMMIT (a copy of the tree may have no .git), else HEAD (-dirty: cakeconv/ or benchmarks/ changed)."""
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    git = functools.partial(subprocess.run, capture_output=True, text=True, timeout=10)
    try:
        head = git(["git", "-C", REPO_ROOT, "rev-parse", "--short=12", "HEAD"])
        dirty = git(["git", "-C", REPO_ROOT, "status", "--porcelain", "--", "cakeconv", "benchmarks"]).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("-dirty" if dirty else "") if head.returncode == 0 else None


def package_version(module: str, *distributions: str) -> str | None:
    """The imported ``module``'s ``__version__``, else the first installed of ``distributions`` (or ``module``)."""
    found = getattr(sys.modules.get(module), "__version__", None)
    for name in () if found else distributions or (module,):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return importlib.metadata.version(name)
    return found


def run_stamp() -> dict:
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "commit": git_commit(), "python": platform.python_version(), "host": platform.node(),
            "cpu_count": os.cpu_count()}


def run_environment(torch, device, cpu_name: str) -> dict:
    """The fields every run records; ``cpu_name`` stands for the GPU's name on a CPU run."""
    env = {**run_stamp(), "torch": torch.__version__, "triton": package_version("triton", "triton", "pytorch-triton"),
           "gpu": cpu_name, "sm": None, "l2_bytes": 0, "cuda": None}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(gpu=props.name, sm=f"{props.major}.{props.minor}", cuda=torch.version.cuda,
                   l2_bytes=int(getattr(props, "L2_cache_size", 0) or 0))
    return env


def write_json(path: str, data) -> None:
    """``data`` as indented JSON, written to a temporary file first (a reader never sees half a file)."""
    with open(path + ".tmp", "w") as f:
        json.dump(data, f, indent=1)
    os.replace(path + ".tmp", path)


def write_jsonl(path: str, lines) -> None:
    with open(path, "w") as f:
        f.writelines(json.dumps(line) + "\n" for line in lines)


def read_jsonl(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def write_csv(path: str, rows, fields) -> None:
    with open(path, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        wr.writeheader()
        wr.writerows({k: r.get(k) for k in fields} for r in rows)


def write_result_files(out_dir: str, name: str, result: dict, text: str) -> None:
    """``<name>.json`` (result) and ``<name>_table.txt`` (text, also printed, then the JSON's path)."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{name}.json")
    write_json(path, result)
    with open(os.path.join(out_dir, f"{name}_table.txt"), "w") as f:
        f.write(text + "\n")
    print(text)
    print(f"# wrote {path}")


def option_parser(doc: str, options, internal=()) -> argparse.ArgumentParser:
    """A parser of ``options`` [(name, default, help)] typed by their defaults, and hidden ``internal`` ones."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    for name, default, text in options:
        p.add_argument("--" + name, type=type(default), default=default, help=f"{text} (default: {default or 'none'})")
    for name in internal:
        p.add_argument("--" + name, help=argparse.SUPPRESS)
    return p


def choices(text, allowed, what: str, need_one: bool = False) -> list:
    """The items of a comma list, each once, in order, each among ``allowed`` (else SystemExit naming ``--what``)."""
    out = list(dict.fromkeys(v.strip().lower() for v in str(text).split(",") if v.strip()))
    if [v for v in out if v not in allowed] or (need_one and not out):
        raise SystemExit(f"--{what}: {[v for v in out if v not in allowed] or text!r} not among {', '.join(allowed)}")
    return out


def run_child(cmd: list, path: str, timeout: float, deadline: float, limits: str, variables=None, cwd=None) -> tuple:
    """``cmd`` in its own process group, the repository on PYTHONPATH, ``variables`` set (None: unset), stdout on
    stderr, killed after ``timeout`` s or at ``deadline`` (perf_counter; none starts in its last 10 s): (the JSON it
    wrote to ``path``, then removed, or {}; its exit status or why it ended; its seconds or None)."""
    left = deadline - time.perf_counter()
    if left < 10:
        return {}, "not started: --time-limit spent", None
    timeout, stderr, found = min(timeout, left), None, {}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH")) if p),
           **(variables or {})}
    with contextlib.suppress(AttributeError, OSError, ValueError):
        stderr = sys.stderr.fileno()
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env={k: v for k, v in env.items() if v is not None}, cwd=cwd, stdout=stderr,
                            start_new_session=True)
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        rc = f"killed after {timeout:.1f} s ({limits}, --time-limit)"
    seconds = time.perf_counter() - t0
    if os.path.exists(path):
        with open(path) as f:
            found = json.load(f)
        os.remove(path)
    return found, rc, seconds


def ended(rc) -> str:
    return f"exited with {rc}" if isinstance(rc, int) else str(rc)


def cell(value, fmt: str, width: int) -> str:
    return f"{value:>{width}{fmt}}" if isinstance(value, (int, float)) else f"{value or '-':>{width}}"


def pyplot(notes: list):
    """matplotlib's pyplot on the Agg backend, or None (with a note) when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        note(notes, "matplotlib is not installed (pip install -e '.[bench]'): no plot")
        return None
    return plt


# The op benchmark's rows: method (gpu, eager, eager_step, host_chain, host_step, host_nograd, host_ws), mix, S, C,
# width, activation ("silu", "none"), pass, provider, bias, ms (per call), gbs, fraction (of the copy bandwidth), ...

PASSES = ("fwd", "bwd", "fwdbwd")
PASS_LABEL = {"fwd": "fwd", "bwd": "bwd", "fwdbwd": "fwd+bwd"}
PEERS = ("fla", "dao", "dao_det")
PROVIDERS = ("ours", "ours_ag") + PEERS
PROVIDER_ORDER = PROVIDERS + ("trivial", "silu")  # the host-cost baselines last
BASE_WA = (4, "silu")  # the default (W, activation): rows of older files, SPEC 7's targets
METHOD_LABEL = {"gpu": "GPU time", "eager": "eager, chain", "eager_step": "eager, one call per step",
                "host_chain": "chain (per call)", "host_step": "one call + backward per step",
                "host_nograd": "forward under no_grad", "host_ws": "workspace entry points fwd+bwd"}
COLORS = {"ours": "tab:blue", "ours_ag": "tab:cyan", "fla": "tab:orange", "dao": "tab:green", "dao_det": "tab:red"}


def row_key(r) -> tuple:
    """(mix, method, S, C, width, activation, pass, bias, provider) of row r."""
    return tuple(r[n] for n in ("mix", "method", "S", "C", "width", "activation", "pass", "bias", "provider"))


def wa_text(width, act) -> str:
    return f"W = {width}, {'SiLU' if act == 'silu' else 'no activation'}"


def _in(rows, key, values) -> list:
    return [v for v in values if any(r[key] == v for r in rows)]


def _gpu_table(rows) -> list[str]:
    """A block per mix, (W, activation), bias; a line per (S, C, pass): ms, GB/s, f of each; xN: peer time / ours."""
    gpu, out = [r for r in rows if r["method"] == "gpu"], []
    idx, passes, provs = {row_key(r): r for r in gpu}, _in(gpu, "pass", PASSES), _in(gpu, "provider", PROVIDERS)
    ours, peers = [p for p in provs if p not in PEERS], [p for p in provs if p in PEERS]
    xs = {(o, p): ("x" + p) if o == "ours" else (o[-2:] + "/" + p) for o in ours for p in peers}
    cols = [(p, None) for p in ours] + [(p, o) for p in peers for o in [None] + ours]
    head = f"{'S':>7} {'C':>5} {'pass':<7}" + "".join(f" | {p + ' ms':>10} {'GB/s':>5} {'f':>4}" if o is None else
                                                      f" {xs[o, p]:>{max(6, len(xs[o, p]))}}" for p, o in cols)
    keys = list(dict.fromkeys((r["mix"], r["S"], r["C"]) for r in gpu))
    for mix, (width, act), bias in itertools.product(dict.fromkeys(m for m, _, _ in keys), _was(gpu, sort=False),
                                                     (False, True)):
        block = []
        for (_, S, C), p_ in itertools.product([k for k in keys if k[0] == mix], passes):
            get = lambda p: idx.get((mix, "gpu", S, C, width, act, p_, bias, p))  # noqa: E731
            line = f"{S:>7} {C:>5} {PASS_LABEL[p_]:<7}"
            for p, o in cols:
                r, w = get(p), max(6, len(xs[o, p])) if o else 0
                if o is not None:
                    x = (get(o) or {}).get("speedup_vs_" + p) if r else None
                    line += f" {x:>{w - 1}.1f}x" if x else f" {'-':>{w}}"
                elif r is None:
                    line += f" | {'-':>10} {'-':>5} {'-':>4}"
                elif p in PEERS:
                    line += f" | {r['ms']:>10.3f} {r['gbs']:>5.0f} {r['fraction']:>4.2f}"
                else:
                    gbs = f"{r['gbs']:.0f}" if r["gbs"] >= 10 else f"{r['gbs']:.2f}"
                    line += f" | {r['ms']:>10.4f} {gbs:>5} {r['fraction']:>4.2f}"
            block += [line] if any(get(p) for p in provs) else []
        if block:
            docs = sorted({r["n_docs"] for r in gpu if r["mix"] == mix and r.get("n_docs")})
            n_txt = docs[0] if len(docs) == 1 else f"{docs[0]}-{docs[-1]}" if docs else "?"
            out += ["", f"== GPU time, {mix} ({n_txt} documents), {wa_text(width, act)}, "
                        f"{'bias' if bias else 'no bias'} ==", head] + block
    return out


def _was(rows, sort=True) -> list:
    """The (W, activation) of rows, each once: by W, SiLU first (sort), or in the order they first appear."""
    was = list(dict.fromkeys((r["width"], r["activation"]) for r in rows))
    return sorted(was, key=lambda wa: (wa[0], wa[1] != "silu")) if sort else was


def _eager_table(rows) -> list[str]:
    ev = [r for r in rows if r["method"] in ("eager", "eager_step")]
    if not ev:
        return []
    idx, provs = {row_key(r): r for r in rows}, _in(ev, "provider", PROVIDER_ORDER)
    chain = next((r.get("chain") for r in ev if r["method"] == "eager"), None) or "-"
    out = ["", f"== eager loop (no host-ahead sleep; wall time per call; f = 10*S*C / time / copy): GPU = GPU time of "
               f"fwd+bwd, chain = {chain}-call chain per step / {chain}, step = one call + backward per "
               "step; e/g = chain / GPU ==",
           f"{'mix':<15} {'S':>7} {'C':>5} {'W':>2} {'act':<4} {'bias':<4}" + "".join(
               f" | {p + ' GPU ms':>11} {'chain ms':>9} {'f':>4} {'e/g':>5} {'step ms':>8} {'f':>4}" for p in provs)]
    for mix, S, C, width, act, bias in dict.fromkeys(
            (r["mix"], r["S"], r["C"], r["width"], r["activation"], r["bias"]) for r in ev):
        line = f"{mix:<15} {S:>7} {C:>5} {width:>2} {act:<4} {'yes' if bias else 'no':<4}"
        for p in provs:
            g, e, s = (idx.get((mix, m, S, C, width, act, "fwdbwd", bias, p)) for m in ("gpu", "eager", "eager_step"))
            line += f" | {g['ms']:>11.4f}" if g else f" | {'-':>11}"
            line += f" {e['ms']:>9.4f} {e['fraction']:>4.2f}" if e else f" {'-':>9} {'-':>4}"
            line += f" {e['eager_vs_gpu']:>5.2f}" if e and e.get("eager_vs_gpu") else f" {'-':>5}"
            line += f" {s['ms']:>8.4f} {s['fraction']:>4.2f}" if s else f" {'-':>8} {'-':>4}"
        out.append(line)
    return out


def _summaries(rows) -> list[str]:
    """Fractions of copy: fwd / fwd+bwd per mix (two or more mixes), ours' per (W, activation) (two or more)."""
    gpu, out = [r for r in rows if r["method"] == "gpu"], []
    sel = [r for r in gpu if r["pass"] in ("fwd", "fwdbwd")]
    idx, was, mixes = {row_key(r): r for r in gpu}, _was(sel), list(dict.fromkeys(r["mix"] for r in sel))
    if len(mixes) > 1:
        provs, bias = _in(sel, "provider", PROVIDERS), all(r["bias"] for r in sel)
        out += ["", f"== document mixes, GPU time, {'bias' if bias else 'no bias'}: fraction of copy, fwd / fwd+bwd ==",
                f"{'mix':<15} {'docs':>6} {'S':>7} {'C':>5} {'W':>2} {'act':<4}"
                + "".join(f" | {p:>11}" for p in provs)]
        keys = dict.fromkeys((r["mix"], r["S"], r["C"]) for r in sel)
        for (mix, S, C), (width, act) in itertools.product(sorted(keys, key=lambda k: (mixes.index(k[0]), k[2], k[1])),
                                                           was):
            docs = next(r.get("n_docs") for r in sel if (r["mix"], r["S"], r["C"]) == (mix, S, C)) or "-"
            cells = [[idx.get((mix, "gpu", S, C, width, act, p_, bias, p)) for p_ in ("fwd", "fwdbwd")] for p in provs]
            if any(f or fb for f, fb in cells):
                out.append(f"{mix:<15} {docs:>6} {S:>7} {C:>5} {width:>2} {act:<4}" + "".join(
                    " | " + " / ".join(f"{r['fraction']:.2f}" if r else "-" for r in c).rjust(11) for c in cells))
    ours = [r for r in gpu if r["provider"] == "ours"]
    if len(_was(ours)) > 1:
        was = _was(ours)
        out += ["", "== widths and activations, GPU time, ours: fraction of copy"
                + (" (ratio to W = 4 + SiLU)" if BASE_WA in was else "") + " ==",
                f"{'mix':<15} {'S':>7} {'C':>5} {'pass':<7} {'bias':<4}"
                + "".join(f" | {f'W{w} {a}':>11}" for w, a in was)]
        for mix, S, C, p_, bias in dict.fromkeys((r["mix"], r["S"], r["C"], r["pass"], r["bias"]) for r in ours):
            base = idx.get((mix, "gpu", S, C) + BASE_WA + (p_, bias, "ours"))
            cells = [idx.get((mix, "gpu", S, C, w, a, p_, bias, "ours")) for w, a in was]
            out.append(f"{mix:<15} {S:>7} {C:>5} {PASS_LABEL[p_]:<7} {'yes' if bias else 'no':<4}" + "".join(
                " | " + ("-" if r is None else f"{r['fraction']:.2f}" + (
                    f" ({r['fraction'] / base['fraction']:.2f})" if base else "")).rjust(11) for r in cells))
    return out


def _host_table(rows) -> list[str]:
    hv = [r for r in rows if r["method"].startswith("host_")]
    if not hv:
        return []
    idx, items = {(r["method"], r["provider"]): r for r in hv}, _in(hv, "method", list(METHOD_LABEL)[3:])
    chain, h = next((r.get("chain") for r in hv if r["method"] == "host_chain"), None), hv[0]
    out = ["", f"== host cost per call, S={h['S']} C={h['C']} one document, {wa_text(h['width'], h['activation'])}, "
               f"bf16, GPU idle (us per call; xT = ratio to the trivial autograd.Function; chain = {chain}) ==",
           f"{'provider':<9}" + "".join(f" | {METHOD_LABEL[m]:>30}" for m in items)]
    for p in _in(hv, "provider", PROVIDER_ORDER):
        out.append(f"{p:<9}" + "".join(" | " + ("-" if r is None else f"{r['us']:.1f}" + (
            f" ({r['ratio_to_trivial']:.1f}xT)" if r.get("ratio_to_trivial") else "")).rjust(30)
            for r in (idx.get((m, p)) for m in items)))
    return out


def op_table(rows, env, check_lines, target_lines, notes, paths, elapsed) -> str:
    """The op benchmark's table: header, check, GPU time, eager loop, mix and width summaries, host cost, targets."""
    out = [f"# {env['gpu']} | torch {env['torch']} | triton {env['triton']} | cakeconv {env['cakeconv']} "
           f"({env['ours_backend']}) | fla {env.get('fla')} | dao {env.get('causal_conv1d')} | {env['date']} "
           f"| commit {env.get('commit')}",
           f"# copy bandwidth {env['copy_gbs']:.0f} GB/s (start {env['copy_gbs_start']:.0f}, end "
           f"{env['copy_gbs_end']:.0f}); floor bytes fwd 4SC, bwd 6SC, fwd+bwd 10SC; ms = median; "
           f"f = fraction of copy; xN = peer time / ours"]
    out += check_lines + _gpu_table(rows) + _eager_table(rows) + _summaries(rows) + _host_table(rows) + [""]
    out += target_lines + [f"# note: {n}" for n in notes]
    return "\n".join(out + [f"# wrote: {', '.join(paths)}", f"# time taken: {elapsed:.1f} s"])


def _c_panel(ax, sel, mix, method, p_, sweep_s, target_steps):
    """Fraction against C of a mix and pass or eager form: a line per provider and bias (dashed), SPEC 7's targets."""
    cur = [r for r in sel if r["mix"] == mix and r["method"] == method and r["pass"] == p_]
    if not cur:
        ax.axis("off")
        return
    for prov, bias in itertools.product(PROVIDERS, (False, True)):
        label = f"{prov}{' +bias' if bias else ''}"
        pts = dict(sorted((r["C"], r["fraction"]) for r in cur if (r["provider"], r["bias"]) == (prov, bias)))
        if pts:
            ax.plot(list(pts), list(pts.values()), marker="o", ms=3, color=COLORS.get(prov),
                    linestyle="--" if bias else "-", label=label)
        gpu = sorted((r["C"], r["fraction"]) for r in sel if r["C"] in pts and method != "gpu" and (
            r["mix"], r["method"], r["pass"], r["provider"], r["bias"]) == (mix, "gpu", "fwdbwd", prov, bias))
        if gpu:
            ax.plot(*zip(*gpu), color=COLORS.get(prov), lw=0.8, linestyle=":", label=f"{label} GPU time")
    cs = sorted({r["C"] for r in cur})
    for lo, hi, t in target_steps(mix, p_) if method == "gpu" else []:
        x0, x1 = max(lo, cs[0]), (hi if hi is not None else max(cs[-1], 512))  # the C >= 512 targets
        if x1 > x0 or (hi is None and x1 >= x0):
            ax.hlines(t, x0, x1, color="gray", lw=0.8, ls=":")
    ax.set_xscale("log", base=2)
    ax.set_xticks(cs, [str(c) for c in cs], rotation=60, fontsize=7)
    ax.minorticks_off()
    docs = sorted({r["n_docs"] for r in sel if r["mix"] == mix and r.get("n_docs")})
    what = PASS_LABEL[p_] if method == "gpu" else METHOD_LABEL[method] + " (per call, fwd+bwd floor)"
    n_txt = (f"{docs[0]}" if len(docs) == 1 else f"{docs[0]}-{docs[-1]}") if docs else "?"
    ax.set(xlabel="C (channels)", ylabel="fraction of copy bandwidth", ylim=(0, 1.05))
    ax.set_title(f"{what}\n{mix} ({n_txt} docs), S={sweep_s}", fontsize=9)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def _w_panel(ax, cur, mix, p_, C):
    """Fraction of copy against W, a line per provider and activation (dashed: none); dotted: 0.97 x ours' W4 SiLU."""
    for prov, act in itertools.product(PROVIDERS, ("silu", "none")):
        pts = sorted((r["width"], r["fraction"]) for r in cur if (r["mix"], r["pass"], r["C"], r["provider"],
                                                                  r["activation"]) == (mix, p_, C, prov, act))
        if pts:
            ax.plot(*zip(*pts), marker="o", ms=3, color=COLORS.get(prov), linestyle="-" if act == "silu" else "--",
                    label=f"{prov} {act}")
    base = [r["fraction"] for r in cur if (r["mix"], r["pass"], r["C"], r["provider"], r["width"], r["activation"])
            == (mix, p_, C, "ours") + BASE_WA]
    if base:
        ax.axhline(0.97 * base[0], color="gray", lw=0.8, ls=":")
    ax.set(xlabel="W (taps)", ylabel="fraction of copy bandwidth", ylim=(0, 1.05))
    ax.set_title(f"{PASS_LABEL[p_]}, {mix}, C={C}", fontsize=9)
    ax.grid(True, alpha=0.3)


def op_plots(rows, sweep_s, env, out_dir, notes, stem, target_steps) -> list[str]:
    """[<stem>.png]: fraction of copy against C at S = sweep_s, W = 4 + SiLU (or the first), a row per mix, a panel
    per GPU-time pass and eager form; with several widths against W, a row per mix, a panel per pass and C."""
    sel = [r for r in rows if r["S"] == sweep_s and r["method"] in ("gpu", "eager", "eager_step")]
    if not sel:
        notes.append(f"plot skipped: no GPU-time or eager rows at S={sweep_s}")
    plt = pyplot(notes) if sel else None
    if plt is None:
        return []
    was, title = _was(sel, sort=False), f"{env['gpu']}, copy {env['copy_gbs']:.0f} GB/s, {env['date']}"
    if len({w for w, _ in was}) > 1:
        gpu = [r for r in sel if r["method"] == "gpu"]
        mixes, cols = list(dict.fromkeys(r["mix"] for r in gpu)), list(itertools.product(
            _in(gpu, "pass", PASSES), sorted({r["C"] for r in gpu})))
        fig, axes = plt.subplots(len(mixes), len(cols), figsize=(4.2 * len(cols), 3.6 * len(mixes)), squeeze=False)
        for (i, mix), (j, (p_, C)) in itertools.product(enumerate(mixes), enumerate(cols)):
            _w_panel(axes[i][j], gpu, mix, p_, C)
        axes[0][0].legend(fontsize=6)
        title += f", S={sweep_s}"
    else:
        cur = [r for r in sel if (r["width"], r["activation"]) == (BASE_WA if BASE_WA in was else was[0])]
        mixes = list(dict.fromkeys(r["mix"] for r in cur))
        cols = [("gpu", p) for p in _in([r for r in cur if r["method"] == "gpu"], "pass", PASSES)]
        cols += [(m, "fwdbwd") for m in _in(cur, "method", ("eager", "eager_step"))]
        fig, axes = plt.subplots(len(mixes), len(cols), figsize=(5.0 * len(cols), 3.9 * len(mixes)), squeeze=False)
        for (i, mix), (j, (method, p_)) in itertools.product(enumerate(mixes), enumerate(cols)):
            _c_panel(axes[i][j], cur, mix, method, p_, sweep_s, target_steps)
        title += f"; {wa_text(cur[0]['width'], cur[0]['activation'])}" if len(was) > 1 else ""
    fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.3 / (3.9 * len(mixes))))
    path = os.path.join(out_dir, stem + ".png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]
