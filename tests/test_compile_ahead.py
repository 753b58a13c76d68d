"""The training step's kernels compiled side by side on first use (compile_ahead.py).

Tier 1 (CPU): which plans it applies to; that the first training step of a problem (the autograd
op, or the backward entry point) asks for the problem's compile once, from inside the autograd
Function's forward, with the representative calls of ``cakeconv.warmup`` recorded there (nested
autograd) without changing a bit of the step's results and without leaving their plans behind; the
two tiers (the quick twins compiled in the calling thread's wait, the full variants in a background
thread, the plan told to run the twins until they are ready); ``CAKECONV_QUICK_KERNELS=0`` (one
tier, waited for) and ``CAKECONV_COMPILE_THREADS=0`` (off); a failure of either tier warns once and
the step runs. The CPU has no CUDA device, so those tests stand in the device capability and the
problem of the reference backend's plan; the compile itself is checked for sm_90: threads write the
same cubins as one thread (the forward's variants, to keep CI short), and the quick twins of a
step compile through ptxas. On a GPU (marked ``gpu``): a cold first step compiles in the worker
threads only, and the later steps at other token and document counts compile nothing. (That the
twins compute the full kernels' bits: the interpreter tier, tests/test_triton_interpret.py.)
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import types
import warnings

import pytest
import torch

from cakeconv import cake_causal_conv1d_det, cake_causal_conv1d_det_train_backward, cake_causal_conv1d_det_train_forward
from cakeconv import warmup as warmup_module
from cakeconv.cake_causal_conv1d_det_train_backend import compile_ahead, conv
from cakeconv.cake_causal_conv1d_det_train_backend.kernels.specialization import cuda_target
from cakeconv.warmup import MULTI_GROUP_S, ONE_GROUP_S, WarmupProblem, regime_tokens
from tests.helpers import MAMBA_PAIR_STEPS, FakeWarmup

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SM90 = cuda_target(90)


def test_threads_from_the_environment(monkeypatch):
    monkeypatch.delenv(compile_ahead.ENV_THREADS, raising=False)
    assert compile_ahead.threads() == (os.cpu_count() or 1)
    monkeypatch.setenv(compile_ahead.ENV_THREADS, "0")
    assert compile_ahead.threads() == 0
    monkeypatch.setenv(compile_ahead.ENV_THREADS, "six")
    with pytest.raises(ValueError, match="'six'"):
        compile_ahead.threads()


def _plan(x_stride=512, b_dtype=None, device_index=0, fwd=object(), cu_dtype=torch.int64, S=100):
    return types.SimpleNamespace(fwd=fwd, device_index=device_index, S=S, C=512, dtype=torch.bfloat16, W=3,
                                 activation=None, _layout=(x_stride, torch.float32, b_dtype, cu_dtype, 5))


def test_which_plans_it_applies_to():
    assert compile_ahead.problem_of(_plan()) == WarmupProblem(512, torch.bfloat16, torch.float32, False, 3, None,
                                                              torch.int64)
    assert compile_ahead.problem_of(_plan(b_dtype=torch.float32)).bias
    assert compile_ahead.problem_of(_plan(cu_dtype=None)).cu_dtype == torch.int32
    assert compile_ahead.problem_of(_plan(x_stride=1024)).mamba_ssm_row_stride == 1024  # rows of a wider tensor
    assert compile_ahead.problem_of(_plan(b_dtype=torch.bfloat16)) is None  # a bias of another dtype
    assert compile_ahead.problem_of(_plan(device_index=-1)) is None  # not a CUDA device
    assert compile_ahead.problem_of(_plan(fwd=None)) is None  # no Triton fast path


class Asked(list):
    """The problems a compile ahead was asked for, (C, W, activation, sm, full variants, regime tokens)
    each; ``compiles``: (tier, in the main thread, threads, variants) of each compile_items call;
    ``spawned``: (problem, sm, processes, regime tokens) of each background warm-up started."""

    def __init__(self):
        super().__init__()
        self.compiles, self.spawned = [], []


@pytest.fixture
def asked(monkeypatch, tmp_path):
    """The problems the compile is asked for, on the CPU's reference backend: each plan stands for a
    CUDA plan of its problem, the device for an sm_90 one; the compile records the problem's
    representative calls (as the real one does) and compiles nothing."""
    import threading

    calls = Asked()
    real_items = compile_ahead.training_step_items
    twins = []

    def training_step_items(problem, target, tokens=None):
        full, quick = real_items(problem, target, tokens)
        calls.append((problem.C, problem.width, problem.activation, target.arch, len(full), tokens))
        twins.append(quick)
        return full, quick

    def compile_items(items, target, n_threads):
        tier = "quick" if any(items and all(item in q for item in items) for q in twins) else "full"
        calls.compiles.append((tier, threading.current_thread() is threading.main_thread(), n_threads, len(items)))

    def spawn_warmup(problem, target, n, tokens=None):
        calls.spawned.append((problem, target.arch, n, tokens))
        compile_ahead.write_marker(problem, target, tokens)  # as the warm-up of a problem and regime does
        return FakeWarmup()

    monkeypatch.setattr(compile_ahead, "spawn_warmup", spawn_warmup)
    monkeypatch.setattr(compile_ahead, "_children", [])
    monkeypatch.setattr(compile_ahead, "_twin_threads", [])
    monkeypatch.setattr(compile_ahead, "_states", {})
    monkeypatch.setattr(compile_ahead, "_twins_compiled", set())
    monkeypatch.setattr(compile_ahead, "problem_of", lambda plan: WarmupProblem(
        plan.C, plan.dtype, torch.float32, False, plan.W, plan.activation, torch.int32))
    monkeypatch.setattr(compile_ahead, "tokens_of", lambda plan: regime_tokens(plan.S))  # packed, cu_seqlens
    monkeypatch.setattr(compile_ahead, "training_step_items", training_step_items)
    monkeypatch.setattr(compile_ahead, "compile_items", compile_items)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    monkeypatch.setenv(compile_ahead.ENV_THREADS, "4")
    monkeypatch.delenv(compile_ahead.ENV_QUICK, raising=False)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))  # where the markers go
    conv._plans.clear()
    yield calls
    assert compile_ahead.wait_for_kernels(10)  # no background compile left behind


def _step(S, C, W=4, activation="silu", seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(S, C, generator=g).to(torch.bfloat16).requires_grad_(True)
    w = (0.5 * torch.randn(C, W, generator=g)).requires_grad_(True)
    cu = torch.tensor([0, S // 3, S], dtype=torch.int32)
    y = cake_causal_conv1d_det(x, w, cu_seqlens=cu, activation=activation)
    y.backward(torch.randn(S, C, generator=g).to(torch.bfloat16))
    return y.detach(), x.grad, w.grad


def test_the_first_training_step_of_a_problem_asks_once(asked, monkeypatch):
    from cakeconv.cake_causal_conv1d_det_train_backend.kernels import specialization

    built = []
    monkeypatch.setattr(specialization, "build_launcher", lambda source, name: built.append(source))
    first = _step(64, 16)
    assert compile_ahead.wait_for_kernels(10)  # (the recording below would run this problem's twins before)
    # the launchers of the twins and of the full kernels, each once, built beside the twins' compile
    assert len(built) >= 4 and len(set(built)) == len(built)
    one_group = len(warmup_module.problem_specializations([WarmupProblem(16)], SM90, (ONE_GROUP_S,)))
    assert asked == [(16, 4, "silu", 90, one_group, (ONE_GROUP_S,))] and one_group == 5  # the regime's variants
    # the quick twins: the forward's in the calling thread (waited for), the backward's in another (the backward
    # waits for them), then the full variants in a background warm-up
    assert sorted(asked.compiles) == [("quick", False, 4, 2), ("quick", True, 4, 3)]
    assert asked.spawned == [(WarmupProblem(16), 90, 4, (ONE_GROUP_S,))]
    assert all(sig[3] != torch.device("cpu") or sig[-2] != "triton" for sig in conv._plans)  # no recording plan kept
    _step(100, 16, seed=1)  # other token and document counts in the regime: the same problem
    assert len(asked) == 1
    _step(9000, 16)  # several groups of the dweight tree: that regime's variants, once
    _step(20000, 16, seed=2)
    assert asked[1][4:] == (6, (MULTI_GROUP_S,)) and len(asked) == 2
    _step(64, 24)  # a new C: the twins compiled for C = 16 serve it (nothing recorded); its full variants' warm-up
    assert len(asked) == 2 and asked.spawned[-1] == (WarmupProblem(24), 90, 4, (ONE_GROUP_S,))
    _step(64, 16, W=3, activation=None)  # another width: twins of its own
    assert [a[:3] for a in asked[2:]] == [(16, 3, None)]
    assert compile_ahead.wait_for_kernels(10)
    monkeypatch.setattr(compile_ahead, "_states", {})
    monkeypatch.setattr(compile_ahead, "_twins_compiled", set())
    conv._plans.clear()
    monkeypatch.setenv(compile_ahead.ENV_QUICK, "0")
    asked.compiles.clear()
    _step(64, 32)  # no quick tier: the full variants, waited for in the calling thread
    assert asked.compiles == [("full", True, 4, 5)] and len(asked.spawned) == 4
    monkeypatch.setattr(compile_ahead, "_states", {})
    monkeypatch.setattr(compile_ahead, "_twins_compiled", set())
    conv._plans.clear()
    monkeypatch.setenv(compile_ahead.ENV_THREADS, "0")
    again = _step(64, 16)  # off: the same step, nothing asked
    assert len(asked) == 4
    for a, b in zip(first, again):
        assert torch.equal(a, b)


def test_a_later_process_finds_the_marker_and_asks_nothing(asked, monkeypatch):
    _step(64, 16)
    assert len(asked) == 1
    marker = compile_ahead.marker_path(WarmupProblem(16, torch.bfloat16, torch.float32, False, 4, "silu",
                                                     torch.int32), SM90, (ONE_GROUP_S,))
    assert compile_ahead.wait_for_kernels(10) and os.path.exists(marker)  # written once the full ones are in
    monkeypatch.setattr(compile_ahead, "_states", {})  # a new process: nothing done in it yet
    monkeypatch.setattr(compile_ahead, "_twins_compiled", set())
    conv._plans.clear()
    _step(64, 16)
    assert len(asked) == 1
    os.remove(marker)  # the marker gone (another cache, another Triton or kernel version): asked again
    monkeypatch.setattr(compile_ahead, "_states", {})
    monkeypatch.setattr(compile_ahead, "_twins_compiled", set())
    conv._plans.clear()
    _step(64, 16)
    assert len(asked) == 2


def test_the_compile_says_when_it_starts_and_ends(asked, caplog, monkeypatch):
    """A compile of minutes must not look like a hang: lines on the "cakeconv" logger, at WARNING in
    a single process (and on rank 0), INFO on other ranks; a marker found says nothing."""
    import logging

    with caplog.at_level(logging.INFO, logger="cakeconv"):
        _step(64, 16)
        assert compile_ahead.wait_for_kernels(10)
        lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name.startswith("cakeconv")]
        assert [lv for lv, _ in lines] == [logging.WARNING] * 3, lines
        assert "compiling 5 quick kernel variants of C=16" in lines[0][1] and "sm_90" in lines[0][1]
        assert "quick kernels of C=16" in lines[1][1] and "in the background" in lines[1][1]
        assert "the forward's in" in lines[1][1] and "recording the step" in lines[1][1]
        assert "the full kernel variants of C=16" in lines[2][1] and " ready in " in lines[2][1]
        caplog.clear()
        _step(64, 40)  # a new C: the twins are there; a line when its background compile starts and one when it ends
        assert compile_ahead.wait_for_kernels(10)
        lines = [r.getMessage() for r in caplog.records if r.name.startswith("cakeconv")]
        assert len(lines) == 2 and "C=40" in lines[0] and "runs the quick kernels compiled for an earlier" in lines[0]
        assert "the full kernel variants of C=40" in lines[1], lines
        caplog.clear()
        monkeypatch.setattr(compile_ahead, "_states", {})  # a new process: the marker is there now
        monkeypatch.setattr(compile_ahead, "_twins_compiled", set())
        conv._plans.clear()
        _step(64, 16)
        assert not [r for r in caplog.records if r.name.startswith("cakeconv")]
        monkeypatch.setattr(compile_ahead, "_leading_process", lambda: False)  # a rank other than 0
        _step(64, 24)
        assert compile_ahead.wait_for_kernels(10)
        assert [r.levelno for r in caplog.records if r.name.startswith("cakeconv")] == [logging.INFO] * 3
        caplog.clear()
        monkeypatch.setenv(compile_ahead.ENV_QUICK, "0")  # one tier: a line when it starts and one when it ends
        _step(64, 32)
        lines = [r.getMessage() for r in caplog.records if r.name.startswith("cakeconv")]
        assert len(lines) == 2 and "the training step's 5 kernel variants of C=32" in lines[0], lines


def test_a_second_thread_waits_for_the_first_ones_compile(asked, monkeypatch):
    import threading
    import time

    started, events = threading.Event(), []

    def slow(items, target, n_threads):  # the quick tier: the forward's twins here, the backward's in a thread
        started.set()
        time.sleep(0.3 if threading.current_thread() is first else 0.6)
        events.append(("compiled" if threading.current_thread() is first else "backward's compiled",
                       time.perf_counter()))

    release = threading.Event()  # the full variants' warm-up: still running when both plans are told
    monkeypatch.setattr(compile_ahead, "compile_items", slow)
    monkeypatch.setattr(compile_ahead, "spawn_warmup", lambda *args: FakeWarmup(release=release))
    plans = [types.SimpleNamespace(ahead=False, S=64, C=16, dtype=torch.bfloat16, W=4, activation="silu",
                                   device_index=0, told=[]) for _ in range(2)]
    for plan in plans:
        plan.run_early_until = lambda ready, twins, told=plan.told: told.append((ready, twins))
    first = threading.Thread(target=compile_ahead.before_training_step, args=(plans[0],))
    first.start()
    started.wait(5)
    compile_ahead.before_training_step(plans[1])  # the same problem, while the first thread compiles it
    events.append(("second returned", time.perf_counter()))
    first.join()
    forward = [e[0] for e in events if e[0] != "backward's compiled"]
    assert forward == ["compiled", "second returned"] and plans[1].ahead
    # both run the quick twins until the full variants are in (the same events), their backward once the
    # backward's twins are in
    assert plans[0].told[0] == plans[1].told[0] and not compile_ahead.wait_for_kernels(0)
    assert plans[0].told[0][1].wait(5) and [e[0] for e in events][-1] == "backward's compiled"
    release.set()
    assert compile_ahead.wait_for_kernels(10)


def test_the_backward_entry_point_asks_and_the_forward_alone_does_not(asked):
    x = torch.randn(64, 16).to(torch.bfloat16)
    w = torch.randn(16, 4)
    y = cake_causal_conv1d_det_train_forward(x, w)  # no backward follows: compiles on launch as before
    assert asked == []
    cake_causal_conv1d_det_train_backward(torch.randn_like(y), x, w)
    assert [a[:3] for a in asked] == [(16, 4, "silu")]


def test_the_regime_of_a_plan():
    """Packed rows with cu_seqlens (contiguous, or rows of a wider tensor as in mamba_ssm's layout): the
    variants of their regime (one group of the dweight tree up to S = 8,192, more above); [B, T, C] and
    one sequence: the problem's whole set (None)."""
    assert compile_ahead.tokens_of(_plan(S=8192)) == (ONE_GROUP_S,)
    assert compile_ahead.tokens_of(_plan(S=8193)) == (MULTI_GROUP_S,)
    assert compile_ahead.tokens_of(_plan(cu_dtype=None)) is None  # [B, T, C] or one sequence
    assert compile_ahead.tokens_of(_plan(x_stride=1024, S=9000)) == (MULTI_GROUP_S,)  # rows of a wider tensor
    assert compile_ahead.tokens_of(_plan(x_stride=1024, cu_dtype=None)) is None


@pytest.mark.parametrize("tier", ["quick", "full"])
def test_a_failure_warns_once_and_the_step_runs(asked, monkeypatch, tmp_path, tier):
    """A compile that fails, of the quick twins (in the calling thread) or of the full variants (the
    background warm-up exits with an error): one warning, the step's bits as without it, and the plans
    run their own kernels (the launches compile what they need)."""
    want = _step(64, 16)
    assert compile_ahead.wait_for_kernels(10)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "other_cache"))  # no marker there
    monkeypatch.setattr(compile_ahead, "_states", {})
    monkeypatch.setattr(compile_ahead, "_twins_compiled", set())
    monkeypatch.setattr(compile_ahead, "_warned", False)
    conv._plans.clear()

    def broken(items, target, n_threads):
        if tier == "quick":
            raise OSError("no space left on device")

    monkeypatch.setattr(compile_ahead, "compile_items", broken)
    if tier == "full":
        monkeypatch.setattr(compile_ahead, "spawn_warmup", lambda *args: FakeWarmup(1, "OSError: no space left on device"))
    with pytest.warns(RuntimeWarning, match="no space left on device"):
        got = _step(64, 16)
        assert compile_ahead.wait_for_kernels(10)
    for a, b in zip(want, got):
        assert torch.equal(a, b)
    assert all(state.ready.is_set() for state in compile_ahead._states.values())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _step(64, 24)  # another problem fails too, silently now
        assert compile_ahead.wait_for_kernels(10)


