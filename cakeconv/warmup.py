"""Compile ahead what a training run needs: ``python -m cakeconv warmup`` and ``warmup()``.

Triton compiles each kernel variant on its first launch, in the launching process, one after the
other, and keeps the result in its on-disk cache (``TRITON_CACHE_DIR``, default
``~/.triton/cache``). A process that finds its kernels there loads them instead of compiling. This
module fills that cache ahead of a run, for the problems a run will meet, with every kernel
compiled in parallel processes, on a GPU machine or without a GPU (given the target, e.g.
``--target sm_90``): a container image built on a CPU machine can hold the cache ready.

The first training step of a problem on a GPU compiles the same set itself, in threads
(``compile_ahead.py``): quick twins of the forward and backward kernels first (the same bits, a
compile several times shorter), which the first steps run while the full kernels compile in the
background (``wait_for_kernels`` waits for those); this warm-up is for compiling before any GPU
work: in a container image, on a CPU machine, or for the layouts that path does not cover
(``mamba_ssm_row_stride``). A run whose kernels it compiled runs the full ones from its first step.

What a problem needs. A problem is (C, x dtype, taps dtype, bias or not, width W, activation).
Its training step launches the forward kernel, the backward kernels (one group of the dweight tree
below 8,193 rows, else the main and the group kernel), and with many short documents their
per-token segment-index variants and the index build; packed documents (``cu_seqlens``, int32 or
int64: each a variant) and ``[B, T, C]`` batches (no ``cu_seqlens``) are variants too. ``warmup``
runs the public op forward and backward on CPU tensors of each kind, recording the launches
without running them (the library's own launch records, as its tests use), derives each launch's
specialization with Triton's binder for the target, and compiles the distinct ones. The
convolution of mamba_ssm's fused paths (x and dx slices of the layer's projection, through
``cakeconv.integrations.mamba_ssm``) is a problem of its own (``mamba_ssm_row_stride``, the
projection's width). Other row strides and the context-parallel (KCP) row and halo kernels are not
covered: they compile on first use.

The cache key is Triton's own (the kernel's source, the specialization, the options, the target,
the Triton and ptxas versions, the environment variables that change code), so a run finds the
entries only with the same Triton version and the same code-changing ``TRITON_*`` variables as
the warm-up, and the same Python version: the key hashes Triton's compiled library, which each
Python version's Triton wheel builds anew (a cache filled under Python 3.11 missed every entry
under 3.12 with the same Triton 3.6.0; the repository's ``tools/cache_for_host.py`` compiles under
another Python version's key, given that version's wheel of the same Triton release). Triton
records its cached files by absolute path, so the cache folder must also sit at the same path
where it is read (``TRITON_CACHE_DIR``).

Shape legend: S tokens, C channels, B batch rows, T tokens per row, W taps.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

import torch

__all__ = ["warmup", "WarmupProblem", "problem_specializations", "wait_for_kernels"]

_DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
           "fp32": torch.float32, "float32": torch.float32}
ONE_GROUP_S = 4096        # one group of the dweight tree (a group is 8,192 rows at every width)
MULTI_GROUP_S = 8320      # two groups: the main and the group kernels
SHORT_DOC = 4             # tokens per document of the many-documents case (the segment-index variants)


@dataclasses.dataclass(frozen=True)
class WarmupProblem:
    """One convolution a run trains: channels, dtypes, bias, width, activation, cu_seqlens dtype,
    and how it is called.

    ``mamba_ssm_row_stride``: None (the default) for the op on contiguous rows (``[S, C]`` packed or
    ``[B, T, C]``, autograd or the entry points); an int for the convolution of mamba_ssm's fused
    paths as ``cakeconv.integrations.mamba_ssm.swap()`` runs it: causal-conv1d's pair
    (``causal_conv1d_fwd_function`` / ``causal_conv1d_bwd_function``) on x and dx whose rows are
    that many elements apart (a slice of the layer's in_proj output and of its gradient: Mamba2's
    ``d_in_proj``), with ``seq_idx`` or batch rows (``cu_dtype`` is not used then).
    """

    C: int
    dtype: torch.dtype = torch.bfloat16
    weight_dtype: torch.dtype = torch.float32
    bias: bool = False
    width: int = 4
    activation: str | None = "silu"
    cu_dtype: torch.dtype = torch.int32
    mamba_ssm_row_stride: int | None = None

    def __post_init__(self):
        from .cake_causal_conv1d_det_train_backend import checks

        if isinstance(self.C, bool) or not isinstance(self.C, int) or self.C <= 0 or self.C % 8:
            raise ValueError(f"C must be a positive multiple of 8, got C={self.C!r}")
        checks.check_width(self.width)
        checks.check_activation(self.activation)
        for name, value, allowed in (("dtype", self.dtype, checks.X_DTYPES), ("weight_dtype", self.weight_dtype,
                                     checks.W_DTYPES), ("cu_dtype", self.cu_dtype, (torch.int32, torch.int64))):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {name}={value!r}")
        stride = self.mamba_ssm_row_stride
        if stride is not None and (isinstance(stride, bool) or not isinstance(stride, int) or stride < self.C
                                   or stride % 8):
            raise ValueError(f"mamba_ssm_row_stride must be None or a multiple of 8 of at least C = {self.C}, "
                             f"got mamba_ssm_row_stride={stride!r}")

    def __str__(self) -> str:
        name = lambda d: str(d).replace("torch.", "")  # noqa: E731
        how = (f"cu={name(self.cu_dtype)}" if self.mamba_ssm_row_stride is None
               else f"mamba_ssm rows {self.mamba_ssm_row_stride} apart")
        return (f"C={self.C} x={name(self.dtype)} w={name(self.weight_dtype)} bias={'yes' if self.bias else 'no'} "
                f"W={self.width} act={self.activation} {how}")


def regime_tokens(S: int) -> tuple:
    """The representative token count of S's regime: ``(ONE_GROUP_S,)`` where the backward's dweight tree
    has one group (S <= 8,192: the one-group kernel), else ``(MULTI_GROUP_S,)`` (the main and the group
    kernel). Packed calls launch the same variants at every S of a regime."""
    from .cake_causal_conv1d_det_train_backend.kernels.backward import BWD_SUB, TREE_LEAVES

    return (ONE_GROUP_S,) if S <= TREE_LEAVES * BWD_SUB else (MULTI_GROUP_S,)


def _calls(problem: WarmupProblem, tokens=None):
    """(x shape, cu_seqlens list or None) of the representative calls of a problem: one and two groups
    of the dweight tree, packed with few and many documents and ``[B, T, C]``; or, given ``tokens``,
    the packed calls (few and many documents) at those token counts only."""
    few = lambda S: [0, S // 3, S]  # noqa: E731
    many = lambda S: list(range(0, S, SHORT_DOC)) + [S]  # noqa: E731
    for S in tokens or (ONE_GROUP_S, MULTI_GROUP_S):
        yield (S, problem.C), few(S)
        yield (S, problem.C), many(S)
        if not tokens:
            yield (2, S // 2, problem.C), None


def _mamba_ssm_pair_step(problem: WarmupProblem, shape, cu) -> None:
    """One forward and backward of causal-conv1d's pair as mamba_ssm's fused path calls it (x and dx
    slices of wider [B, T, stride] tensors, dout contiguous, seq_idx from ``cu``), on cakeconv."""
    from .integrations import dao

    B, T = (1, shape[0]) if len(shape) == 2 else shape[:2]
    stride = problem.mamba_ssm_row_stride
    x_BDT = torch.empty(B, T, stride, dtype=problem.dtype)[..., :problem.C].transpose(1, 2)
    dx_BDT = torch.empty(B, T, stride, dtype=problem.dtype)[..., :problem.C].transpose(1, 2)
    dout_BDT = torch.empty(B, T, problem.C, dtype=problem.dtype).transpose(1, 2)
    w = torch.zeros(problem.C, problem.width, dtype=problem.weight_dtype)
    b = torch.zeros(problem.C, dtype=problem.weight_dtype) if problem.bias else None
    seq_idx = None
    if cu is not None:
        lengths = torch.tensor(cu[1:]) - torch.tensor(cu[:-1])
        seq_idx = torch.repeat_interleave(torch.arange(len(lengths), dtype=torch.int32), lengths)[None]
    silu = problem.activation == "silu"
    dao.causal_conv1d_fwd_function(x_BDT, w, b, seq_idx, None, None, silu, backend="triton")
    dao.causal_conv1d_bwd_function(x_BDT, w, b, dout_BDT, seq_idx, None, None, dx_BDT, False, silu, backend="triton")


def _record(problem: WarmupProblem, tokens=None, twins: bool = False) -> list:
    """The launches of the problem's representative forward + backward calls (nothing runs); ``twins``:
    their quick twins' too (``launch.record_launches``)."""
    from . import cake_causal_conv1d_det
    from .cake_causal_conv1d_det_train_backend import checks, conv
    from .cake_causal_conv1d_det_train_backend.kernels import launch

    launches = []
    saved, saved_plans = checks.INTERPRET, dict(conv._plans)
    checks.INTERPRET = True  # the Triton backend takes CPU tensors: they are only recorded
    try:
        for shape, cu in _calls(problem, tokens):
            if problem.mamba_ssm_row_stride is not None:
                with launch.record_launches(twins=twins) as recorded:
                    _mamba_ssm_pair_step(problem, shape, cu)
                launches += recorded
                continue
            x = torch.empty(shape, dtype=problem.dtype).requires_grad_(True)
            w = torch.zeros(problem.C, problem.width, dtype=problem.weight_dtype).requires_grad_(True)
            b = torch.zeros(problem.C, dtype=problem.weight_dtype).requires_grad_(True) if problem.bias else None
            cu_t = None if cu is None else torch.tensor(cu, dtype=problem.cu_dtype)
            with launch.record_launches(twins=twins) as recorded:
                y = cake_causal_conv1d_det(x, w, b, cu_seqlens=cu_t, activation=problem.activation, backend="triton")
                # the op's backward, called as autograd calls it: y.backward(dy) would import torch's
                # symbolic-shapes module here (a process's first backward(grad) does, seconds), before the
                # compile ahead's twins start compiling; the training step's own backward pays it beside them
                y.grad_fn.apply(torch.empty_like(y))
            launches += recorded
    finally:
        checks.INTERPRET = saved
        conv._plans.clear()  # the plans of these CPU tensors on the Triton backend hold for the recording only
        conv._plans.update(saved_plans)
    return launches


