"""Compile a training step's kernels side by side, the first time a step needs them.

A problem (C, x dtype, taps dtype, bias or not, width W, activation, cu_seqlens dtype) trains
through several Triton kernel variants: the forward, the backward (one group of the dweight tree,
or the main and the group kernel), their forms for many short documents, the ``[B, T, C]`` forms.
Triton compiles each on its first launch, one after the other, in the launching thread. Most of a
compile runs outside Python's GIL (the MLIR passes, LLVM, ptxas), so threads compile side by side;
its first stage, Python code generation from the kernels' syntax trees, runs one thread at a time
(CPython 3.11's ``ast.parse`` is not safe in two threads at once: "AST constructor recursion depth
mismatch").

The first time the autograd op (or the backward entry point) meets a problem on a CUDA device, this
module compiles the variants of that problem's training step (``cakeconv.warmup``'s set for the
problem: the same launches, the same Triton cache keys) in parallel threads into Triton's on-disk
cache, and waits for them; the launches then load them from there. A cold first step then costs
about the slowest variant's compile, not the sum of all of them; later steps at other token or
document counts compile nothing. Packed rows with ``cu_seqlens`` compile the set of the step's
regime only: one group of the backward's dweight tree (S <= 8,192 tokens) or more, with few and
many documents (``warmup(tokens=...)``'s set: 5 or 6 variants of the 11); the first step of the
other regime, if one comes, compiles that one's. Other layouts take the problem's whole set. Once a
set is in the cache, a marker file there (``cakeconv_compile_ahead/<hash>``, keyed by the problem,
the regime, the target, Triton's version and the kernels' cache keys) lets later processes skip all
this: their launches load the kernels as before.

It applies to contiguous rows (``[S, C]``, ``[1, S, C]``, ``[B, T, C]``) and to x rows that are a
slice of a wider tensor, taken as mamba_ssm's fused layout (x and dx rows that far apart, through
causal-conv1d's pair: ``cakeconv.integrations.mamba_ssm``), when the bias, if any, has the taps'
dtype; a variant a call needs outside that set (another layout, KCP) compiles on its first launch
as before. Nothing changes in what runs: the kernels are the ones the launches would compile
themselves.

``CAKECONV_COMPILE_THREADS``: the number of threads (default: the CPU count, at most the number of
variants); ``0`` or ``1`` turns this off (each kernel compiles on its first launch). A failure here
is reported once as a warning and the launches compile what they need, as without it.

A compile here takes from seconds to minutes (the backward's variants grow fast with W), so it says
so when it starts and when it ends, through the ``cakeconv`` logger: at WARNING level in a single
process or on rank 0 of a process group (Python prints those to stderr when logging is not
configured), at INFO on the other ranks. ``logging.getLogger("cakeconv").setLevel(logging.ERROR)``
silences it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import torch
import triton
from triton.compiler import ASTSource

ENV_THREADS = "CAKECONV_COMPILE_THREADS"

_done: dict = {}  # (capability, problem) -> an Event set once its compile ahead is over
_lock = threading.Lock()
_front_end = threading.Lock()  # Triton's Python code generation (ast.parse), one thread at a time
_local = threading.local()
_warned = False
_log = logging.getLogger(__name__)  # under "cakeconv"


def threads() -> int:
    """The threads a problem's compile uses (``CAKECONV_COMPILE_THREADS``; 0 or 1: off)."""
    text = os.environ.get(ENV_THREADS, "").strip()
    if not text:
        return os.cpu_count() or 1
    try:
        return max(0, int(text))
    except ValueError:
        raise ValueError(f"{ENV_THREADS} must be a whole number of threads (0 or 1: off), got {text!r}") from None


def tokens_of(plan):
    """The regime's representative token count, ``(ONE_GROUP_S,)`` or ``(MULTI_GROUP_S,)``, for a plan of
    packed contiguous rows with ``cu_seqlens`` (the variants of one group of the dweight tree or of
    more: ``warmup(tokens=...)``); None for other layouts (the problem's whole set)."""
    x_stride, _, _, cu_dtype, _ = plan._layout
    if cu_dtype is None or x_stride != plan.C:
        return None
    from ..warmup import regime_tokens

    return regime_tokens(plan.S)


def problem_of(plan):
    """The ``WarmupProblem`` of a plan's training step (x rows wider apart than C: mamba_ssm's layout),
    or None where this does not apply (no Triton fast path on a CUDA device, a bias of another dtype
    than the taps)."""
    if plan.fwd is None or plan.device_index < 0 or plan._layout is None:
        return None
    x_stride, w_dtype, b_dtype, cu_dtype, _ = plan._layout
    if b_dtype is not None and b_dtype != w_dtype:
        return None
    from ..warmup import WarmupProblem

    return WarmupProblem(plan.C, plan.dtype, w_dtype, b_dtype is not None, plan.W, plan.activation,
                         cu_dtype or torch.int32, None if x_stride == plan.C else x_stride)