def _spec_texts(items) -> set:
    return {(name, repr((sorted(sig.items()), sorted(consts.items()), sorted(attrs.items()), sorted(opts.__dict__.items()))))
            for name, (opts, sig, consts, attrs) in items}


def test_quick_twins_of_a_training_step_serve_every_channel_count_and_stride():
    """The quick tier's items: the twins of the step's forward and backward launches (with the group kernel
    and the index build they launch), one set for every C and row stride of a problem's dtypes, width and
    activation, so that a new C's first step finds them compiled (``twins_key``); the full items: the
    step's own variants, none of a twin."""
    from collections import Counter

    from cakeconv.cake_causal_conv1d_det_train_backend.kernels import launch

    full, quick = compile_ahead.training_step_items(WarmupProblem(256), SM90, (MULTI_GROUP_S,))
    assert Counter(name for name, _ in full) == {"cake_conv_fwd_kernel": 2, "cake_conv_bwd_kernel": 2,
                                                 "cake_conv_bwd_group_kernel": 1, "cake_segment_ids_kernel": 1}
    assert Counter(name for name, _ in quick) == {"cake_conv_fwd_quick_kernel": 2, "cake_conv_bwd_quick_kernel": 2,
                                                  "cake_conv_bwd_group_kernel": 1, "cake_segment_ids_kernel": 1}
    assert {launch.FWD_QUICK.name, launch.BWD_QUICK.name} <= {name for name, _ in quick}
    key = lambda problem: compile_ahead.twins_key((90, problem, (MULTI_GROUP_S,)))  # noqa: E731
    for tokens in ((MULTI_GROUP_S,), (ONE_GROUP_S,)):
        for problems in ([WarmupProblem(C) for C in (256, 16, 136, 2048, 4352)],
                         [WarmupProblem(C, bias=True, width=7, activation=None) for C in (64, 1160)],
                         [WarmupProblem(512, mamba_ssm_row_stride=1024), WarmupProblem(2048, mamba_ssm_row_stride=4352)]):
            sets = [_spec_texts(compile_ahead.training_step_items(p, SM90, tokens)[1]) for p in problems]
            assert all(s == sets[0] for s in sets), (tokens, problems[0])
            assert len({key(p) for p in problems}) == 1
    assert key(WarmupProblem(512)) != key(WarmupProblem(512, width=3))
    # mamba_ssm's layout: a key of its own, and its twins are among those of the contiguous rows
    assert key(WarmupProblem(512)) != key(WarmupProblem(512, mamba_ssm_row_stride=1024))
    for tokens in ((MULTI_GROUP_S,), (ONE_GROUP_S,), None):
        contiguous, mamba = (_spec_texts(compile_ahead.training_step_items(p, SM90, tokens)[1])
                             for p in (WarmupProblem(512), WarmupProblem(2048, mamba_ssm_row_stride=4352)))
        assert mamba < contiguous, tokens
    # the keys as a first step forms them, of plans: packed rows at C = 512, then a new C, rows of a wider
    # tensor (the stride case of benchmarks/first_step.py), a bias; and the other regime
    def plan_key(**kw):
        plan = _plan(**{"S": 32768, "cu_dtype": torch.int32, **kw})
        return compile_ahead.twins_key((90, compile_ahead.problem_of(plan), compile_ahead.tokens_of(plan)))

    compile_ahead._twins_compiled.add(plan_key())
    try:
        assert plan_key(x_stride=1536) != plan_key()
        assert compile_ahead._twins_ready(plan_key(x_stride=1536))
        assert not compile_ahead._twins_ready(plan_key(b_dtype=torch.float32))
        assert not compile_ahead._twins_ready(plan_key(S=4096))  # one group of the dweight tree: other twins
        assert not compile_ahead._twins_ready(plan_key(x_stride=1536, S=4096))
    finally:
        compile_ahead._twins_compiled.clear()