def problem_specializations(problems, target, tokens=None) -> dict:
    """{(kernel name, specialization text): (kernel name, specialization)} of the problems' launches
    (``tokens``: of the packed calls at those token counts only)."""
    found = {}
    for problem in problems:
        found.update(launch_specializations(_record(problem, tokens), target))
    return found


def launch_specializations(launches, target) -> dict:
    """``problem_specializations``' dict for recorded launches."""
    from .cake_causal_conv1d_det_train_backend.kernels.specialization import triton_specialization

    found = {}
    for r in launches:
        spec = triton_specialization(r.kernel.fn, r.args, r.options, target)
        options, signature, constexprs, attrs = spec
        text = repr((sorted(signature.items()), sorted(constexprs.items()), sorted(attrs.items()),
                     sorted(options.__dict__.items())))
        found.setdefault((r.kernel.name, text), (r.kernel.name, spec))
    return found


def _compile_one(item):
    """Worker: compile one (kernel name, specialization, target) through Triton's cache."""
    name, spec, target = item
    from .cake_causal_conv1d_det_train_backend.kernels import launch
    from .cake_causal_conv1d_det_train_backend.kernels.specialization import compile_specialization

    launch.cache_keys_in_fixed_order()  # the keys a run computes (launch.py)
    return name, compile_specialization(launch.KERNEL_FNS[name], spec, target)


