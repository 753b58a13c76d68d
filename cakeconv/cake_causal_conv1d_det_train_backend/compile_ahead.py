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
module records the launches of that problem's training step (``cakeconv.warmup``'s set for the
problem: the same launches, the same Triton cache keys) and compiles them in two tiers:

1. their quick twins, in parallel threads: kernels of their own
   (``cake_conv_*_quick_kernel``) that take one code path for every program (the same bits: each
   path computes every element alike), which compiles several times faster than the full kernels'
   four paths (Triton's layout pass grows faster than a kernel's size) and runs slower. Their row
   strides are arguments and their launch configuration is one for every C, so the twins of one
   problem serve every channel count and row stride of its dtypes, bias, width and activation
   (``twins_key``): a later problem that differs in those only records nothing and waits for
   nothing, its first call runs the twins at once while its full variants compile (tier 2). The
   forward's twins are waited for; the backward's compile on while the forward runs and torch
   prepares its first backward (a process's first ``backward(grad)`` imports torch's symbolic-shapes
   module, seconds), and the backward's launches wait for them (``Plan.run_early_until``);
2. the full variants, in the background: a ``python -m cakeconv warmup`` process for the problem (and
   regime), on the same Triton cache, while the first steps run the twins. Once it has compiled them
   all (and written the marker), the launches switch to them (a launch that loads one from the cache
   takes milliseconds). Its own process: no compile thread shares the training process's CPU time
   or Python's GIL, and the training process can end at any time. It then stops that process (what
   it finished stays in the cache for the next run).

Beside the twins' compile, threads build the launchers of both tiers (``build_launchers``): the C
module per argument-type signature that a kernel's first launch in a process would otherwise build
with the C compiler in the launching thread, about 0.3 s each; a step needs about six, the full
kernels' ones at the switch from the twins.