def test_the_launchers_built_ahead_are_the_launches_own(monkeypatch):
    """A kernel's first launch in a process builds its launcher from the C source that Triton's
    CudaLauncher generates; ``build_launchers`` builds the same sources, one per argument-type
    signature: a step's twins and full kernels (W = 4, several groups) need 6, the same for every C.
    Without the CUDA driver's library (this machine) the thread says why, and the launches build
    their own as before."""
    from triton.backends.nvidia import driver
    from triton.compiler import ASTSource

    from cakeconv.cake_causal_conv1d_det_train_backend.kernels import launch, specialization

    full, quick = compile_ahead.training_step_items(WarmupProblem(512), SM90, (MULTI_GROUP_S,))
    fns = {k.name: k.fn for k in launch.KERNELS}
    launched = []
    monkeypatch.setattr(driver, "compile_module_from_src",
                        lambda src, name, **kw: launched.append(src) or types.SimpleNamespace(launch=None))
    monkeypatch.setattr(driver, "library_dirs", lambda: [])
    metadata = types.SimpleNamespace(num_ctas=1, global_scratch_size=0, global_scratch_align=1,
                                     profile_scratch_size=0, profile_scratch_align=1,
                                     launch_cooperative_grid=False, launch_pdl=False)
    for name, (options, signature, constexprs, attrs) in quick + full:
        driver.CudaLauncher(ASTSource(fn=fns[name], signature=signature, constexprs=constexprs, attrs=attrs), metadata)
        assert launched[-1] == specialization.launcher_source(fns[name], (options, signature, constexprs, attrs))
    built = {}
    monkeypatch.setattr(specialization, "build_launcher",
                        lambda source, name: built.setdefault(name, []).append(source))
    thread = compile_ahead.build_launchers(quick + full, 3)
    thread.join()
    assert sorted(built["__triton_launcher"]) == sorted(set(launched)) and len(set(launched)) == 6
    assert thread.outcome == "6 launchers built or found"
    with open(os.path.join(driver.dirname, "driver.c")) as f:  # what CudaUtils builds on the first launch
        assert built["cuda_utils"] == [f.read()]
    built.clear()
    other_full, other_quick = compile_ahead.training_step_items(WarmupProblem(2048), SM90, (MULTI_GROUP_S,))
    compile_ahead.build_launchers(other_quick + other_full, 3).join()
    assert sorted(built["__triton_launcher"]) == sorted(set(launched))  # another C: the same launchers

    def no_driver(source, name):
        raise AssertionError("libcuda.so cannot found!\nPlease make sure GPU is set up")

    monkeypatch.setattr(specialization, "build_launcher", no_driver)
    thread = compile_ahead.build_launchers(quick, 2)
    thread.join()
    assert thread.outcome == "launchers not built (AssertionError: libcuda.so cannot found!)"