class _OneAtATime(ASTSource):
    """A kernel's source whose Python code generation holds ``_front_end`` (the same cache key as
    ASTSource's)."""

    def make_ir(self, *args, **kwargs):
        with _front_end:
            return super().make_ir(*args, **kwargs)


def compile_problem(problem, target, n_threads: int, tokens=None) -> int:
    """Compile the kernel variants of ``problem``'s training step (``tokens``: of packed calls at those
    token counts only) for ``target`` in ``n_threads`` threads into Triton's cache (variants already
    there are found, not compiled); the number of variants."""
    from ..warmup import problem_specializations
    from .kernels import launch

    launch.cache_keys_in_fixed_order()  # before any thread hashes a kernel (launch.py)
    fns = {k.name: k.fn for k in launch.KERNELS}
    items = list(problem_specializations([problem], target, tokens).values())

    def compile_one(item):
        name, (options, signature, constexprs, attrs) = item
        src = _OneAtATime(fn=fns[name], signature=signature, constexprs=constexprs, attrs=attrs)
        triton.compile(src, target=target, options=options.__dict__)

    with ThreadPoolExecutor(max(1, min(n_threads, len(items)))) as pool:
        for _ in pool.map(compile_one, items):
            pass
    return len(items)


def marker_path(problem, target, tokens=None) -> str:
    """The file that says ``problem``'s training-step kernels for ``target`` are in Triton's cache: all of
    them, or (``tokens``: a regime's ``(ONE_GROUP_S,)`` or ``(MULTI_GROUP_S,)``) those of that regime."""
    from triton import knobs

    from .kernels import launch

    launch.cache_keys_in_fixed_order()
    text = repr((problem, target.arch, triton.__version__, [k.fn.cache_key for k in launch.KERNELS]))
    if tokens is not None:
        text += f" tokens {tuple(tokens)}"
    return os.path.join(knobs.cache.dir, "cakeconv_compile_ahead", hashlib.sha256(text.encode()).hexdigest())


def _compile_once(problem, target, n: int, tokens=None) -> None:
    """The problem's compile ahead (``tokens``: of that regime), unless a marker says an earlier process
    (or the warm-up) did it."""
    if os.path.exists(marker_path(problem, target)) or (
            tokens is not None and os.path.exists(marker_path(problem, target, tokens))):
        return  # the launches load the kernels from the cache
    from ..warmup import ONE_GROUP_S

    level = logging.WARNING if _leading_process() else logging.INFO
    groups = None if tokens is None else "one group" if tokens[0] <= ONE_GROUP_S else "several groups"
    regime = "" if groups is None else f" ({groups} of the dweight tree)"
    _log.log(level, "cakeconv: compiling the training step's kernels of %s%s for sm_%s in up to %d threads (once "
             "per problem and Triton cache; `python -m cakeconv warmup` compiles them ahead)", problem, regime,
             target.arch, n)
    start = time.perf_counter()
    _local.busy = True
    try:
        with torch.enable_grad():  # the representative calls are training steps (also from inside a forward)
            count = compile_problem(problem, target, n, tokens)
    finally:
        _local.busy = False
    write_marker(problem, target, tokens)
    _log.log(level, "cakeconv: %s kernel variants of %s ready in %.1f s", count, problem, time.perf_counter() - start)


def _leading_process() -> bool:
    """True in a single process and on rank 0 of an initialized process group."""
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def write_marker(problem, target, tokens=None) -> None:
    """Record that ``problem``'s training-step kernels for ``target`` (``tokens``: a regime's) are in
    Triton's cache."""
    path = marker_path(problem, target, tokens)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(f"{problem}\n")


def before_training_step(plan) -> None:
    """Once per problem (packed rows with ``cu_seqlens``: per problem and regime) and process: compile
    the training-step kernels side by side (see the module docstring). Marks the plan so that its
    later calls skip this at the cost of one attribute read."""
    plan.ahead = True
    if getattr(_local, "busy", False):  # the representative calls below run the op themselves
        return
    n = threads()
    if n <= 1:
        return
    try:
        problem = problem_of(plan)
        if problem is None:
            return
        from .kernels.specialization import cuda_target

        tokens = tokens_of(plan)
        major, minor = torch.cuda.get_device_capability(plan.device_index)
        key = (10 * major + minor, problem, tokens)
        with _lock:
            over = _done.get(key)
            if over is None:
                _done[key] = over = threading.Event()
                mine = True
            else:
                mine = False
        if not mine:  # another thread compiles it: wait, so that this one's launches compile nothing alongside
            over.wait()
            return
        try:
            _compile_once(problem, cuda_target(key[0]), n, tokens)
        finally:
            over.set()
    except Exception as exc:  # noqa: BLE001 - the launches compile what they need, as without this
        global _warned
        if not _warned:
            _warned = True
            warnings.warn(f"cakeconv could not compile the training step's kernels ahead ({type(exc).__name__}: "
                          f"{exc}); each compiles on its first launch instead. {ENV_THREADS}=0 turns the "
                          f"compile ahead off.", RuntimeWarning, stacklevel=3)
