#!/usr/bin/env python3
"""The first training step from a cold start: cakeconv beside flash-linear-attention and Dao's causal-conv1d.

What a fresh container, CI job or test process pays before its first result. Every library (a row) runs
in its own fresh Python process, with its own fresh, empty ``TRITON_CACHE_DIR`` (a temporary folder,
removed after the row), one row after the other, nothing else running on the GPU. Rows (``--libraries``):

- ``cakeconv``: ``cakeconv.cake_causal_conv1d_det`` on x [S, C] with ``cu_seqlens``;
- ``cakeconv_after_warmup``: first ``python -m cakeconv warmup --channels 512,2048`` into the fresh
  cache (its wall time: ``warmup_s``; the number of kernels it compiled: ``warmup_compiled``), then
  the same as ``cakeconv``;
- ``fla``: flash-linear-attention's Triton ``causal_conv1d`` (``fla.modules.causal_conv1d``,
  ``FLA_GLUON=0``, ``backend="triton"``) on [1, S, C] with ``cu_seqlens`` (its ``chunk_indices``,
  which its layers compute once per batch, computed with the inputs, outside the timed call; fla
  imports causal-conv1d when that is installed, as it is on the GPU machine);
- ``dao``: Dao-AILab's ``causal_conv1d_fn`` (causal-conv1d) on the channel-last [1, C, S] view with
  ``seq_idx`` (int32, the document of each token), ``CAUSAL_CONV1D_DETERMINISTIC=0``;
- ``dao_det``: the same with ``CAUSAL_CONV1D_DETERMINISTIC=1`` (its deterministic weight gradient).

A library that does not import is a row with the reason (``skip``).

The problem: S = 32,768 packed bf16 tokens (``--tokens``) in 4 documents (10 %, 25 %, 30 %, 35 % of S),
C = 512 (``--channels``), taps fp32 [C, 4], no bias, SiLU. One fwd+bwd is: the gradients of x and the
taps set to None, y = the library's op, ``y.backward(dy)`` with a fixed random dy, then
``torch.cuda.synchronize()``.

The cold process measures, in order (wall clock):

- ``startup_s``: from the parent's clock reading just before it starts the process (``time.time()``,
  the same clock in both) to the first line of this script (the interpreter's start-up);
- ``import_s``: from that first line, before ``import torch``, to the end of the library's import;
- ``inputs_s``: from the end of the imports to the inputs built on the device and synchronised (the
  CUDA start-up, driver and context, falls here);
- ``first_call_s``: the first fwd+bwd call alone (Triton's compiles and autotuning fall here);
- ``first_step_s``: from the parent's clock reading (process start) to the end of that first call,
  i.e. startup + imports + inputs + first call;
- ``new_c_s``: the first fwd+bwd at a new C (2048, ``--new-channels``), its inputs built first;
- ``new_stride_s``: the first fwd+bwd with x a slice ``wide[:, :C]`` of a wider tensor [S, 3C] (row
  stride 3C != C, as the q/k/v split of one projection gives), C = 512;
- ``steady_ms`` (``steady_max_ms``): the median (the largest) of ``--steady-calls`` (20) more
  fwd+bwd at C = 512, each synchronised.

Then a second fresh process on the same, now warm, cache runs the imports, the inputs and the first
fwd+bwd at C = 512 only: ``warm_cache_first_step_s`` (from its process start, as above),
``warm_cache_first_call_s``.

Triton's compiles are counted in every process with ``triton.knobs.compilation.listener``, installed
once Triton is imported (by the library's import, before any launch; a process that never imports
Triton, as Dao's need not, compiles nothing and counts 0): per phase, kernels compiled (``cache_hit``
False) and loaded from the disk cache (True), and the seconds Triton reports for the compiles
(``triton_compile_s``). Python's bytecode caches are kept (an installed package has them); the CUDA
driver's caches are not involved (Triton loads cubins).

A new C or stride that the library refuses is said in the row's ``error``, and the other measures are
still taken. Each process runs at most ``--process-timeout`` seconds and the whole run at most
``--time-limit`` (0: none; a process gets what is left): the JSON and the table are always written, a
row cut short says why, and a row whose cold process got through its first step still gets its
warm-cache process.

Output: ``NAME.json`` (the run's date, commit, GPU, torch, triton, Python; per row: the measures, the
library's version, and again the GPU, versions, date and commit) and ``NAME_table.txt``; the table is
printed last. The processes' progress goes to stderr.

Usage:
    python benchmarks/bench_first_step.py --out results_dir --name h200_first_step     # one GPU
    python benchmarks/bench_first_step.py --dry-run --out /tmp/first                   # CPU, tiny S (tests)

The dry run (CPU): S = 2,048, 5 steady calls, the ``cakeconv`` row on the reference backend (no
Triton compile), the other rows skipped with the reason; it tests the processes, the caches, the JSON
and the table.

Shape legend: S tokens, C channels, W taps.
"""

