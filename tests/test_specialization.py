"""Tier 1 (no GPU): every Triton launch compiles for sm_90 with Triton's own specialization.

Triton specializes integer arguments at launch (a value of 1 becomes a compile-time constant,
multiples of 16 get a divisibility hint) and pointers by 16-byte alignment; the CPU interpreter
does neither, so the interpreter tier cannot see code that only compiles for some values (a
one-segment KCP rank once failed to compile on the GPU: "Loop carried variable span changed type").
Here the launchers run on CPU tensors with launches recorded instead of executed
(``kernels.launch.record_launches``), for the cases of tests/launch_cases.py (every integer argument
at 1, at multiples of 16 and at ordinary values). For every recorded launch:

1. Triton's own binder for an sm_90 target computes the specialization (what ``kernel[grid]``
   would compile on the H200), and the kernel's front end compiles it to TTIR;
2. launches with equal keys (the key under which ``Kernel.launch`` caches the compiled kernel and
   launches it directly) have equal specializations: a launch can never run a kernel compiled for
   other argument properties;
3. every integer argument is typed plain i32, never specialized: the kernels mark them
   ``do_not_specialize``, so a new integer argument without it fails here, by name.

And each kernel's source also compiles with specialization forced ON for all integer arguments at
1 and at 16 (the values that broke it before), so dropping ``do_not_specialize`` later stays safe.
"""

from __future__ import annotations

import collections

import pytest
import torch
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import KernelParam

from cakeconv.cake_causal_conv1d_det_train_backend import checks
from cakeconv.cake_causal_conv1d_det_train_backend.kernels import launch, specialization
from tests import launch_cases
from tests.helpers import INTERPRET

pytestmark = pytest.mark.skipif(INTERPRET, reason="tier 1: the launchers pick GPU configurations outside the interpreter")

TARGET = GPUTarget("cuda", 90, 32)
BACKEND = make_backend(TARGET)


def triton_specialization(fn, args, options, params=None):
    """(options, signature, constexprs, attrs) that ``fn[grid](*args, **options)`` compiles on sm_90."""
    return specialization.triton_specialization(fn, args, options, TARGET, params)


def compile_front_end(fn, options, signature, constexprs, attrs):
    """AST -> TTIR (+ the TTIR passes) for sm_90: where argument types and constants are used. The kernels'
    cache keys are computed in the library's fixed order first, as before any compile of the library's
    (launch.cache_keys_in_fixed_order): a key computed here first would differ from a fresh process's."""
    from triton._C.libtriton import ir

    launch.cache_keys_in_fixed_order()

    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    context = ir.context()
    ir.load_dialects(context)
    BACKEND.load_dialects(context)
    module = src.make_ir(TARGET, options, BACKEND.get_codegen_implementation(options), BACKEND.get_module_map(),
                         context)
    stages = {}
    BACKEND.add_stages(stages, options, src.language)
    return stages["ttir"](module, {"hash": "test", "target": TARGET, **options.__dict__})


def _frozen(spec):
    options, signature, constexprs, attrs = spec
    return (tuple(sorted(options.__dict__.items(), key=lambda kv: kv[0])).__repr__(), tuple(signature.items()),
            tuple(sorted((k, repr(v)) for k, v in constexprs.items())),
            tuple(sorted((k, repr(v)) for k, v in attrs.items())))


@pytest.fixture(scope="module")
def recorded():
    """Every launch of every case, recorded on CPU tensors (backend "triton", nothing runs), with the
    launches of the quick twins of the op's plans (compile_ahead.py: what a first training step runs
    while the full kernels compile)."""
    real = checks.INTERPRET
    checks.INTERPRET = True  # lets backend="triton" take CPU tensors; launch.py keeps its GPU configs
    try:
        with launch.record_launches(twins=True) as launches:
            for name in launch_cases.SINGLE_CASES:
                launch_cases.run_single(name, "cpu", "triton")
            for name in launch_cases.KCP_CASES:
                launch_cases.run_kcp(name, "cpu", "triton")
            for name in launch_cases.RANK_CASES:
                launch_cases.record_kcp_rank(name)
    finally:
        checks.INTERPRET = real
    return launches


def _int_args(kernel):
    return [p.name for p in kernel.fn.params if not p.is_constexpr and p.annotation_type is None
            and not p.name.endswith("_ptr")]


