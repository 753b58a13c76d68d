"""The first training step from a cold start: cakeconv beside flash-linear-attention and Dao's causal-conv1d.

Each row (a library) runs in a fresh process (``python -m benchmarks.first_step --child``, cwd the repository root)
on its own empty ``TRITON_CACHE_DIR``, then in a second one on the now warm cache, and in a last one on that cache
whose torch ran its own first backward before the library's first call (torch's lazy imports, seconds, are every
library's: what is left is the library's); the parent imports no torch. An untimed process first imports torch and
every library and starts CUDA: whichever row came first paid the OS's first reads of their files (one H100 host)."""

from __future__ import annotations

import time

SCRIPT_START = time.time()  # the first line a process of this module runs: before torch is imported

import argparse  # noqa: E402
import cProfile  # noqa: E402
import functools  # noqa: E402
import os  # noqa: E402
import pstats  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

from benchmarks.report import (REPO_ROOT, cell, choices, ended, option_parser, package_version,  # noqa: E402
                               run_child, run_stamp, stamped, write_json, write_result_files)

LIBRARIES = ("cakeconv", "cakeconv_no_quick", "cakeconv_one_thread", "cakeconv_after_warmup", "fla", "dao", "dao_det")
DOC_EDGES = (0.0, 0.10, 0.35, 0.65, 1.0)  # document boundaries, fractions of S
ROW_ENV = {"cakeconv_no_quick": {"CAKECONV_QUICK_KERNELS": "0"},  # the environment of each row's processes
           "cakeconv_one_thread": {"CAKECONV_COMPILE_THREADS": "1"}, "dao": {"CAUSAL_CONV1D_DETERMINISTIC": "0"},
           "dao_det": {"CAUSAL_CONV1D_DETERMINISTIC": "1"}}
progress = functools.partial(stamped, "first step")
WIDTH, STRIDE_FACTOR = 4, 3  # taps; the stride case's x is a slice [:, :C] of [S, 3C]
DRY_SKIP = {**dict.fromkeys(("cakeconv_one_thread", "cakeconv_no_quick"), "the reference backend compiles nothing, in "
                             "any number of threads"), "fla": "FLA's causal_conv1d is Triton and needs a CUDA GPU",
            "cakeconv_after_warmup": "the warm-up compiles for a GPU target (minutes on a CPU)",
            **dict.fromkeys(("dao", "dao_det"), "causal-conv1d is a CUDA extension")}  # dry run: ...
KERNELS = ("first_step", "new_c", "new_stride", "steady")  # the phases whose compiles are counted
FILE_WARMUP = ("import torch, benchmarks.first_step as b\nfor n in {libraries!r}:\n try: b.load_library(n, 'triton')\n"
               " except Exception: pass\n{cuda} and torch.cuda.is_available() and torch.ones(1).cuda()")  # main's first
ROW_FIELDS = (
    "library", "version", "skip", "error", "warmup_s", "warmup_compiled", "warmup_cache_hits", "startup_s", "import_s",
    "inputs_s", "first_call_s", "first_step_s", "new_c_s", "new_stride_s", "steady_ms", "steady_max_ms", "steady_calls",
    *(f"{p}_{k}" for p in KERNELS for k in ("compiled", "cache_hits")), "triton_compile_s", "warm_cache_import_s",
    "warm_cache_first_call_s", "warm_cache_first_step_s", "warm_cache_compiled", "warm_cache_cache_hits", "gpu",
    "kernels_ready_s", "cold_process_s", "warm_process_s", "profile_process_s", "warm_profile", "primed_process_s",
    "primed_torch_backward_s", "primed_first_call_s", "device", "torch", "triton", "date", "commit")
OPTIONS = (  # (name, default, help)
    ("libraries", ",".join(LIBRARIES), "rows, in order (benchmarks/README.md): cakeconv_no_quick sets "
     "CAKECONV_QUICK_KERNELS=0, cakeconv_one_thread CAKECONV_COMPILE_THREADS=1, cakeconv_after_warmup runs python "
     "-m cakeconv warmup first, dao and dao_det CAUSAL_CONV1D_DETERMINISTIC 0 and 1"),
    ("tokens", 32768, "S packed tokens"), ("channels", 512, "C of the first step, the stride case, the steady calls"),
    ("new-channels", 2048, "the new C measured in the same process"),
    ("steady-calls", 20, "fwd+bwd calls after the new shapes (their median and max)"),
    ("warmup-args", "", "more options of python -m cakeconv warmup, e.g. '--jobs 8'"),
    ("profile-top", 25, "a third process on the warm cache profiles its first fwd+bwd (cProfile): the functions "
     "of most cumulative time kept in the row (warm_profile); 0: none"),
    ("process-timeout", 300.0, "seconds per process at most"), ("time-limit", 0.0, "seconds for the whole run"),
    ("out", ".", "folder for NAME.json and NAME_table.txt"), ("name", "first_step", "the result files' NAME"))