def _parse_target(text):
    from .cake_causal_conv1d_det_train_backend.kernels.specialization import cuda_target, current_target

    if text in (None, "", "auto"):
        target = current_target()
        if target is None:
            raise ValueError("no CUDA GPU here: give the target to compile for, e.g. target='sm_90' (H100, H200)")
        return target
    digits = str(text).lower().removeprefix("sm_").removeprefix("sm")
    if not digits.isdigit() or int(digits) < 80:
        raise ValueError(f"target must be 'auto' or 'sm_<capability>' with capability >= 80 (e.g. 'sm_90'), got {text!r}")
    return cuda_target(int(digits))


def warmup(problems, *, target="auto", jobs=None, progress=print, tokens=None) -> dict:
    """Compile every kernel variant the problems' training steps launch into Triton's cache.

    Args:
        problems: ``WarmupProblem`` objects (or ints: C with the defaults, bf16 x, FP32 taps, no
            bias, W = 4, SiLU, int32 cu_seqlens).
        target: "auto" (the current CUDA device) or "sm_<capability>" (no GPU needed, e.g. "sm_90").
        jobs: parallel compile processes (default: the CPU count, at most the number of kernels).
        progress: called with one line per kernel compiled (None: silent).
        tokens: None (every variant a step of any token count may launch), or token counts S: only
            what packed calls (``cu_seqlens``, few or many documents) of those counts launch, about
            half the variants (no ``[B, T, C]`` form; one group of the dweight tree or more, as S
            needs: ``regime_tokens``). The markers it writes then name those regimes
            (``compile_ahead.py``): a first training step of packed rows in one of them compiles
            nothing; a step of another layout or regime compiles what it needs.

    Returns:
        {"target", "kernels": [{"kernel", "front_end", "llvm", "ptxas", "total", "cache_hit"}...],
        "compiled", "cache_hits", "launchers" (with target "auto": the kernels' launchers built into
        the cache, or why not; else left to the launches), "seconds", "cache_dir"}.

    Raises:
        ValueError: a bad problem or target, or Triton's CPU interpreter is on (it compiles nothing).
    """
    from .cake_causal_conv1d_det_train_backend.constants import INTERPRET

    if INTERPRET:
        raise ValueError("TRITON_INTERPRET=1 is set: the interpreter compiles nothing; run the warm-up without it")
    problems = [WarmupProblem(p) if isinstance(p, int) else p for p in problems]
    for p in problems:
        if not isinstance(p, WarmupProblem):
            raise ValueError(f"problems must be WarmupProblem objects or channel counts, got {p!r}")
    if tokens is not None:
        tokens = tuple(tokens)
        bad = [S for S in tokens if isinstance(S, bool) or not isinstance(S, int) or S < SHORT_DOC]
        if not tokens or bad:
            raise ValueError(f"tokens must be None or token counts of at least {SHORT_DOC}, got {tokens!r}")
    tgt = _parse_target(target)
    from .cake_causal_conv1d_det_train_backend.kernels import launch

    launch.cache_keys_in_fixed_order()  # before anything hashes a kernel (launch.py); the workers inherit them
    start = time.perf_counter()
    specs = problem_specializations(problems, tgt, tokens)
    items = [(name, spec, tgt) for name, spec in specs.values()]
    n_jobs = max(1, min(jobs or os.cpu_count() or 1, len(items)))
    if progress:
        progress(f"warmup: {len(problems)} problem(s), {len(items)} kernel variants for "
                 f"sm_{tgt.arch}, {n_jobs} processes, cache {_cache_dir()}")
    results = []
    if items:
        # fork where there is one: the workers only compile (no CUDA call), and a caller's script then
        # needs no ``if __name__ == "__main__"`` guard
        method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
        with ProcessPoolExecutor(n_jobs, mp_context=multiprocessing.get_context(method)) as pool:
            futures = [pool.submit(_compile_one, item) for item in items]
            for i, future in enumerate(as_completed(futures), 1):
                name, times = future.result()
                results.append({"kernel": name, **times})
                if progress:
                    how = "cached" if times["cache_hit"] else (
                        f"front end {times['front_end']:.1f} s, LLVM {times['llvm']:.1f} s, ptxas {times['ptxas']:.1f} s")
                    progress(f"  [{i}/{len(items)}] {name}: {times['total']:.1f} s ({how})")
    from .cake_causal_conv1d_det_train_backend.compile_ahead import build_launchers, write_marker

    # the launchers of this machine's driver, for the GPU at hand only: a named target may be another machine's,
    # and the compile ahead's background warm-up (which names it) runs beside a process that builds them itself.
    # After the workers, not beside them: they are forked, and a fork beside a running thread may copy its locks
    outcome = "launchers left to the launches (a named target)"
    if target in (None, "", "auto"):
        launchers = build_launchers([(name, spec) for name, spec, _ in items], n_jobs)
        launchers.join()
        outcome = launchers.outcome
    seconds = time.perf_counter() - start

    for problem in problems:  # a step of these problems (in these regimes) need not compile them ahead again
        if tokens is None:
            write_marker(problem, tgt)
        else:  # the regimes of packed rows (contiguous or mamba_ssm's)
            for regime in {regime_tokens(S) for S in tokens}:
                write_marker(problem, tgt, regime)
    hits = sum(r["cache_hit"] for r in results)
    if progress:
        progress(f"warmup: {len(results) - hits} compiled, {hits} already cached, {outcome}, "
                 f"{seconds:.1f} s")
    return {"target": f"sm_{tgt.arch}", "kernels": results, "compiled": len(results) - hits, "cache_hits": hits,
            "launchers": outcome, "seconds": seconds, "cache_dir": _cache_dir()}