def test_the_quick_environment_switch(monkeypatch):
    monkeypatch.delenv(compile_ahead.ENV_QUICK, raising=False)
    assert compile_ahead.quick_tier()
    monkeypatch.setenv(compile_ahead.ENV_QUICK, "0")
    assert not compile_ahead.quick_tier()
    monkeypatch.setenv(compile_ahead.ENV_QUICK, "yes")
    with pytest.raises(ValueError, match="'yes'"):
        compile_ahead.quick_tier()


def _cubins(cache) -> dict:
    return {os.path.basename(os.path.dirname(p)) + "/" + os.path.basename(p): open(p, "rb").read()
            for p in glob.glob(os.path.join(cache, "*", "*.cubin"))}


def test_threads_compile_what_one_thread_compiles(tmp_path, monkeypatch):
    """For sm_90 on the CPU: the forward's variants of a problem, in 3 threads and in 1, into two empty
    caches: the same entries, the same cubins (Triton's compile is thread-safe here)."""
    every = warmup_module.problem_specializations([WarmupProblem(256)], SM90)
    forward = [v for k, v in every.items() if k[0] == "cake_conv_fwd_kernel"]
    assert len(forward) >= 2
    caches = {}
    for n in (3, 1):
        monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / f"cache{n}"))
        compile_ahead.compile_items(forward, SM90, n)
        caches[n] = _cubins(str(tmp_path / f"cache{n}"))
    assert len(caches[3]) == len(forward) and caches[3] == caches[1]


