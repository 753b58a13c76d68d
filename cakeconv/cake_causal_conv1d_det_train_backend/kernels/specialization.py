"""What Triton compiles for a launch, and compiling it ahead for a GPU target (no GPU needed).

A launch ``fn[grid](*args, **options)`` compiles the kernel for the specialization that Triton's
binder derives from the arguments (each pointer's dtype and 16-byte alignment, integers equal to 1
or divisible by 16 unless ``do_not_specialize``, the constexprs) and the options, for the current
device's target, and keeps the result in its on-disk cache (``TRITON_CACHE_DIR``) under a key of
exactly these (plus the Triton version, the compiler's version and the environment variables that
change code). ``triton_specialization`` runs that binder for a given target;
``compile_specialization`` runs ``triton.compile`` on its result, which writes the same cache
entry a first launch on a GPU of that target would write, or finds it. The tests use the first to
check every launch on sm_90 on the CPU; ``cakeconv.warmup`` uses both to compile a run's kernels
ahead, in parallel.

A kernel's first launch in a process also needs its launcher: a small C module that Triton
generates from the kernel's signature (the argument types; not the constexprs' values, nor the
kernel's code) and builds with the system's C compiler, about 0.3 s, into the same cache, keyed by
its source; the first launch of a process also builds Triton's CUDA utilities module the same way.
``launcher_source`` generates a launcher's source as the launch will; ``build_launcher`` builds it
(or the utilities) ahead, on a machine with the CUDA driver (the modules link against it), so that
the launch loads them.
"""

from __future__ import annotations

import time

from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import create_function_from_signature

WARP_SIZE = 32


def cuda_target(capability: int) -> GPUTarget:
    """The CUDA target of compute capability ``capability`` (e.g. 90 for sm_90: H100, H200)."""
    return GPUTarget("cuda", int(capability), WARP_SIZE)


def current_target() -> GPUTarget | None:
    """The current CUDA device's target, or None without one (no driver is queried then)."""
    import torch

    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    return cuda_target(10 * major + minor)


def triton_specialization(fn, args, options, target: GPUTarget, params=None):
    """(options, signature, constexprs, attrs) that ``fn[grid](*args, **options)`` compiles on ``target``:
    Triton's own binder and packing, run without a device."""
    backend = make_backend(target)
    binder = create_function_from_signature(fn.signature, params or fn.params, backend)
    bound, spec, opts = binder(*args, **options)
    return fn._pack_args(backend, dict(options), bound, spec, opts)


def launcher_source(fn, spec) -> str:
    """The C source of the launcher that the first launch of ``fn`` at ``spec`` (``triton_specialization``'s
    result) builds: Triton's ``CudaLauncher`` generates it from the source's signature and constants (no
    tensor descriptor here)."""
    from triton.backends.nvidia.driver import make_launcher

    _, signature, constexprs, attrs = spec
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    constants = {(src.fn.arg_names.index(k),) if isinstance(k, str) else k: v for k, v in src.constants.items()}
    return make_launcher(constants, dict(src.signature), None)


def driver_utils_source() -> str:
    """The C source of Triton's CUDA utilities module, which the process's first launch builds (or
    loads) before any launcher: ``CudaUtils`` reads it from the backend's ``driver.c``."""
    import os

    from triton.backends.nvidia import driver

    with open(os.path.join(driver.dirname, "driver.c")) as f:
        return f.read()


def build_launcher(source: str, name: str = "__triton_launcher") -> None:
    """Build the C module ``name`` (a launcher, or ``cuda_utils`` of ``driver_utils_source``) of source
    ``source`` into Triton's cache, or find it there (as the launch does). Needs the CUDA driver's
    library (AssertionError from Triton without it)."""
    from triton.backends.nvidia.driver import include_dirs, libraries, library_dirs
    from triton.runtime.build import compile_module_from_src

    compile_module_from_src(src=source, name=name, library_dirs=library_dirs(), include_dirs=include_dirs,
                            libraries=libraries)


def compile_specialization(fn, spec, target: GPUTarget) -> dict:
    """``triton.compile`` of one specialization (``triton_specialization``'s result) for ``target``,
    through Triton's on-disk cache. Returns where the time went, in seconds: ``front_end`` (Python
    AST to TTIR, the TTIR and TTGIR passes), ``llvm`` (LLVM IR and PTX), ``ptxas`` (PTX to cubin),
    ``total`` (wall time of the call), ``cache_hit`` (nothing compiled), ``cache_key`` (Triton's
    hash of the entry) and ``stages`` (each stage's seconds: ast, ttir, ttgir, llir, ptx, cubin)."""
    import triton
    from triton import knobs

    options, signature, constexprs, attrs = spec
    seen = {}

    def listener(*, src, metadata, metadata_group, times, cache_hit):
        seen["times"], seen["cache_hit"], seen["hash"] = times, cache_hit, metadata.get("hash")

    previous = knobs.compilation.listener
    knobs.compilation.listener = listener
    start = time.perf_counter()
    try:
        triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs), target=target,
                       options=options.__dict__)
    finally:
        knobs.compilation.listener = previous
    total = time.perf_counter() - start
    times = seen.get("times")
    stages = dict(times.lowering_stages) if times is not None else {}
    micro = 1e-6
    return {
        "front_end": ((times.ir_initialization if times else 0) + stages.get("ttir", 0) + stages.get("ttgir", 0)) * micro,
        "llvm": (stages.get("llir", 0) + stages.get("ptx", 0)) * micro,
        "ptxas": stages.get("cubin", 0) * micro,
        "total": total,
        "cache_hit": bool(seen.get("cache_hit", False)),
        "cache_key": seen.get("hash"),
        "stages": {"ast": (times.ir_initialization if times else 0) * micro, **{k: v * micro for k, v in stages.items()}},
    }