def test_every_kernel_is_launched(recorded):
    assert {r.kernel.name for r in recorded} == {k.name for k in launch.KERNELS}


def test_integer_arguments_cover_1_multiples_of_16_and_others(recorded):
    """The cases reach, for every integer argument of every kernel, the value 1 (where the problem
    allows it), a multiple of 16 and an ordinary value."""
    seen = collections.defaultdict(set)
    for r in recorded:
        for p, a in zip(r.kernel.fn.params, r.args):
            if not p.is_constexpr and type(a) is int:
                seen[(r.kernel.name, p.name)].add(a)
    missing = []
    for (kernel, arg), values in sorted(seen.items()):
        kinds = {"1": 1 in values, "16k": any(v % 16 == 0 and v > 0 for v in values),
                 "other": any(v != 1 and v % 16 for v in values)}
        if launch_cases.cannot_be_one(kernel, arg):
            kinds.pop("1")
        if not all(kinds.values()):
            missing.append(f"{kernel}.{arg}: {sorted(values)[:12]}")
    assert not missing, "integer arguments not covered: " + "; ".join(missing)


def test_integer_arguments_are_never_specialized(recorded):
    bad = set()
    for r in recorded:
        _, signature, constexprs, attrs = triton_specialization(r.kernel.fn, r.args, r.options)
        for i, p in enumerate(r.kernel.fn.params):
            if not p.is_constexpr and type(r.args[i]) is int:
                if signature[p.name] != "i32" or (i,) in constexprs or attrs.get((i,)):
                    bad.add(f"{r.kernel.name}.{p.name}")
    assert not bad, f"specialized integer arguments (mark them do_not_specialize): {sorted(bad)}"


def test_equal_keys_mean_equal_specializations_and_every_launch_compiles(recorded):
    by_key = {}
    compiled = set()
    for r in recorded:
        spec = triton_specialization(r.kernel.fn, r.args, r.options)
        frozen = _frozen(spec)
        assert r.key is not None, f"{r.kernel.name}: an aligned launch without a fast-path key"
        seen = by_key.setdefault((r.kernel.name, r.key), frozen)
        assert seen == frozen, f"{r.kernel.name}: one key, two specializations"
        if (r.kernel.name, frozen) not in compiled:
            compile_front_end(r.kernel.fn, *spec)
            compiled.add((r.kernel.name, frozen))
    assert len(compiled) >= len(launch.KERNELS)


def test_unaligned_pointer_takes_tritons_own_path():
    x = torch.zeros(33 * 8, dtype=torch.bfloat16)[1:].view(-1)[: 32 * 8].view(32, 8)  # 2-byte offset
    w = torch.zeros(8, 4)
    y = torch.empty(32, 8, dtype=torch.bfloat16)
    with launch.record_launches() as launches:
        launch.triton_forward(x, w, None, None, None, y)
    assert len(launches) == 1 and launches[0].key is None


@pytest.mark.parametrize("value", [1, 16])
def test_kernel_sources_compile_with_every_integer_specialized(recorded, value):
    """Every kernel's source, with Triton's specialization forced on for all its integer
    arguments set to ``value`` (1: compile-time constants; 16: divisibility hints)."""
    done = set()
    for r in recorded:
        if r.kernel.name in done:
            continue
        done.add(r.kernel.name)
        fn = r.kernel.fn
        params = [KernelParam(p.num, p._param, False, False) for p in fn.params]
        args = tuple(value if (not p.is_constexpr and type(a) is int) else a for p, a in zip(fn.params, r.args))
        spec = triton_specialization(fn, args, r.options, params)
        compile_front_end(fn, *spec)
    assert done == {k.name for k in launch.KERNELS}


def test_quick_twins_are_recorded_beside_their_kernels(recorded):
    """The op's forward and backward launches in the cases come with their quick twins' (every width,
    activation, dtype and layout of the cases), so the tests above check the twins as well: a twin's
    launch runs a twin kernel or a kernel that serves both (the group kernel, the index build), and a
    twin kernel runs only as a twin."""
    twins = [r for r in recorded if r.twin]
    assert {r.kernel for r in twins} >= set(launch.QUICK_KERNELS)
    assert all(r.kernel not in launch.WITH_TWINS for r in twins)
    assert all(r.twin for r in recorded if r.kernel in launch.QUICK_KERNELS)
    assert len({(r.kernel.name, r.key) for r in twins if r.kernel in launch.QUICK_KERNELS}) >= 20