def wait_for_kernels(timeout: float | None = None) -> bool:
    """Wait until the full kernels of every problem this process's first training steps met are
    compiled: those steps run quick twins meanwhile (the same bits, slower), so wait before timing a
    steady state or capturing anything by hand. True once they are, False if ``timeout`` seconds
    passed first. (Capturing a CUDA graph waits for them by itself.)"""
    from .cake_causal_conv1d_det_train_backend.compile_ahead import wait_for_kernels as wait

    return wait(timeout)


def _cache_dir() -> str:
    from triton import knobs

    return knobs.cache.dir


def _list(text, convert):
    return [convert(v) for v in str(text).split(",") if v != ""]


def command_line(problem: WarmupProblem, target_arch: int, tokens=None, jobs=None) -> list:
    """The arguments of ``python -m cakeconv warmup`` that compile ``problem``'s training-step kernels
    for sm_<target_arch> (``tokens``: of packed calls at those token counts only; ``jobs`` processes):
    what a first training step starts in the background (compile_ahead.py)."""
    names = {dtype: name for name, dtype in _DTYPES.items() if len(name) == 4}  # bf16, fp16, fp32
    argv = ["--channels", str(problem.C), "--dtype", names[problem.dtype], "--weight-dtype",
            names[problem.weight_dtype], "--bias", "yes" if problem.bias else "no", "--width", str(problem.width),
            "--activation", problem.activation or "none", "--cu-dtype", str(problem.cu_dtype).removeprefix("torch."),
            "--target", f"sm_{target_arch}"]
    if problem.mamba_ssm_row_stride is not None:
        argv += ["--mamba-ssm-row-stride", str(problem.mamba_ssm_row_stride)]
    if tokens:
        argv += ["--tokens", ",".join(str(S) for S in tokens)]
    return argv + (["--jobs", str(jobs)] if jobs else [])