def parse_args(argv=None):
    p = option_parser(__doc__, OPTIONS, ("child", "phase", "child-out"))  # a measured process: library, cache, file
    p.add_argument("--dry-run", action="store_true", help="on the CPU: S = 2048, 5 steady calls, the cakeconv row on "
                   "the reference backend, the other rows skipped")
    p.add_argument("--spawn-time", type=float, help=argparse.SUPPRESS)  # the parent's clock at the start
    args = p.parse_args(argv)
    if args.dry_run:
        args.tokens, args.steady_calls = 2048, 5
    args.libraries = choices(args.libraries, LIBRARIES, "libraries")
    if args.channels % 8 or args.new_channels % 8 or args.channels == args.new_channels:
        p.error("--channels and --new-channels must be two different multiples of 8")
    return args


class CompileCounter:
    """Triton's compiles, (cache_hit, seconds) each, as ``triton.knobs.compilation.listener`` (once imported)."""

    def __init__(self):
        self.events, self.attached = [], False
        self.mark()

    def __call__(self, *, src, metadata, metadata_group, times, cache_hit):
        self.events.append((bool(cache_hit), times.total / 1e6 if times is not None else 0.0))

    def mark(self) -> int:
        if not self.attached and "triton" in sys.modules:
            from triton import knobs
            knobs.compilation.listener, self.attached = self, True
        return len(self.events)

    def since(self, mark: int) -> tuple[int, int]:
        """(compiled, loaded from the disk cache) since event ``mark``."""
        hits = sum(hit for hit, _ in self.events[mark:])
        return len(self.events) - mark - hits, hits

    def compile_seconds(self) -> float:
        return sum(s for hit, s in self.events if not hit)


def load_library(name: str, backend: str):
    """(version, prepare(inputs), op(inputs) -> y [S, C]): cakeconv on x [S, C]; FLA on [1, S, C] with chunk_indices
    made with the inputs (as its layers do per batch); Dao on the channel-last [1, C, S] view with seq_idx."""
    import torch
    if name.startswith("cakeconv"):
        import cakeconv
        return cakeconv.__version__, (lambda d: None), lambda d: cakeconv.cake_causal_conv1d_det(
            d["x"], d["w"], cu_seqlens=d["cu"], activation="silu", backend=backend)
    if name == "fla":
        os.environ["FLA_GLUON"] = "0"  # its Triton path
        from fla.modules.causal_conv1d import causal_conv1d as fla_conv
        from fla.ops.utils import prepare_chunk_indices
        prepare = lambda d: d.update(chunk_indices=prepare_chunk_indices(d["cu"], 64))  # noqa: E731
        return package_version("fla", "fla-core"), prepare, (
            lambda d: fla_conv(x=d["x"].unsqueeze(0), weight=d["w"], bias=None, activation="silu",
                               backend="triton", cu_seqlens=d["cu"], chunk_indices=d["chunk_indices"])[0][0])
    from causal_conv1d import causal_conv1d_fn

    def prepare(d):
        lengths = (d["cu"][1:] - d["cu"][:-1]).long()
        ids = torch.arange(len(lengths), dtype=torch.int32, device=d["cu"].device)
        d["seq_idx"] = torch.repeat_interleave(ids, lengths).view(1, -1).contiguous()
    return package_version("causal_conv1d", "causal-conv1d"), prepare, lambda d: (
        causal_conv1d_fn(d["x"].unsqueeze(0).transpose(1, 2), d["w"], None, seq_idx=d["seq_idx"], activation="silu")
        .transpose(1, 2).squeeze(0))