from __future__ import annotations

import time

SCRIPT_START = time.time()  # the first line a process of this script runs: before torch is imported

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
if BENCH_DIR not in sys.path:
    sys.path.insert(0, BENCH_DIR)

from environment import REPO_ROOT, git_commit  # noqa: E402  (standard library only: no torch here)
from report_rows import write_json, write_result_files  # noqa: E402  (no torch either)

STEM = "bench_first_step"
LIBRARIES = ("cakeconv", "cakeconv_after_warmup", "fla", "dao", "dao_det")
DOC_EDGES = (0.0, 0.10, 0.35, 0.65, 1.0)  # document boundaries, fractions of S
WIDTH = 4
STRIDE_FACTOR = 3  # the wide tensor of the stride case: [S, 3C]
DRY_SKIP = {
    "cakeconv_after_warmup": "dry run: the warm-up compiles for a GPU target (minutes on a CPU)",
    "fla": "dry run: FLA's causal_conv1d is Triton and needs a CUDA GPU",
    "dao": "dry run: causal-conv1d is a CUDA extension",
    "dao_det": "dry run: causal-conv1d is a CUDA extension",
}
PHASES = ("first_step", "new_c", "new_stride", "steady")
ROW_FIELDS = (
    "library", "version", "skip", "error", "warmup_s", "warmup_compiled", "warmup_cache_hits",
    "startup_s", "import_s", "inputs_s", "first_call_s", "first_step_s", "new_c_s", "new_stride_s",
    "steady_ms", "steady_max_ms", "steady_calls",
    *(f"{p}_{k}" for p in PHASES for k in ("compiled", "cache_hits")), "triton_compile_s",
    "warm_cache_import_s", "warm_cache_first_call_s", "warm_cache_first_step_s", "warm_cache_compiled",
    "warm_cache_cache_hits", "cold_process_s", "warm_process_s", "device", "gpu", "torch", "triton",
    "date", "commit",
)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--libraries", default=",".join(LIBRARIES), help="rows, a comma list of " + ", ".join(LIBRARIES))
    p.add_argument("--tokens", type=int, default=32768, help="S packed tokens")
    p.add_argument("--channels", type=int, default=512, help="C of the first step, the stride case, the steady calls")
    p.add_argument("--new-channels", type=int, default=2048, help="the new C of the same process")
    p.add_argument("--steady-calls", type=int, default=20)
    p.add_argument("--warmup-args", default="", help="more options of python -m cakeconv warmup (e.g. '--jobs 8')")
    p.add_argument("--process-timeout", type=float, default=300.0, help="seconds per process at most")
    p.add_argument("--time-limit", type=float, default=0.0,
                   help="seconds for the whole run (0: none): a process gets what is left; the JSON is always written")
    p.add_argument("--keep-caches", action="store_true", help="keep each row's Triton cache folder (printed)")
    p.add_argument("--dry-run", action="store_true", help="CPU, S = 2048, the cakeconv row on the reference backend")
    p.add_argument("--out", default=".", help="folder for NAME.json and NAME_table.txt")
    p.add_argument("--name", default=STEM)
    p.add_argument("--child", help=argparse.SUPPRESS)        # internal: the library this process measures
    p.add_argument("--phase", help=argparse.SUPPRESS)        # internal: cold (every measure) or warm (first step)
    p.add_argument("--spawn-time", type=float, help=argparse.SUPPRESS)  # internal: the parent's clock at the start
    p.add_argument("--child-out", help=argparse.SUPPRESS)    # internal: where the process writes its measures
    args = p.parse_args(argv)
    if args.dry_run:
        args.tokens, args.steady_calls = 2048, 5
    args.libraries = [s.strip() for s in args.libraries.split(",") if s.strip()]
    unknown = [lib for lib in args.libraries if lib not in LIBRARIES]
    if unknown:
        p.error(f"unknown libraries {unknown}: use {', '.join(LIBRARIES)}")
    if args.channels % 8 or args.new_channels % 8 or args.channels == args.new_channels:
        p.error("--channels and --new-channels must be two different multiples of 8")
    return args