@pytest.mark.parametrize("width,activation", [(4, "silu"), (8, None)])
def test_the_quick_twins_compile_for_sm90(tmp_path, monkeypatch, width, activation):
    """The quick tier of a packed step (one group of the dweight tree: forward, one-group backward, both
    with few and many documents, and the index build) compiles for sm_90 through ptxas (on the CPU);
    its variants take seconds where the full ones take tens (W = 8: minutes)."""
    import time

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    _, quick = compile_ahead.training_step_items(WarmupProblem(256, width=width, activation=activation), SM90,
                                                 (ONE_GROUP_S,))
    start = time.perf_counter()
    compile_ahead.compile_items(quick, SM90, 2)
    print(f"W = {width}: {len(quick)} quick twins for sm_90 in {time.perf_counter() - start:.1f} s")
    assert len(_cubins(str(tmp_path / "cache"))) == len(quick) == 5


_COLD_STEPS = """
import json, threading, time, torch
import triton.runtime.build as build
from triton import knobs
from cakeconv import cake_causal_conv1d_det
events, builds, real_build = [], [], build._build
knobs.compilation.listener = lambda *, src, metadata, metadata_group, times, cache_hit: events.append(
    (threading.current_thread() is threading.main_thread(), cache_hit))
def recording_build(name, *args, **kwargs):  # the C modules (launchers, CUDA utilities) built, not found in the cache
    builds.append((threading.current_thread() is threading.main_thread(), name))
    return real_build(name, *args, **kwargs)
build._build = recording_build
from cakeconv.cake_causal_conv1d_det_train_backend.compile_ahead import wait_for_kernels
C, seconds = 512, []
for rounds in ("quick twins", "full kernels"):  # the second round after the background warm-ups ended
    for S, docs in ((4096, 3), (4096, 1024), (8320, 3), (8320, 2080)):
        t0 = time.perf_counter()
        x = torch.randn(S, C, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w = torch.randn(C, 4, device="cuda", requires_grad=True)
        cu = torch.linspace(0, S, docs + 1, device="cuda").round().int()
        cake_causal_conv1d_det(x, w, cu_seqlens=cu).sum().backward()
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - t0)
    assert wait_for_kernels(600)
print(json.dumps({"compiled_in_main": sum(m and not h for m, h in events),
                  "compiled_in_workers": sum(not m and not h for m, h in events), "seconds": seconds,
                  "built_in_main": [name for m, name in builds if m],
                  "built_in_workers": sum(not m for m, _ in builds)}))
"""