def make_inputs(S: int, C: int, device, prepare, row_stride: int | None = None) -> dict:
    """Seeded x bf16 [S, C] (a slice of [S, row_stride]), taps fp32 [C, W], dy bf16 [S, C], cu_seqlens int32."""
    import torch
    gen = torch.Generator(device=device).manual_seed(C)
    wide = torch.randn(S, row_stride or C, generator=gen, device=device, dtype=torch.bfloat16)
    d = {"x": wide[:, :C].requires_grad_(True),
         "w": (0.5 * torch.randn(C, WIDTH, generator=gen, device=device)).requires_grad_(True),
         "dy": torch.randn(S, C, generator=gen, device=device, dtype=torch.bfloat16),
         "cu": torch.tensor([round(f * S) for f in DOC_EDGES], dtype=torch.int32, device=device)}
    prepare(d)
    return d


def fwd_bwd(op, d, sync) -> float:
    """One fwd+bwd (gradients set to None first), synchronised: its wall seconds."""
    t0 = time.perf_counter()
    d["x"].grad = d["w"].grad = None
    op(d).backward(d["dy"])
    sync()
    return time.perf_counter() - t0


def child_main(args) -> None:
    """A measured process, cold (every measure), warm (the first step), profile or primed (the first call);
    --child-out is rewritten after each measure."""
    out = {"library": args.child, "phase": args.phase, "startup_s": SCRIPT_START - args.spawn_time}
    import torch
    out["torch"] = torch.__version__
    try:
        out["version"], prepare, op = load_library(args.child, "reference" if args.dry_run else "triton")
    except Exception as exc:  # noqa: BLE001 - any import failure: the row is skipped with the reason
        return write_json(args.child_out, {**out, "skip": f"does not import: {type(exc).__name__}: {exc}"})
    out["import_s"] = time.time() - SCRIPT_START
    counter = CompileCounter()
    out["triton"] = sys.modules["triton"].__version__ if counter.attached else None
    t0 = time.perf_counter()
    if not args.dry_run and not torch.cuda.is_available():
        return write_json(args.child_out, {**out, "skip": "no CUDA GPU here (--dry-run is the CPU form)"})
    device = torch.device("cpu" if args.dry_run else "cuda")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    S, C = args.tokens, args.channels
    base = make_inputs(S, C, device, prepare)
    sync()
    out["inputs_s"] = time.perf_counter() - t0  # the CUDA start-up falls here
    if args.phase == "primed":  # warm cache, torch's own first backward (its lazy imports) done before the call
        t = torch.ones(2, device=device, requires_grad=True)
        t0 = time.perf_counter()
        (t * 2).backward(torch.ones_like(t))
        sync()
        out["torch_backward_s"] = time.perf_counter() - t0
    if args.phase == "profile":  # where a warm process's first fwd+bwd spends its time: [cumulative s, own s, calls,
        prof = cProfile.Profile()  # name] of the functions of most cumulative time
        out["first_call_s"] = prof.runcall(fwd_bwd, op, base, sync)
        out["profile_top"] = sorted(([round(ct, 4), round(tt, 4), nc, f"{os.path.basename(f)}:{line}({fn})"] for (
            f, line, fn), (_, nc, tt, ct, _) in pstats.Stats(prof).stats.items()), reverse=True)[:args.profile_top]
    else:
        out["first_call_s"] = fwd_bwd(op, base, sync)
    if args.phase in ("primed", "profile"):
        return write_json(args.child_out, out)
    out["first_step_s"] = time.time() - args.spawn_time
    out["first_step_compiled"], out["first_step_cache_hits"] = counter.since(0)
    out["device"] = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (dry-run)"
    write_json(args.child_out, {**out, "triton_compile_s": counter.compile_seconds()})
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
        except Exception as exc:  # noqa: BLE001 - a case the library refuses: said in the row, the rest measured
            out["error"] = joined(out.get("error"), f"{phase}: {type(exc).__name__}: {str(exc)[:300]}")
        write_json(args.child_out, {**out, "triton_compile_s": counter.compile_seconds()})
    if args.child.startswith("cakeconv"):  # the steady calls run the full kernels: wait for their compile
        from cakeconv.warmup import wait_for_kernels
        wait_for_kernels()
        out["kernels_ready_s"] = time.time() - args.spawn_time
    mark = counter.mark()
    times = [fwd_bwd(op, base, sync) * 1e3 for _ in range(args.steady_calls)]
    out.update(steady_ms=statistics.median(times), steady_max_ms=max(times), steady_calls=len(times))
    out["steady_compiled"], out["steady_cache_hits"] = counter.since(mark)
    write_json(args.child_out, {**out, "triton_compile_s": counter.compile_seconds()})
    progress(f"{args.child}: new C {cell(out.get('new_c_s'), '.3f', 0)} s, new stride "
             f"{cell(out.get('new_stride_s'), '.3f', 0)} s, steady {out['steady_ms']:.3f} ms")
    return None