def progress(text: str) -> None:
    print(f"[first step {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------- the measured process

class CompileCounter:
    """Triton's compiles seen by ``knobs.compilation.listener``: (cache_hit, seconds) per event.

    ``attach`` installs the listener once Triton is imported (every Triton compile needs it imported:
    a process that never imports Triton compiles nothing, and its counts stay 0)."""

    def __init__(self):
        self.events = []
        self.attached = False

    def attach(self) -> None:
        if not self.attached and "triton" in sys.modules:
            from triton import knobs

            knobs.compilation.listener = self
            self.attached = True

    def __call__(self, *, src, metadata, metadata_group, times, cache_hit):
        self.events.append((bool(cache_hit), times.total / 1e6 if times is not None else 0.0))

    def mark(self) -> int:
        self.attach()
        return len(self.events)

    def since(self, mark: int) -> tuple[int, int]:
        """(compiled, loaded from the cache) since ``mark``."""
        new = self.events[mark:]
        hits = sum(hit for hit, _ in new)
        return len(new) - hits, hits

    def compile_seconds(self) -> float:
        return sum(s for hit, s in self.events if not hit)


def load_library(name: str, backend: str):
    """(version, prepare(inputs), op(inputs) -> y [S, C]) of a row's library; ImportError when it
    does not import."""
    import torch

    if name.startswith("cakeconv"):
        import cakeconv

        def op(d):
            return cakeconv.cake_causal_conv1d_det(d["x"], d["w"], cu_seqlens=d["cu"], activation="silu",
                                                   backend=backend)

        return cakeconv.__version__, (lambda d: None), op
    if name == "fla":
        os.environ["FLA_GLUON"] = "0"  # its Triton path (benchmarks/providers.py)
        from fla.modules.causal_conv1d import causal_conv1d
        from fla.ops.utils import prepare_chunk_indices

        def prepare(d):
            d["chunk_indices"] = prepare_chunk_indices(d["cu"], 64)

        def op(d):
            y, _ = causal_conv1d(x=d["x"].unsqueeze(0), weight=d["w"], bias=None, activation="silu",
                                 backend="triton", cu_seqlens=d["cu"], chunk_indices=d["chunk_indices"])
            return y.squeeze(0)

        return distribution_version("fla-core", "fla"), prepare, op
    import causal_conv1d
    from causal_conv1d import causal_conv1d_fn

    def prepare(d):
        lengths = (d["cu"][1:] - d["cu"][:-1]).long()
        ids = torch.arange(len(lengths), dtype=torch.int32, device=d["cu"].device)
        d["seq_idx"] = torch.repeat_interleave(ids, lengths).view(1, -1).contiguous()

    def op(d):
        x_cl = d["x"].unsqueeze(0).transpose(1, 2)  # [1, C, S], channel stride 1
        return causal_conv1d_fn(x_cl, d["w"], None, seq_idx=d["seq_idx"], activation="silu").transpose(1, 2).squeeze(0)

    return getattr(causal_conv1d, "__version__", None) or distribution_version("causal-conv1d"), prepare, op


def distribution_version(name: str, module: str | None = None) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return getattr(sys.modules.get(module or ""), "__version__", None)


def make_inputs(S: int, C: int, device, prepare, row_stride: int | None = None) -> dict:
    """x bf16 [S, C] (a slice of a [S, row_stride] tensor when given), taps fp32 [C, W], dy bf16
    [S, C], cu_seqlens int32 of DOC_EDGES, all seeded; then the library's own per-batch set-up."""
    import torch

    gen = torch.Generator(device=device).manual_seed(C)
    wide = torch.randn(S, row_stride or C, generator=gen, device=device, dtype=torch.bfloat16)
    x = wide[:, :C].requires_grad_(True)
    w = (0.5 * torch.randn(C, WIDTH, generator=gen, device=device)).requires_grad_(True)
    dy = torch.randn(S, C, generator=gen, device=device, dtype=torch.bfloat16)
    cu = torch.tensor([round(f * S) for f in DOC_EDGES], dtype=torch.int32, device=device)
    d = {"x": x, "w": w, "dy": dy, "cu": cu}
    prepare(d)
    return d


def fwd_bwd(op, d, sync) -> float:
    """One fwd+bwd (gradients set to None first), synchronised; its wall seconds."""
    t0 = time.perf_counter()
    d["x"].grad = None
    d["w"].grad = None
    op(d).backward(d["dy"])
    sync()
    return time.perf_counter() - t0


def child_imports(args, out: dict):
    """torch and the library, timed from this script's first line; the compile listener installed when
    Triton was imported. Returns (torch, prepare, op, counter) or None (the row's skip reason in out)."""
    import torch

    out.update(torch=torch.__version__)
    try:
        out["version"], prepare, op = load_library(args.child, "reference" if args.dry_run else "triton")
    except Exception as exc:  # noqa: BLE001 - any import failure: the row is skipped with the reason
        out["skip"] = f"does not import: {type(exc).__name__}: {exc}"
        return None
    out["import_s"] = time.time() - SCRIPT_START
    counter = CompileCounter()
    counter.attach()
    if counter.attached:
        out["triton"] = sys.modules["triton"].__version__
    return torch, prepare, op, counter


def child_main(args) -> None:
    """The measured process: the cold phase (every measure) or the warm phase (the first step only).
    What it measured is rewritten to --child-out after each phase, so a process cut short keeps it."""
    out = {"library": args.child, "phase": args.phase, "startup_s": SCRIPT_START - args.spawn_time}
    loaded = child_imports(args, out)
    if loaded is None:
        return write_json(args.child_out, out)
    torch, prepare, op, counter = loaded
    t0 = time.perf_counter()
    if not args.dry_run and not torch.cuda.is_available():
        out["skip"] = "no CUDA GPU here (--dry-run is the CPU form)"
        return write_json(args.child_out, out)
    device = torch.device("cpu" if args.dry_run else "cuda")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    S, C = args.tokens, args.channels
    base = make_inputs(S, C, device, prepare)
    sync()
    out["inputs_s"] = time.perf_counter() - t0  # the CUDA start-up falls here
    out["first_call_s"] = fwd_bwd(op, base, sync)
    out["first_step_s"] = time.time() - args.spawn_time
    out["first_step_compiled"], out["first_step_cache_hits"] = counter.since(0)
    out["triton_compile_s"] = counter.compile_seconds()
    out["device"] = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (dry-run)"
    write_json(args.child_out, out)
    progress(f"{args.child} ({args.phase} cache): first step {out['first_step_s']:.2f} s "
             f"(first call {out['first_call_s']:.2f} s, {out['first_step_compiled']} kernels compiled)")
    if args.phase == "warm":
        return None

    for phase, (c, stride) in (("new_c", (args.new_channels, None)), ("new_stride", (C, STRIDE_FACTOR * C))):
        try:
            d = make_inputs(S, c, device, prepare, row_stride=stride)
            sync()
            mark = counter.mark()
            out[f"{phase}_s"] = fwd_bwd(op, d, sync)
            out[f"{phase}_compiled"], out[f"{phase}_cache_hits"] = counter.since(mark)
            del d
        except Exception as exc:  # noqa: BLE001 - a case the library refuses: said in the row, the rest measured
            out["error"] = joined(out.get("error"), f"{phase}: {type(exc).__name__}: {str(exc)[:300]}")
        write_json(args.child_out, {**out, "triton_compile_s": counter.compile_seconds()})
    mark = counter.mark()
    times = [fwd_bwd(op, base, sync) * 1e3 for _ in range(args.steady_calls)]
    out.update(steady_ms=statistics.median(times), steady_max_ms=max(times), steady_calls=len(times))
    out["steady_compiled"], out["steady_cache_hits"] = counter.since(mark)
    out["triton_compile_s"] = counter.compile_seconds()
    write_json(args.child_out, out)
    progress(f"{args.child}: new C {_num(out.get('new_c_s'), '.3f', 0)} s, new stride "
             f"{_num(out.get('new_stride_s'), '.3f', 0)} s, steady {out['steady_ms']:.3f} ms")
    return None


# ---------------------------------------------------------------------------------- the parent

def run_process(cmd, env, timeout: float) -> tuple[object, float]:
    """cmd in its own process group, its output on this process's stderr, at most ``timeout`` seconds
    (then the group is killed: Triton's and the warm-up's own child processes with it). Returns (the
    exit status, or why it ended, and the wall seconds)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=REPO_ROOT, stdout=_stderr_fd(), start_new_session=True)
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        rc = f"killed after {timeout:.1f} s (--process-timeout, --time-limit)"
    return rc, time.perf_counter() - t0


def _stderr_fd():
    """The processes' output goes to this process's stderr, so that stdout ends with the table."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return None


def child_env(library: str, work: str) -> dict:
    env = dict(os.environ, TRITON_CACHE_DIR=os.path.join(work, "triton_cache"), FLA_GLUON="0",
               PYTHONPATH=os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH")) if p))
    env.pop("CAUSAL_CONV1D_DETERMINISTIC", None)
    if library in ("dao", "dao_det"):
        env["CAUSAL_CONV1D_DETERMINISTIC"] = "1" if library == "dao_det" else "0"
    return env


class Budget:
    """What is left of --time-limit; each process gets at most --process-timeout of it."""

    def __init__(self, args):
        self.args = args
        self.deadline = time.perf_counter() + args.time_limit if args.time_limit > 0 else float("inf")

    def next_timeout(self) -> float | None:
        """Seconds for the next process, None when less than 10 s of --time-limit are left."""
        left = self.deadline - time.perf_counter()
        return None if left < 10 else min(self.args.process_timeout, left)


def run_child(args, library: str, phase: str, work: str, budget: Budget) -> tuple[dict, object, float]:
    """One measured process on the row's cache; (what it wrote, its exit status, its wall seconds)."""
    timeout = budget.next_timeout()
    if timeout is None:
        return {}, "not started: --time-limit spent", 0.0
    path = os.path.join(work, f"{phase}_measures.json")
    cmd = [sys.executable, os.path.abspath(__file__), "--child", library, "--phase", phase, "--child-out", path,
           "--tokens", str(args.tokens), "--channels", str(args.channels), "--new-channels", str(args.new_channels),
           "--steady-calls", str(args.steady_calls)] + (["--dry-run"] if args.dry_run else [])
    env = child_env(library, work)
    progress(f"{library}: {phase}-cache process, TRITON_CACHE_DIR={env['TRITON_CACHE_DIR']}")
    spawn = time.time()
    rc, seconds = run_process(cmd + ["--spawn-time", repr(spawn)], env, timeout)
    found = {}
    if os.path.exists(path):
        with open(path) as f:
            found = json.load(f)
        os.remove(path)
    return found, rc, seconds


def run_warmup(args, work: str, budget: Budget) -> dict:
    """``python -m cakeconv warmup`` into the row's fresh cache: warmup_s and the kernels it compiled."""
    timeout = budget.next_timeout()
    if timeout is None:
        return {"error": "warm-up not started: --time-limit spent"}
    report = os.path.join(work, "warmup_report.json")
    cmd = [sys.executable, "-m", "cakeconv", "warmup", "--channels", f"{args.channels},{args.new_channels}",
           "--json", report, *args.warmup_args.split()]
    progress(f"cakeconv_after_warmup: {' '.join(cmd[1:])}")
    rc, seconds = run_process(cmd, child_env("cakeconv", work), timeout)
    if rc != 0 or not os.path.exists(report):
        return {"warmup_s": seconds, "error": f"warm-up {ended(rc)}"}
    with open(report) as f:
        found = json.load(f)
    os.remove(report)
    return {"warmup_s": seconds, "warmup_compiled": found.get("compiled"), "warmup_cache_hits": found.get("cache_hits")}


def ended(rc) -> str:
    return f"exited with {rc}" if isinstance(rc, int) else str(rc)


def joined(*parts) -> str | None:
    """The non-empty parts joined with "; " (None when there is none)."""
    return "; ".join(p for p in parts if p) or None


def measure_row(args, library: str, budget: Budget) -> dict:
    """A row: a fresh cache, the warm-up (cakeconv_after_warmup), the cold process, the warm process."""
    row = dict.fromkeys(ROW_FIELDS)
    row["library"] = library
    if args.dry_run and library in DRY_SKIP:
        row["skip"] = DRY_SKIP[library]
        return row
    work = tempfile.mkdtemp(prefix=f"first_step_{library}_")  # the row's Triton cache and its processes' files
    try:
        if library == "cakeconv_after_warmup":
            row.update(run_warmup(args, work, budget))
            if row["error"]:
                return row
        cold, rc, row["cold_process_s"] = run_child(args, library, "cold", work, budget)
        row.update({k: v for k, v in cold.items() if k in ROW_FIELDS and k != "library"})
        if row["skip"]:
            return row
        if rc != 0 or row["steady_ms"] is None:
            row["error"] = joined(row["error"], f"cold process {ended(rc)}")
        if row["first_step_s"] is None:  # the cache may hold nothing yet: no warm-cache process
            return row
        warm, rc, row["warm_process_s"] = run_child(args, library, "warm", work, budget)
        for key in ("import_s", "first_call_s", "first_step_s"):
            row[f"warm_cache_{key}"] = warm.get(key)
        row["warm_cache_compiled"] = warm.get("first_step_compiled")
        row["warm_cache_cache_hits"] = warm.get("first_step_cache_hits")
        if rc != 0 or warm.get("first_step_s") is None:
            row["error"] = joined(row["error"], f"warm-cache process {ended(rc)}")
        return row
    finally:
        if args.keep_caches:
            progress(f"{library}: Triton cache kept in {os.path.join(work, 'triton_cache')}")
        else:
            shutil.rmtree(work, ignore_errors=True)


# ------------------------------------------------------------------------------------ reporting

def _num(value, fmt: str, width: int) -> str:
    return f"{value:>{width}{fmt}}" if isinstance(value, (int, float)) else f"{'-':>{width}}"


def _kernels(row, phase: str) -> str:
    compiled, hits = row.get(f"{phase}_compiled"), row.get(f"{phase}_cache_hits")
    return "-" if compiled is None else f"{compiled}+{hits}"


def table(rows) -> str:
    """One line per row; seconds unless ms; kernels: compiled + loaded from the disk cache."""
    head = (f"{'library':<23}{'warm-up s':>10}{'import s':>9}{'1st call s':>11}{'1st step s':>11}{'kernels':>9}"
            f"{'new C s':>9}{'kernels':>9}{'stride s':>9}{'kernels':>9}{'steady ms':>10}{'max ms':>8}"
            f"{'warm cache 1st step s':>22}{'kernels':>9}  version")
    lines = [head]
    for r in rows:
        line = f"{r['library']:<23}"
        if r.get("first_step_s") is None:
            why = f"skipped: {r['skip']}" if r.get("skip") else f"failed: {r.get('error')}"
            lines.append(line + _num(r.get("warmup_s"), ".1f", 10) + "  " + why[:200])
            continue
        lines.append(line + _num(r.get("warmup_s"), ".1f", 10) + _num(r["import_s"], ".2f", 9)
                     + _num(r["first_call_s"], ".3f", 11) + _num(r["first_step_s"], ".2f", 11)
                     + f"{_kernels(r, 'first_step'):>9}" + _num(r.get("new_c_s"), ".3f", 9)
                     + f"{_kernels(r, 'new_c'):>9}" + _num(r.get("new_stride_s"), ".3f", 9)
                     + f"{_kernels(r, 'new_stride'):>9}" + _num(r.get("steady_ms"), ".3f", 10)
                     + _num(r.get("steady_max_ms"), ".2f", 8) + _num(r.get("warm_cache_first_step_s"), ".2f", 22)
                     + f"{_kernels(r, 'warm_cache'):>9}  {r.get('version') or '-'}"
                     + (f"  (failed: {r['error']})" if r.get("error") else ""))
    return "\n".join(lines)


def run_environment(rows) -> dict:
    """The run's date, commit and host; the GPU and versions as the measured processes saw them."""
    seen = next((r for r in rows if r.get("torch")), {})
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return {"date": date, "commit": git_commit(), "gpu": seen.get("device"),
            "torch": seen.get("torch"), "triton": next((r["triton"] for r in rows if r.get("triton")), None),
            "python": platform.python_version(), "host": platform.node(), "cpu_count": os.cpu_count()}


def settings(args) -> dict:
    return {"tokens": args.tokens, "channels": args.channels, "new_channels": args.new_channels,
            "row_stride_of_stride_case": STRIDE_FACTOR * args.channels, "doc_edges": list(DOC_EDGES),
            "width": WIDTH, "activation": "silu", "x_dtype": "bfloat16", "taps_dtype": "float32", "bias": False,
            "steady_calls": args.steady_calls, "libraries": args.libraries, "warmup_args": args.warmup_args,
            "process_timeout": args.process_timeout, "time_limit": args.time_limit, "dry_run": args.dry_run}


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.child:
        child_main(args)
        return {}
    os.makedirs(args.out, exist_ok=True)
    budget = Budget(args)
    rows = []
    for library in args.libraries:
        rows.append(measure_row(args, library, budget))
        progress(f"{library}: done ({rows[-1]['skip'] or rows[-1]['error'] or 'measured'})")
    env = run_environment(rows)
    for r in rows:
        r.update(gpu=env["gpu"], torch=r["torch"] or env["torch"], triton=r["triton"] or env["triton"],
                 date=env["date"], commit=env["commit"])
    result = {"env": env, "config": settings(args), "rows": rows}
    title = (f"First fwd+bwd from a cold start: S = {args.tokens} packed bf16 tokens in {len(DOC_EDGES) - 1} "
             f"documents, C = {args.channels} (new C {args.new_channels}; stride case: row stride "
             f"{STRIDE_FACTOR * args.channels}), W = {WIDTH}, SiLU, fp32 taps; one fresh process and empty Triton "
             f"cache per library; GPU: {env['gpu']}; torch {env['torch']}, triton {env['triton']}; {env['date']}")
    write_result_files(args.out, args.name, result, title + "\n" + table(rows))
    return result


if __name__ == "__main__":
    main()