def parse_command_line(argv) -> tuple:
    """(problems, options) of a ``python -m cakeconv warmup`` command line (ValueError: a bad value;
    argparse exits on an unknown option or dtype)."""
    ap = argparse.ArgumentParser(prog="python -m cakeconv warmup", description=warmup.__doc__.splitlines()[0])
    ap.add_argument("--channels", required=True, help="channel counts C, comma-separated (e.g. 512,2048)")
    ap.add_argument("--dtype", default="bf16", help="x dtypes: bf16, fp16, fp32 (comma-separated)")
    ap.add_argument("--weight-dtype", default="fp32", help="taps dtypes: fp32, bf16 (comma-separated)")
    ap.add_argument("--bias", default="no", choices=("no", "yes", "both"))
    ap.add_argument("--width", default="4", help="widths W, 2..8 (comma-separated)")
    ap.add_argument("--activation", default="silu", help="silu, none (comma-separated)")
    ap.add_argument("--cu-dtype", default="int32", help="cu_seqlens dtypes: int32, int64 (comma-separated)")
    ap.add_argument("--mamba-ssm-row-stride", default="", help="warm each --channels entry as the convolution of "
                    "mamba_ssm's fused paths (cakeconv.integrations.mamba_ssm), on x rows this many elements apart: "
                    "Mamba2's d_in_proj (comma-separated, one per --channels entry)")
    ap.add_argument("--tokens", default="", help="only the variants packed calls of these token counts launch "
                    "(comma-separated, e.g. 250340): about half, see warmup(tokens=...)")
    ap.add_argument("--target", default="auto", help="auto (this GPU) or sm_<capability>, e.g. sm_90 (no GPU needed)")
    ap.add_argument("--jobs", type=int, default=None, help="parallel compile processes (default: CPU count)")
    ap.add_argument("--json", default=None, help="also write the report (per kernel: stage times) to this file")
    a = ap.parse_args(argv)
    try:
        dtypes = _list(a.dtype, lambda v: _DTYPES[v])
        wdtypes = _list(a.weight_dtype, lambda v: _DTYPES[v])
        cu_dtypes = _list(a.cu_dtype, lambda v: {"int32": torch.int32, "int64": torch.int64}[v])
    except KeyError as error:
        ap.error(f"unknown dtype {error}")
    acts = _list(a.activation, lambda v: None if v.lower() == "none" else v)
    biases = {"no": [False], "yes": [True], "both": [False, True]}[a.bias]
    channels = _list(a.channels, int)
    strides = _list(a.mamba_ssm_row_stride, int)
    if strides and len(strides) != len(channels):
        raise ValueError(f"--mamba-ssm-row-stride needs one stride per --channels entry, got {strides} for {channels}")
    layouts = [(C, [strides[i]] if strides else [None]) for i, C in enumerate(channels)]
    problems = [WarmupProblem(C, d, wd, b, W, act, cu, stride)
                for C, stride_list in layouts for stride in stride_list for d in dtypes for wd in wdtypes
                for b in biases for W in _list(a.width, int) for act in acts
                for cu in (cu_dtypes if stride is None else cu_dtypes[:1])]
    a.tokens = _list(a.tokens, int) or None
    return problems, a


def main(argv=None) -> int:
    """``python -m cakeconv warmup``: the command line of ``warmup``."""
    try:
        problems, a = parse_command_line(argv)
        report = warmup(problems, target=a.target, jobs=a.jobs, progress=lambda line: print(line, flush=True),
                        tokens=a.tokens)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if a.json:
        import datetime
        import json
        import platform

        import triton

        report["problems"] = [str(p) for p in problems]
        report["host"] = {"machine": platform.machine(), "cores": os.cpu_count(), "torch": torch.__version__,
                          "triton": triton.__version__,
                          "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0