A cold first step then waits for the quick twins instead of the slowest full kernel. Packed
rows with ``cu_seqlens`` (contiguous, or mamba_ssm's rows of a wider tensor) compile the set of the
step's regime only: one group of the backward's
dweight tree (S <= 8,192 tokens) or more, with few and many documents (``warmup(tokens=...)``'s set:
5 or 6 variants of the 11); the first step of the other regime, if one comes, compiles that one's.
``[B, T, C]`` and one sequence take the problem's whole set. Once a set is in the cache, a marker file there
(``cakeconv_compile_ahead/<hash>``, keyed by the problem, the regime, the target, Triton's version
and the kernels' cache keys) lets later processes skip all this: their launches load the full
kernels as before, with no twin.

It applies to contiguous rows (``[S, C]``, ``[1, S, C]``, ``[B, T, C]``) and to x rows that are a
slice of a wider tensor, taken as mamba_ssm's fused layout (x and dx rows that far apart, through
causal-conv1d's pair: ``cakeconv.integrations.mamba_ssm``), when the bias, if any, has the taps'
dtype; a variant a call needs outside that set (another layout, KCP) compiles on its first launch
as before. The bits never depend on which tier ran.

``CAKECONV_COMPILE_THREADS``: the number of threads (default: the CPU count, at most the number of
variants); ``0`` or ``1`` turns this off (each kernel compiles on its first launch).
``CAKECONV_QUICK_KERNELS=0``: no quick tier (the first step waits for the full variants).
``CAKECONV_KEY_AHEAD=0``: no thread computing Triton's installation key at import (``key_ahead``). A failure
here is reported once as a warning and the launches compile what they need, as without it. Capturing
a CUDA graph while the full variants compile waits for them (a graph keeps the kernels it captured);
``wait_for_kernels()`` waits for them too (e.g. before timing a steady state).

A compile here takes from seconds to minutes (the backward's variants grow fast with W), so it says
so when it starts and when each tier ends, through the ``cakeconv`` logger: at WARNING level in a
single process or on rank 0 of a process group (Python prints those to stderr when logging is not
configured), at INFO on the other ranks. ``logging.getLogger("cakeconv").setLevel(logging.ERROR)``
silences it.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import torch
import triton
from triton.compiler import ASTSource

ENV_THREADS = "CAKECONV_COMPILE_THREADS"
ENV_QUICK = "CAKECONV_QUICK_KERNELS"
ENV_KEY_AHEAD = "CAKECONV_KEY_AHEAD"

_states: dict = {}  # (capability, problem, regime tokens) -> its _Compile
_twins_compiled: set = set()  # the twins_key of every problem whose quick twins this process compiled
_children: list = []  # the background warm-up processes still running (stopped when this process exits)
_twin_threads: list = []  # the threads compiling backward twins (waited for when this process exits)
_lock = threading.Lock()
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


def quick_tier() -> bool:
    """Whether a first step runs quick twins while the full variants compile (``CAKECONV_QUICK_KERNELS``,
    default on; ``0`` off)."""
    text = os.environ.get(ENV_QUICK, "").strip()
    if text not in ("", "0", "1"):
        raise ValueError(f"{ENV_QUICK} must be 0 or 1, got {text!r}")
    return text != "0"


class _Compile:
    """The compile ahead of one problem (and regime): ``first`` is set once its first step may launch
    (the quick twins, or the full variants, are in the cache, or the compile failed), ``ready`` once
    the full variants are (or their compile ended in a failure: the launches then compile what they
    need themselves)."""

    __slots__ = ("first", "ready", "twins")

    def __init__(self):
        self.first, self.ready = threading.Event(), threading.Event()
        self.twins = threading.Event()  # every quick twin is compiled (or none will be): the backward may launch


def wait_for_kernels(timeout: float | None = None) -> bool:
    """Wait until the full kernel variants of every problem met so far are compiled (the quick tier's
    background compiles are over); True if they are, False if ``timeout`` seconds passed first."""
    deadline = None if timeout is None else time.monotonic() + timeout
    with _lock:
        pending = [c.ready for c in _states.values()]
    for ready in pending:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not ready.wait(left):
            return False
    return True


def tokens_of(plan):
    """The regime's representative token count, ``(ONE_GROUP_S,)`` or ``(MULTI_GROUP_S,)``, for a plan of
    packed rows with ``cu_seqlens``, contiguous or rows of a wider tensor (the variants of one group of
    the dweight tree or of more: ``warmup(tokens=...)``); None for ``[B, T, C]`` and one sequence (the
    problem's whole set)."""
    _, _, _, cu_dtype, _ = plan._layout
    if cu_dtype is None:
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
    """A kernel's source whose Python code generation holds ``launch.FRONT_END`` (the same cache key as
    ASTSource's)."""

    def make_ir(self, *args, **kwargs):
        from .kernels.launch import FRONT_END

        with FRONT_END:
            return super().make_ir(*args, **kwargs)


def training_step_items(problem, target, tokens=None) -> tuple[list, list]:
    """(full, quick): the (kernel name, specialization) items of ``problem``'s training step for
    ``target`` (``tokens``: of packed calls at those token counts only), and of its quick twins (with
    the kernels that serve both: the group kernel, the segment-index build). Records the step's
    launches: call it in the thread that runs the op (the recording is the process's, not the
    thread's)."""
    from ..warmup import _record, launch_specializations

    launches = _record(problem, tokens, twins=True)
    full = list(launch_specializations([r for r in launches if not r.twin], target).values())
    quick = list(launch_specializations([r for r in launches if r.twin], target).values())
    return full, quick


def twins_key(key) -> tuple:
    """What a problem's quick twins depend on, of its compile-ahead key (capability, problem, regime
    tokens): (everything but C and the row stride, whether the rows are contiguous). The twins take
    C and the strides as arguments and launch with one configuration for every C; mamba_ssm's layout
    (x rows wider apart than C) records other calls, hence the second part."""
    capability, problem, tokens = key
    common = (capability, tokens, problem.dtype, problem.weight_dtype, problem.bias, problem.width,
              problem.activation, problem.cu_dtype)
    return common, problem.mamba_ssm_row_stride is None


def _twins_ready(shared) -> bool:
    """Whether this process compiled the quick twins of a problem of ``twins_key`` ``shared``: those of
    that key, or those of the contiguous layout, which hold all of mamba_ssm's layout's twins (the
    same kernels: the strides are arguments)."""
    common, _ = shared
    return shared in _twins_compiled or (common, True) in _twins_compiled


def compile_items(items, target, n_threads: int) -> None:
    """Compile (kernel name, specialization) items for ``target`` in ``n_threads`` threads into Triton's
    cache (any thread may call this)."""
    from .kernels import launch

    launch.cache_keys_in_fixed_order()  # before any thread hashes a kernel (launch.py)

    def compile_one(item):
        name, (options, signature, constexprs, attrs) = item
        src = _OneAtATime(fn=launch.KERNEL_FNS[name], signature=signature, constexprs=constexprs, attrs=attrs)
        triton.compile(src, target=target, options=options.__dict__)

    with ThreadPoolExecutor(max(1, min(n_threads, len(items)))) as pool:
        for _ in pool.map(compile_one, items):
            pass


def build_launchers(items, n_threads: int) -> threading.Thread:
    """Start building the launchers of (kernel name, specialization) items into Triton's cache, in a thread
    of their own and up to ``n_threads`` C compilers; returns the thread (join it before the launches).
    A kernel's first launch in a process otherwise builds its launcher itself, about 0.3 s in the
    launching thread (``specialization.launcher_source``); one launcher serves every specialization of
    the same argument types, so a step's kernels need a handful. Triton's CUDA utilities module, which
    a process's first launch builds the same way, comes with them. Where one cannot be built (no CUDA
    driver library), the launches build theirs as before. The thread's ``outcome`` says which, once
    joined."""
    from .kernels import launch, specialization

    def run():
        try:
            sources = list(dict.fromkeys(specialization.launcher_source(launch.KERNEL_FNS[name], spec)
                                         for name, spec in items))
            modules = [(specialization.driver_utils_source(), "cuda_utils")]
            modules += [(source, "__triton_launcher") for source in sources]
            with ThreadPoolExecutor(max(1, min(n_threads, len(modules)))) as pool:
                for _ in pool.map(lambda module: specialization.build_launcher(*module), modules):
                    pass
            thread.outcome = f"{len(sources)} launchers built or found"
        except Exception as exc:  # noqa: BLE001 - the launches build what they need, as without this
            first_line = str(exc).splitlines()[0] if str(exc) else ""
            thread.outcome = f"launchers not built ({type(exc).__name__}: {first_line})"
            _log.debug("cakeconv: %s", thread.outcome)

    thread = threading.Thread(target=run, name="cakeconv-launchers", daemon=True)
    thread.outcome = None
    thread.start()
    return thread


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


def _start(state: _Compile, problem, target, n: int, tokens=None, quick: bool = True, shared=None) -> None:
    """The problem's compile ahead (``tokens``: of that regime), unless a marker says an earlier process
    (or the warm-up) did it: the quick twins (waited for) and the full variants in the background, or
    (no quick tier) the full variants, waited for. ``shared``: the problem's ``twins_key``; when this
    process compiled those twins for another C or row stride already, they serve this problem too, and
    only the background compile starts (nothing recorded, nothing waited for). Sets
    ``state.ready`` unless a background compile will."""
    if os.path.exists(marker_path(problem, target)) or (
            tokens is not None and os.path.exists(marker_path(problem, target, tokens))):
        state.ready.set()  # the launches load the kernels from the cache
        state.twins.set()
        return
    from ..warmup import ONE_GROUP_S

    level = logging.WARNING if _leading_process() else logging.INFO
    groups = None if tokens is None else "one group" if tokens[0] <= ONE_GROUP_S else "several groups"
    regime = "" if groups is None else f" ({groups} of the dweight tree)"
    start = time.perf_counter()
    if quick and shared is not None and _twins_ready(shared):
        _log.log(level, "cakeconv: %s%s runs the quick kernels compiled for an earlier channel count or stride; its "
                 "full variants compile in a background process", problem, regime)
        state.twins.set()
        _compile_in_background(state, problem, target, n, tokens, level, start)
        return
    _local.busy = True
    try:
        with torch.enable_grad():  # the representative calls are training steps (also from inside a forward)
            full, twins = training_step_items(problem, target, tokens)
    finally:
        _local.busy = False
    recorded = time.perf_counter()
    # the launchers of every kernel of the step, the full ones' too (their first launch, at the switch from
    # the twins, would build them in the training thread), built beside the compile
    launchers = build_launchers(twins + full, n)
    if not quick:
        _log.log(level, "cakeconv: compiling the training step's %d kernel variants of %s%s for sm_%s in up to %d "
                 "threads (once per problem and Triton cache; `python -m cakeconv warmup` compiles them ahead)",
                 len(full), problem, regime, target.arch, n)
        state.twins.set()
        _compile_full(state, full, problem, target, n, tokens, level, start)
        launchers.join()
        return
    _log.log(level, "cakeconv: compiling %d quick kernel variants of %s%s for sm_%s in up to %d threads, for the "
             "first steps; the training step's %d full variants follow in a background process (once per problem "
             "and Triton cache; `python -m cakeconv warmup` compiles them ahead)", len(twins), problem, regime,
             target.arch, n, len(full))
    # the backward's twins compile on while the forward's run and torch prepares its first backward
    from .kernels.launch import BACKWARD_KERNEL_NAMES

    backward = [item for item in twins if item[0] in BACKWARD_KERNEL_NAMES]
    forward = {"recorded": recorded - start}  # the forward twins' times, for the report
    thread = threading.Thread(target=_compile_backward_twins, name="cakeconv-twins", daemon=True,
                              args=(state, backward, forward, problem, target, n, tokens, level, start, shared))
    _twin_threads.append(thread)
    thread.start()
    try:
        compile_items([item for item in twins if item not in backward], target, n)
    except BaseException:
        state.ready.set()  # no twins to run: the launches compile the full variants themselves
        raise
    finally:
        launchers.join()
        forward.update(ready=time.perf_counter() - start, launchers=launchers.outcome)
        state.first.set()  # the forward may launch (before_training_step sets it too, whatever happens)


def _compile_backward_twins(state: _Compile, items, forward: dict, problem, target, n: int, tokens, level: int,
                            start: float, shared) -> None:
    """Compile the backward's quick twins (the forward's run meanwhile), start the background compile of the
    full variants (after the twins: it would take their CPU time), then set ``state.twins``. ``forward``: the
    forward twins' times, for the report, once ``state.first`` is set."""
    try:
        compile_items(items, target, n)
        state.first.wait()
        if shared is not None:
            _twins_compiled.add(shared)
        _log.log(level, "cakeconv: quick kernels of %s ready in %.1f s (the forward's in %.1f s, of which recording "
                 "the step %.2f s; %s); the full ones compile in the background", problem,
                 time.perf_counter() - start, forward["ready"], forward["recorded"], forward["launchers"])
        if _exiting:  # no background compile outlives the process
            state.ready.set()
        else:
            _compile_in_background(state, problem, target, n, tokens, level, start)
    except BaseException as exc:  # noqa: BLE001 - the launches compile what they need, as without this
        state.ready.set()
        _warn(exc)
    finally:
        state.twins.set()
        with contextlib.suppress(ValueError):
            _twin_threads.remove(threading.current_thread())


def _compile_in_background(state: _Compile, problem, target, n: int, tokens, level: int, start: float) -> None:
    """Start the background warm-up of ``problem``'s full variants and the thread that sets ``state.ready``
    when it ends."""
    proc = spawn_warmup(problem, target, n, tokens)
    _children.append(proc)
    threading.Thread(target=_await_full, args=(state, proc, problem, level, start), name="cakeconv-compile",
                     daemon=True).start()


def spawn_warmup(problem, target, n: int, tokens=None):
    """Start ``python -m cakeconv warmup`` for ``problem``'s full variants (``tokens``: of that regime) for
    ``target`` in ``n`` processes, on this process's Triton cache and this cakeconv: a ``Popen`` (stderr
    piped) in a session of its own (``_stop_children`` stops it and its workers)."""
    from triton import knobs

    from .. import warmup as warmup_module

    root = os.path.dirname(os.path.dirname(os.path.abspath(warmup_module.__file__)))  # the folder of this cakeconv
    env = dict(os.environ, TRITON_CACHE_DIR=os.path.abspath(knobs.cache.dir),
               PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    argv = [sys.executable, "-m", "cakeconv", "warmup", *warmup_module.command_line(problem, target.arch, tokens, n)]
    return subprocess.Popen(argv, cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _await_full(state: _Compile, proc, problem, level: int, start: float) -> None:
    """Wait for the background warm-up ``proc``, say how it ended, and set ``state.ready`` (whatever happens)."""
    try:
        _, err = proc.communicate()
        if proc.returncode == 0:
            _log.log(level, "cakeconv: the full kernel variants of %s ready in %.1f s", problem,
                     time.perf_counter() - start)
        elif not _exiting:
            tail = (err or "").strip()[-400:]
            _warn(RuntimeError(f"`python -m cakeconv warmup` exited with {proc.returncode}: {tail}"))
    except Exception as exc:  # noqa: BLE001 - the launches compile what they need, as without this
        _warn(exc)
    finally:
        state.ready.set()
        with contextlib.suppress(ValueError):
            _children.remove(proc)


_exiting = False


@atexit.register
def _stop_children() -> None:
    """This process is ending: wait for the backward twins' compile threads (seconds: a compile thread
    still inside the compiler while the process tears down could crash it), then stop the background
    warm-ups still running (and their workers)."""
    global _exiting
    _exiting = True
    for thread in list(_twin_threads):
        thread.join(timeout=300)
    for proc in list(_children):
        if proc.poll() is None:  # (a finished one's group id may belong to another process by now)
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGTERM)


def _compile_full(state: _Compile, full, problem, target, n: int, tokens, level: int, start: float) -> None:
    """Compile the full variants here (no quick tier), write the marker, say so, and set ``state.ready``
    (whatever happens)."""
    try:
        compile_items(full, target, n)
        write_marker(problem, target, tokens)
        _log.log(level, "cakeconv: %d kernel variants of %s ready in %.1f s", len(full), problem,
                 time.perf_counter() - start)
    except Exception as exc:  # noqa: BLE001 - the launches compile what they need, as without this
        _warn(exc)
    finally:
        state.ready.set()


def _warn(exc) -> None:
    """Say once per process that the compile ahead failed (the launches then compile what they need)."""
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(f"cakeconv could not compile the training step's kernels ahead ({type(exc).__name__}: "
                      f"{exc}); each compiles on its first launch instead. {ENV_THREADS}=0 turns the "
                      f"compile ahead off.", RuntimeWarning, stacklevel=4)


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


def _key(plan):
    """(compute capability, problem, regime tokens) of a plan's compile ahead, or None where none applies."""
    problem = problem_of(plan)
    if problem is None:
        return None
    major, minor = torch.cuda.get_device_capability(plan.device_index)
    return 10 * major + minor, problem, tokens_of(plan)


def join_running(plan) -> None:
    """For a call that starts no compile ahead (the forward entry point, inference): if the compile
    ahead of the plan's problem (and regime) is running, the plan runs its quick twins until it ends,
    as the training steps' plans do (a new shape's forward must not compile a full variant beside
    it). If none ran for this regime or layout but one ran for another of the same problem, the
    process trains that problem (mamba_ssm's pair: a forward entry point, then a backward one), so
    this forward starts its regime's compile ahead as the backward would have. Once per plan; nothing
    when no compile ahead ran in this process."""
    plan.joined = True
    if not _states:
        return
    try:
        key = _key(plan)
        state = None if key is None else _states.get(key)
        if key is not None and state is None and any(k[:2] == key[:2] for k in list(_states)):
            before_training_step(plan)
            return
        if state is not None and state.first.is_set() and not state.ready.is_set():
            plan.run_early_until(state.ready, state.twins)
    except Exception:  # noqa: BLE001 - the launches compile what they need, as without this
        return


def before_training_step(plan) -> None:
    """Once per problem (packed rows with ``cu_seqlens``: per problem and regime) and process: compile
    the training-step kernels ahead (see the module docstring); while the full ones compile in the
    background, the plan's launches run their quick twins. Marks the plan so that its later calls
    skip this at the cost of one attribute read."""
    plan.ahead = True
    if getattr(_local, "busy", False):  # the representative calls below run the op themselves
        return
    n = threads()
    if n <= 1:
        return
    quick = quick_tier()
    try:
        key = _key(plan)
        if key is None:
            return
        from .kernels.specialization import cuda_target

        _, problem, tokens = key
        with _lock:
            state = _states.get(key)
            mine = state is None
            if mine:
                state = _states[key] = _Compile()
        if mine:
            try:
                _start(state, problem, cuda_target(key[0]), n, tokens, quick, twins_key(key))
            except BaseException:
                state.ready.set()
                state.twins.set()
                raise
            finally:
                state.first.set()
        else:  # another thread started it: wait, so that this one's launches compile nothing alongside
            state.first.wait()
        if not state.ready.is_set():
            plan.run_early_until(state.ready, state.twins)
    except Exception as exc:  # noqa: BLE001 - the launches compile what they need, as without this
        _warn(exc)


def key_ahead() -> threading.Thread | None:
    """Start computing Triton's installation key in a thread (called as this module is imported);
    returns the thread, or None where it does not start.

    Every process's first Triton compile, a disk-cache hit too, computes ``triton_key()``: a SHA-256
    over Triton's compiler files and its 400+ MB ``libtriton`` (0.49 s of a 0.51 s warm-cache
    compile of three kernels on a 2-core CPU), then keeps it (``functools.lru_cache``). Computed here
    beside the rest of the process's start (hashlib lets go of the GIL while it hashes), a first
    training call on a warm cache finds it ready. Every package it walks is imported by then (Triton
    imports its backends and ``triton.language``'s extras), so the thread takes no import lock. Not
    started in the interpreter (nothing compiles), in a child of ``multiprocessing`` (data-loader
    workers launch no kernels; ranks started by ``torch.multiprocessing.spawn`` are such children too,
    and their first compile computes the key as before), or with ``CAKECONV_KEY_AHEAD=0``.
    """
    from .constants import INTERPRET

    if INTERPRET or os.environ.get(ENV_KEY_AHEAD, "1") == "0":
        return None
    import multiprocessing

    if multiprocessing.parent_process() is not None:
        return None
    from triton.runtime.cache import triton_key

    def run():
        with contextlib.suppress(Exception):  # the first compile computes it, as without this thread
            triton_key()

    thread = threading.Thread(target=run, name="cakeconv-triton-key", daemon=True)
    thread.start()
    return thread


_key_thread = key_ahead()