@pytest.mark.gpu
def test_gpu_a_cold_first_step_compiles_in_the_workers_only(tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO, TRITON_CACHE_DIR=str(tmp_path / "cache"))
    env.pop(compile_ahead.ENV_THREADS, None)
    run = subprocess.run([sys.executable, "-c", _COLD_STEPS], capture_output=True, text=True, cwd=REPO, env=env,
                         timeout=600)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    print(result)
    # two regimes: their quick twins (4 + 4, with the index build and the group kernel) in this process's
    # workers; the full variants in the background warm-ups, then loaded from the cache by the launches
    assert result["compiled_in_main"] == 0 and result["compiled_in_workers"] >= 8, result
    # the launchers of both tiers and Triton's CUDA utilities, built beside the twins' compile: the launches,
    # the switch to the full kernels included, build none in the training thread
    assert result["built_in_main"] == [] and result["built_in_workers"] >= 5, result


@pytest.mark.gpu
@pytest.mark.parametrize("C,docs,W,activation", [
    (512, "long", 4, "silu"), (512, "1-8", 4, "silu"), (2048, "1-64", 4, "silu"), (512, "two-groups", 4, "silu"),
    (512, "1-8", 8, "silu"), (512, "long", 7, None)])
def test_gpu_quick_twins_give_the_full_kernels_bits(C, docs, W, activation):
    """On the GPU, at the configurations the heuristics pick: the quick twins (what a first step runs
    while the full variants compile) write the full kernels' y, dx, dweight bits; at W = 4 + SiLU and
    at the wide widths, whose full kernels step 8 rows at a time (the twins one)."""
    from cakeconv.cake_causal_conv1d_det_train_backend.kernels import launch

    S = 20000 if docs == "two-groups" else 8000
    g = torch.Generator(device="cuda").manual_seed(C)
    x = torch.randn(S, C, device="cuda", dtype=torch.bfloat16, generator=g)
    dy = torch.randn(S, C, device="cuda", dtype=torch.bfloat16, generator=g)
    w = 0.5 * torch.randn(C, W, device="cuda", generator=g)
    if docs in ("long", "two-groups"):
        cu = torch.tensor([0, 3, S // 3, S // 3 + 1, S], dtype=torch.int32, device="cuda")
    else:
        top = 9 if docs == "1-8" else 65
        lengths = torch.randint(1, top, (S,), generator=torch.Generator().manual_seed(C))
        ends = lengths.cumsum(0)
        cu = torch.cat([torch.zeros(1, dtype=torch.long), ends[ends < S], torch.tensor([S])]).int().cuda()
    out = {}
    for quick in (False, True):
        meta = launch.optional_meta(None, cu)
        y = torch.empty_like(x)
        launch.prepare_forward(S, C, C, C, x.dtype, w.dtype, *meta, None, width=W, activation=activation,
                               quick=quick).run(x, w, None, cu, y)
        dx, dw = torch.empty_like(x), torch.empty(C, W, device="cuda")
        ws = torch.empty(launch.backward_workspace_floats(S, C, W), device="cuda")
        launch.prepare_backward(S, C, C, C, C, x.dtype, dy.dtype, w.dtype, *meta, None, torch.float32, width=W,
                                activation=activation, quick=quick).run(dy, x, w, None, cu, dx, ws, dw, None)
        out[quick] = (y, dx, dw)
    for name, a, b in zip(("y", "dx", "dw"), out[False], out[True]):
        assert torch.equal(a, b), name


_PAIR_COLD_STEPS = """
import json, threading, torch
from triton import knobs
events = []
knobs.compilation.listener = lambda *, src, metadata, metadata_group, times, cache_hit: events.append(
    (threading.current_thread() is threading.main_thread(), cache_hit, src.fn.__name__))
""" + MAMBA_PAIR_STEPS + """
main = [name for m, hit, name in events if m and not hit]
print(json.dumps({"compiled_in_main": main, "compiled_in_workers": sum(not m and not h for m, h, _ in events)}))
"""


@pytest.mark.gpu
def test_gpu_mamba_ssm_layout_backward_variants_compile_in_the_workers(tmp_path):
    """mamba_ssm's fused path (causal-conv1d's pair on slices of the projection): the forward entry point
    compiles its launches' variants on launch (no backward need follow it), the first backward compiles
    the rest of the layout's training step (its quick twins) in the workers, and later steps, of other
    shapes too, compile nothing in the launching thread."""
    env = dict(os.environ, PYTHONPATH=REPO, TRITON_CACHE_DIR=str(tmp_path / "cache"))
    env.pop(compile_ahead.ENV_THREADS, None)
    run = subprocess.run([sys.executable, "-c", _PAIR_COLD_STEPS], capture_output=True, text=True, cwd=REPO,
                         env=env, timeout=600)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    print(result)
    # the first forward compiles what it launches: the forward's index variant and the index build (the pair's
    # cu_seqlens has B * T + 1 entries, the documents past the last one empty: many segments)
    assert sorted(result["compiled_in_main"]) == ["cake_conv_fwd_kernel", "cake_segment_ids_kernel"], result
    assert result["compiled_in_workers"] >= 5, result


_CAPTURE_EARLY = """
import json, torch
from cakeconv import (cake_causal_conv1d_det_train_backward, cake_causal_conv1d_det_train_backward_workspace_bytes,
                      cake_causal_conv1d_det_train_forward)
from cakeconv.warmup import wait_for_kernels
S, C = 4096, 512
x = torch.randn(S, C, device="cuda", dtype=torch.bfloat16)
dy = torch.randn(S, C, device="cuda", dtype=torch.bfloat16)
w = torch.randn(C, 4, device="cuda")
cu = torch.tensor([0, 100, 101, S], dtype=torch.int32, device="cuda")
y, dx = torch.empty_like(x), torch.empty_like(x)
ws = torch.empty(cake_causal_conv1d_det_train_backward_workspace_bytes(S, C), dtype=torch.uint8, device="cuda")
def step():
    cake_causal_conv1d_det_train_forward(x, w, None, cu, out=y)
    return cake_causal_conv1d_det_train_backward(dy, x, w, None, cu, dx=dx, workspace=ws)[1]
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    step()  # the first step: quick twins, the full kernels compiling in the background
    early = not wait_for_kernels(0)
    want = (y.clone(), dx.clone(), step().clone())
torch.cuda.current_stream().wait_stream(side)
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    dw = step()
ready_after_capture = wait_for_kernels(0)
graph.replay()
torch.cuda.synchronize()
print(json.dumps({"early": early, "ready_after_capture": ready_after_capture,
                  "equal": all(torch.equal(a, b) for a, b in zip(want, (y, dx, dw)))}))
"""


@pytest.mark.gpu
def test_gpu_capturing_a_graph_waits_for_the_full_kernels(tmp_path):
    """A graph captured while the full kernels still compile (its first steps ran the quick twins)
    waits for them and captures them: a graph keeps its kernels. Its replay gives the twins' bits."""
    env = dict(os.environ, PYTHONPATH=REPO, TRITON_CACHE_DIR=str(tmp_path / "cache"))
    for name in (compile_ahead.ENV_THREADS, compile_ahead.ENV_QUICK):
        env.pop(name, None)
    run = subprocess.run([sys.executable, "-c", _CAPTURE_EARLY], capture_output=True, text=True, cwd=REPO, env=env,
                         timeout=600)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    print(result)
    assert result["ready_after_capture"] and result["equal"], result


@pytest.mark.parametrize("problem,tokens", [
    (WarmupProblem(16), (ONE_GROUP_S,)),
    (WarmupProblem(24, torch.float16, torch.bfloat16, True, 7, None, torch.int64), (MULTI_GROUP_S,)),
    (WarmupProblem(4352, bias=True, mamba_ssm_row_stride=8512), None)])
def test_the_background_warmup_command_line_names_the_problem(problem, tokens):
    """What a first step starts in the background is ``python -m cakeconv warmup`` with arguments that
    give back the problem, its regime, the target and the processes."""
    argv = warmup_module.command_line(problem, 90, tokens, 3)
    problems, options = warmup_module.parse_command_line(argv)
    assert problems == [problem] and options.target == "sm_90" and options.jobs == 3
    assert options.tokens == (list(tokens) if tokens else None)


def test_the_background_warmup_compiles_the_steps_full_variants(tmp_path, monkeypatch):
    """For sm_90 on the CPU, a small problem (W = 2, no activation, one group of the dweight tree): the
    background process a first step starts compiles exactly the full variants the step's launches
    ask for (the process's own compile then finds every one in the cache) and writes the regime's
    marker; its exit status is 0."""
    from cakeconv.cake_causal_conv1d_det_train_backend.kernels import launch
    from cakeconv.cake_causal_conv1d_det_train_backend.kernels.specialization import compile_specialization

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    problem = WarmupProblem(16, width=2, activation=None)
    proc = compile_ahead.spawn_warmup(problem, SM90, 2, (ONE_GROUP_S,))
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert os.path.exists(compile_ahead.marker_path(problem, SM90, (ONE_GROUP_S,)))
    full, _ = compile_ahead.training_step_items(problem, SM90, (ONE_GROUP_S,))
    fns = {k.name: k.fn for k in launch.KERNELS}
    assert len(full) == 5 and all(compile_specialization(fns[name], spec, SM90)["cache_hit"] for name, spec in full)


def test_ending_the_process_stops_its_background_warmups(monkeypatch):
    """The training process ends before its background warm-up does: the warm-up's process group is
    stopped (no compile outlives the job that asked for it)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    monkeypatch.setattr(compile_ahead, "_children", [proc])
    monkeypatch.setattr(compile_ahead, "_exiting", False)
    compile_ahead._stop_children()
    assert proc.wait(timeout=10) != 0 and compile_ahead._exiting


def test_ending_the_process_waits_for_the_backward_twins_and_starts_no_warmup(asked, monkeypatch):
    """The process ends while the backward's twins still compile in their thread: the exit waits for that
    thread (a thread inside the compiler while the process tears down could crash it), which then starts
    no background warm-up."""
    import threading

    release = threading.Event()

    def compile_items(items, target, n_threads):
        if any("_bwd_" in name for name, _ in items):
            assert release.wait(10)

    monkeypatch.setattr(compile_ahead, "compile_items", compile_items)
    monkeypatch.setattr(compile_ahead, "_exiting", False)
    plan = types.SimpleNamespace(ahead=False, S=64, C=16, dtype=torch.bfloat16, W=4, activation="silu",
                                 device_index=0, run_early_until=lambda ready, twins: None)
    compile_ahead.before_training_step(plan)  # returns once the forward's twins are in
    assert len(compile_ahead._twin_threads) == 1 and compile_ahead._twin_threads[0].is_alive()
    timer = threading.Timer(0.3, release.set)
    timer.start()
    compile_ahead._stop_children()
    timer.join()
    assert compile_ahead._twin_threads == [] and asked.spawned == []


def test_a_forward_entry_point_joins_a_running_compile_ahead(asked, monkeypatch):
    """The forward entry point (no backward follows: it starts no compile) of a new shape, while the
    background warm-up of its problem runs: its plan runs the quick twins too (it must not compile a
    full variant beside that warm-up); after the warm-up, a new shape's plan runs its own kernels."""
    import threading

    release = threading.Event()
    monkeypatch.setattr(compile_ahead, "spawn_warmup", lambda *args: FakeWarmup(release=release))
    _step(64, 16)
    x, w = torch.randn(100, 16).to(torch.bfloat16), torch.randn(16, 4)
    cake_causal_conv1d_det_train_forward(x, w, None, torch.tensor([0, 30, 100], dtype=torch.int32))
    told = [p for p in conv._plans.values() if p.S == 100]
    assert len(told) == 1 and told[0].joined and told[0].ready is not None and not told[0].ready.is_set()
    release.set()
    assert compile_ahead.wait_for_kernels(10) and told[0].ready.is_set()
    x2 = torch.randn(120, 16).to(torch.bfloat16)
    cake_causal_conv1d_det_train_forward(x2, w, None, torch.tensor([0, 30, 120], dtype=torch.int32))
    after = [p for p in conv._plans.values() if p.S == 120]
    assert len(after) == 1 and after[0].joined and after[0].ready is None
    assert len(asked) == 1  # the forward entry point asked for no compile of its own


def test_a_forward_entry_point_of_a_trained_problems_new_regime_starts_its_compile_ahead(asked):
    """mamba_ssm's pair calls the forward entry point, then the backward one: once a backward has compiled
    a problem's regime ahead, a forward of another regime of that problem starts that regime's compile
    ahead (and runs the twins) instead of compiling a full variant on launch; a problem no backward
    trained keeps compiling on launch."""
    _step(64, 16)  # one group of the dweight tree
    w = torch.randn(16, 4)
    x = torch.randn(9000, 16).to(torch.bfloat16)
    cake_causal_conv1d_det_train_forward(x, w, None, torch.tensor([0, 3000, 9000], dtype=torch.int32))
    plan = [p for p in conv._plans.values() if p.S == 9000]
    assert len(plan) == 1 and plan[0].ahead
    assert [a[5] for a in asked] == [(ONE_GROUP_S,), (MULTI_GROUP_S,)]
    cake_causal_conv1d_det_train_forward(torch.randn(64, 24).to(torch.bfloat16), torch.randn(24, 4))
    assert len(asked) == 2  # C = 24: a problem no backward trained


def test_a_backward_twin_still_compiling_is_waited_for_once():
    """The backward's twins compile while the forward runs: their launch waits for that compile (it must not
    compile them again in the launching thread), once; then it runs until the full kernels are ready."""
    import threading
    import time

    from cakeconv.cake_causal_conv1d_det_train_backend.kernels.launch import EarlyLaunch

    ready, compiled = threading.Event(), threading.Event()
    early = EarlyLaunch(None, ready, False, compiled)
    timer = threading.Timer(0.2, compiled.set)
    timer.start()
    t0 = time.perf_counter()
    assert early.active() and time.perf_counter() - t0 >= 0.15 and early.compiled is None
    assert early.active()
    ready.set()
    assert not early.active()
    timer.join()


def test_recording_a_step_leaves_torchs_first_backward_to_the_step():
    """The compile ahead records a step's launches before its twins compile: that recording calls the op's
    backward as autograd does, not through ``backward(dy)``, whose first call in a process imports torch's
    symbolic-shapes module (seconds on the GPU hosts, then not beside the twins' compile)."""
    code = ("import sys, torch; from cakeconv import warmup as w; w._record(w.WarmupProblem(16), twins=True); "
            "w._record(w.WarmupProblem(16, mamba_ssm_row_stride=40), twins=True); "
            "print('torch.fx.experimental.symbolic_shapes' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300,
                         env=dict(os.environ, PYTHONPATH=REPO))
    assert run.returncode == 0 and run.stdout.split() == ["False"], run.stderr


_KEY_AHEAD = """
import json, multiprocessing, sys
import cakeconv
from cakeconv.cake_causal_conv1d_det_train_backend import compile_ahead
from triton.runtime.cache import triton_key


def child(queue):
    queue.put(compile_ahead.key_ahead() is None)


if __name__ == "__main__":
    thread = compile_ahead._key_thread
    if thread is not None:
        thread.join(120)
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=child, args=(queue,))
    proc.start()
    none_in_child = queue.get(timeout=120)
    proc.join(60)
    print(json.dumps({"thread": thread is not None, "computed": triton_key.cache_info().currsize,
                      "none_in_child": none_in_child}))
"""


@pytest.mark.parametrize("env,started", [({}, True), ({"CAKECONV_KEY_AHEAD": "0"}, False),
                                         ({"TRITON_INTERPRET": "1"}, False)])
def test_tritons_installation_key_is_computed_ahead_at_import(tmp_path, env, started):
    """Importing cakeconv starts a thread computing Triton's installation key (what a warm-cache first
    compile spends most of its time on), and the key is then kept by Triton: not with
    CAKECONV_KEY_AHEAD=0, not in the interpreter, never in a multiprocessing child."""
    script = tmp_path / "key_ahead.py"
    script.write_text(_KEY_AHEAD)
    full_env = {k: v for k, v in os.environ.items() if k not in ("CAKECONV_KEY_AHEAD", "TRITON_INTERPRET")}
    full_env.update(env, PYTHONPATH=REPO)
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=REPO, env=full_env,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out == {"thread": started, "computed": int(started), "none_in_child": True}, out