def joined(*parts) -> str | None:
    return "; ".join(p for p in parts if p) or None


def measure_row(args, library: str, work: str) -> dict:
    """A row on the fresh cache ``work``: the warm-up (cakeconv_after_warmup), the cold process, the warm ones."""
    row, cache = dict.fromkeys(ROW_FIELDS) | {"library": library}, os.path.join(work, "triton_cache")
    variables = {**dict.fromkeys(("CAUSAL_CONV1D_DETERMINISTIC", "CAKECONV_COMPILE_THREADS", "CAKECONV_QUICK_KERNELS")),
                 **ROW_ENV.get(library, {}), "TRITON_CACHE_DIR": cache, "FLA_GLUON": "0"}  # only the row's own
    run = functools.partial(run_child, timeout=args.process_timeout, deadline=args.deadline,  # from the repository root
                            limits="--process-timeout", variables=variables, cwd=REPO_ROOT)
    if library == "cakeconv_after_warmup":
        report = os.path.join(work, "warmup_report.json")
        cmd = [sys.executable, "-m", "cakeconv", "warmup", "--channels", f"{args.channels},{args.new_channels}",
               "--json", report, *args.warmup_args.split()]
        progress(f"cakeconv_after_warmup: {' '.join(cmd[1:])}")
        found, rc, row["warmup_s"] = run(cmd, report)
        if rc != 0 or not found:
            return row | {"error": f"warm-up {ended(rc)}"}
        row.update(warmup_compiled=found.get("compiled"), warmup_cache_hits=found.get("cache_hits"))

    def child(phase):  # a measured process on the row's cache: (what it wrote, its exit status)
        path = os.path.join(work, f"{phase}_measures.json")
        progress(f"{library}: {phase}-cache process, TRITON_CACHE_DIR={cache}")
        cmd = [sys.executable, "-m", "benchmarks.first_step", "--child", library, "--phase", phase, "--child-out",
               path, "--tokens", str(args.tokens), "--channels", str(args.channels), "--new-channels",
               str(args.new_channels), "--steady-calls", str(args.steady_calls)] + ["--dry-run"] * args.dry_run
        cmd += ["--spawn-time", repr(time.time())]
        found, rc, row[f"{phase}_process_s"] = run(cmd, path)
        return found, rc
    cold, rc = child("cold")
    row.update({k: v for k, v in cold.items() if k in ROW_FIELDS and k != "library"})
    if row["skip"]:
        return row
    if rc != 0 or row["steady_ms"] is None:
        row["error"] = joined(row["error"], f"cold process {ended(rc)}")
    if row["first_step_s"] is None:  # the cache may hold nothing yet: no warm-cache process
        return row
    warm, rc = child("warm")
    if args.profile_top > 0 and warm.get("first_step_s") is not None:
        row["warm_profile"] = child("profile")[0].get("profile_top")
        for ct, tt, nc, name in (row["warm_profile"] or [])[:12]:
            progress(f"{library}: warm first call, cProfile: {ct:8.3f} s cumulative, {tt:8.3f} s own, {nc:>6} {name}")
    primed = child("primed")[0]  # the library's own part of a warm first call
    row.update(primed_torch_backward_s=primed.get("torch_backward_s"), primed_first_call_s=primed.get("first_call_s"))
    row.update({f"warm_cache_{k}": warm.get(k) for k in ("import_s", "first_call_s", "first_step_s")})
    row.update({f"warm_cache_{k}": warm.get(f"first_step_{k}") for k in ("compiled", "cache_hits")})
    if rc != 0 or warm.get("first_step_s") is None:
        row["error"] = joined(row["error"], f"warm-cache process {ended(rc)}")
    return row


def table(rows) -> str:
    """One line per row; seconds unless ms; kernels: compiled + loaded from the disk cache."""
    cols = (("warm-up s", 10, ".1f", "warmup_s"), ("import s", 9, ".2f", "import_s"),
            ("1st call s", 11, ".3f", "first_call_s"), ("1st step s", 11, ".2f", "first_step_s"),
            ("kernels", 9, "+", "first_step"), ("new C s", 9, ".3f", "new_c_s"), ("kernels", 9, "+", "new_c"),
            ("stride s", 9, ".3f", "new_stride_s"), ("kernels", 9, "+", "new_stride"),
            ("full kernels s", 15, ".1f", "kernels_ready_s"), ("steady ms", 10, ".3f", "steady_ms"),
            ("max ms", 8, ".2f", "steady_max_ms"), ("warm cache 1st step s", 22, ".2f", "warm_cache_first_step_s"),
            ("kernels", 9, "+", "warm_cache"), ("after torch's 1st bwd s", 24, ".3f", "primed_first_call_s"))
    lines = [f"{'library':<23}" + "".join(f"{h:>{w}}" for h, w, _, _ in cols) + "  version"]
    for r in rows:
        line = f"{r['library']:<23}" + cell(r.get("warmup_s"), ".1f", 10)
        if r.get("first_step_s") is None:
            lines.append(line + "  " + (f"skipped: {r['skip']}" if r.get("skip") else f"failed: {r['error']}")[:200])
            continue
        kernels = {k: f"{r[k + '_compiled']}+{r[k + '_cache_hits']}" for _, _, f, k in cols
                   if f == "+" and r.get(k + "_compiled") is not None}
        lines.append(line + "".join(cell(kernels.get(k) if f == "+" else r.get(k), f, w) for _, w, f, k in cols[1:])
                     + f"  {r.get('version') or '-'}" + (f"  (failed: {r['error']})" if r.get("error") else ""))
    return "\n".join(lines)


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.child:
        child_main(args)
        return {}
    args.deadline = time.perf_counter() + args.time_limit if args.time_limit > 0 else float("inf")
    with tempfile.TemporaryDirectory(prefix="first_step_files_", ignore_cleanup_errors=True) as work:
        cmd = [sys.executable, "-c", FILE_WARMUP.format(cuda=not args.dry_run, libraries=[
            n for n in args.libraries if not args.dry_run or n not in DRY_SKIP])]  # the rows that run
        _, rc, args.file_warmup_s = run_child(cmd, os.path.join(work, "none"), args.process_timeout, args.deadline,
                                              "--process-timeout", {"TRITON_CACHE_DIR": work}, REPO_ROOT)
    progress(f"imports and CUDA read once, untimed: {ended(rc)} in {cell(args.file_warmup_s, '.1f', 0)} s")
    rows = []
    for library in args.libraries:
        if args.dry_run and library in DRY_SKIP:
            rows.append(dict.fromkeys(ROW_FIELDS) | {"library": library, "skip": "dry run: " + DRY_SKIP[library]})
        else:
            with tempfile.TemporaryDirectory(prefix=f"first_step_{library}_", ignore_cleanup_errors=True) as work:
                rows.append(measure_row(args, library, work))  # work: the row's Triton cache, its processes' files
        progress(f"{library}: done ({rows[-1]['skip'] or rows[-1]['error'] or 'measured'})")
    seen = next((r for r in rows if r.get("torch")), {})  # the GPU and versions as the measured processes saw them
    env = {**run_stamp(), "gpu": seen.get("device"), "torch": seen.get("torch"),
           "triton": next((r["triton"] for r in rows if r.get("triton")), None)}
    for r in rows:
        r.update(gpu=env["gpu"], torch=r["torch"] or env["torch"], triton=r["triton"] or env["triton"],
                 date=env["date"], commit=env["commit"])
    config = {"tokens": args.tokens, "channels": args.channels, "new_channels": args.new_channels,
              "row_stride_of_stride_case": STRIDE_FACTOR * args.channels, "doc_edges": list(DOC_EDGES), "width": WIDTH,
              "activation": "silu", "x_dtype": "bfloat16", "taps_dtype": "float32", "bias": False,
              **{k: getattr(args, k) for k in ("steady_calls", "libraries", "warmup_args", "process_timeout",
                                               "time_limit", "dry_run", "file_warmup_s")}}
    title = (f"First fwd+bwd from a cold start: S = {args.tokens} packed bf16 tokens in {len(DOC_EDGES) - 1} "
             f"documents, C = {args.channels} (new C {args.new_channels}; stride case: row stride "
             f"{STRIDE_FACTOR * args.channels}), W = {WIDTH}, SiLU, fp32 taps; one fresh process and empty Triton "
             f"cache per library; GPU: {env['gpu']}; torch {env['torch']}, triton {env['triton']}; {env['date']}")
    result = {"env": env, "config": config, "rows": rows}
    write_result_files(args.out, args.name, result, title + "\n" + table(rows))
    return result


if __name__ == "__main__":
    main()
