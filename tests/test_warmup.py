"""``cakeconv.warmup``: what it compiles is what training launches, through Triton's own cache.

Tier 1 (CPU, no GPU: compiled for sm_90): the warm-up's specializations cover every launch of
ordinary training calls of its problems (other token counts, document counts and layouts, recorded
without running); the compile pool fills a fresh cache and a second warm-up finds every entry;
every kernel's Triton cache key is the same whichever kernel a process hashed first (the fixed
order of ``cache_keys_in_fixed_order``); the command line and its errors.
Tier 4 (GPU, marked ``gpu``): after a warm-up in one process, a training step in a fresh process
with the same cache compiles nothing; the same for mamba_ssm's layout (the causal-conv1d pair on
slices of a wider projection).

Shape legend: S tokens, C channels.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from cakeconv import cake_causal_conv1d_det, warmup as warmup_module
from cakeconv.cake_causal_conv1d_det_train_backend import checks, compile_ahead
from cakeconv.cake_causal_conv1d_det_train_backend.kernels import launch
from cakeconv.cake_causal_conv1d_det_train_backend.kernels.specialization import (
    cuda_target,
    triton_specialization,
)
from cakeconv.warmup import WarmupProblem, problem_specializations, warmup
from tests.helpers import INTERPRET, MAMBA_PAIR_STEPS

pytestmark = pytest.mark.skipif(INTERPRET, reason="tier 1: the warm-up compiles for a GPU target")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SM90 = cuda_target(90)


def _training_launches(problem, S, n_docs, batch=None):
    """The launches of one forward + backward of ``problem`` (recorded, not run)."""
    saved = checks.INTERPRET
    checks.INTERPRET = True
    try:
        shape = (batch, S // batch, problem.C) if batch else (S, problem.C)
        x = torch.empty(shape, dtype=problem.dtype).requires_grad_(True)
        w = torch.zeros(problem.C, problem.width, dtype=problem.weight_dtype).requires_grad_(True)
        b = torch.zeros(problem.C, dtype=problem.weight_dtype).requires_grad_(True) if problem.bias else None
        cu = None
        if not batch:
            cuts = torch.linspace(0, S, n_docs + 1).round().to(problem.cu_dtype)
            cu = torch.unique(cuts)
        with launch.record_launches() as recorded:
            y = cake_causal_conv1d_det(x, w, b, cu_seqlens=cu, activation=problem.activation, backend="triton")
            y.backward(torch.empty_like(y))
    finally:
        checks.INTERPRET = saved
    return recorded


@pytest.mark.parametrize("problem", [WarmupProblem(512), WarmupProblem(64, torch.float32, bias=True, width=7,
                                                                        activation=None, cu_dtype=torch.int64)],
                         ids=str)
def test_warmup_covers_what_training_launches(problem):
    planned = problem_specializations([problem], SM90)
    texts = {text for _, text in planned}
    calls = [(100, 3, None), (777, 1, None), (5000, 1200, None), (20000, 7, None), (20000, 6000, None),
             (20000, 1, 4), (96, 1, 2)]
    for S, n_docs, batch in calls:
        for r in _training_launches(problem, S, n_docs, batch):
            options, signature, constexprs, attrs = triton_specialization(r.kernel.fn, r.args, r.options, SM90)
            text = repr((sorted(signature.items()), sorted(constexprs.items()), sorted(attrs.items()),
                         sorted(options.__dict__.items())))
            assert text in texts, f"{r.kernel.name} of S={S}, {n_docs} documents, batch {batch} is not warmed up"


def test_warmup_covers_mamba_ssm_fused_path_calls():
    """The mamba_ssm layout: the pair on slices of a wider projection (Mamba2: conv 4352 channels of an
    8512-wide in_proj, here scaled down) at other token and document counts launches nothing outside
    the warm-up's set, nor, packed, outside its regime's set (a first step compiles that one), and the
    contiguous problem's set does not cover it."""
    problem = WarmupProblem(96, bias=True, mamba_ssm_row_stride=200)
    texts = {text for _, text in problem_specializations([problem], SM90)}
    regimes = {tokens: {text for _, text in problem_specializations([problem], SM90, tokens)}
               for tokens in ((warmup_module.ONE_GROUP_S,), (warmup_module.MULTI_GROUP_S,))}
    plain = {text for _, text in problem_specializations([WarmupProblem(96, bias=True)], SM90)}
    saved = checks.INTERPRET
    checks.INTERPRET = True
    try:
        for shape, cu in (((700,), [0, 300, 700]), ((9000,), [0, 4, 8, 2000, 9000]), ((3, 50), None),
                          ((10000,), list(range(0, 10000, 3)) + [10000])):
            with launch.record_launches() as recorded:
                warmup_module._mamba_ssm_pair_step(problem, (*shape, problem.C), cu)
            assert recorded
            for r in recorded:
                options, signature, constexprs, attrs = triton_specialization(r.kernel.fn, r.args, r.options, SM90)
                text = repr((sorted(signature.items()), sorted(constexprs.items()), sorted(attrs.items()),
                             sorted(options.__dict__.items())))
                assert text in texts, f"{r.kernel.name} of {shape}, {cu and len(cu) - 1} documents is not warmed up"
                if cu is not None:
                    regime = warmup_module.regime_tokens(shape[0])
                    assert text in regimes[regime], f"{r.kernel.name} of {shape} is not in its regime's set"
    finally:
        checks.INTERPRET = saved
    assert not texts <= plain
    with pytest.raises(ValueError, match="mamba_ssm_row_stride=90"):
        WarmupProblem(96, mamba_ssm_row_stride=90)


def test_warmup_compiles_into_the_cache_and_finds_it_again(tmp_path, monkeypatch):
    """The pool compiles into TRITON_CACHE_DIR; a second warm-up compiles nothing (two cheap kernels
    of a real problem's specializations, to keep CI short)."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    every = problem_specializations([WarmupProblem(256)], SM90)
    cheap = {k: v for k, v in every.items() if k[0] in ("cake_segment_ids_kernel", "cake_conv_bwd_group_kernel")}
    assert len(cheap) == 2
    monkeypatch.setattr(warmup_module, "problem_specializations", lambda problems, target, tokens=None: cheap)
    lines = []
    first = warmup([256], target="sm_90", jobs=2, progress=lines.append)
    assert first["compiled"] == 2 and first["cache_hits"] == 0 and first["target"] == "sm_90"
    assert all(k["ptxas"] > 0 and k["front_end"] > 0 for k in first["kernels"])
    assert lines[0].startswith("warmup: 1 problem(s), 2 kernel variants for sm_90") and "2 compiled" in lines[-1]
    again = warmup([256], target="sm_90", jobs=2, progress=None)
    assert again["compiled"] == 0 and again["cache_hits"] == 2
    assert {k["cache_key"] for k in again["kernels"]} == {k["cache_key"] for k in first["kernels"]}
    # the marker tells a first training step that the problem's whole set is there; a warm-up of some
    # token counts' variants writes the markers of their regimes instead
    marker = compile_ahead.marker_path(WarmupProblem(256), SM90)
    assert os.path.exists(marker)
    os.remove(marker)
    partial = warmup([256], target="sm_90", jobs=1, progress=None, tokens=[250340])
    assert partial["cache_hits"] == 2 and not os.path.exists(marker)
    several = compile_ahead.marker_path(WarmupProblem(256), SM90, (warmup_module.MULTI_GROUP_S,))
    one = compile_ahead.marker_path(WarmupProblem(256), SM90, (warmup_module.ONE_GROUP_S,))
    assert os.path.exists(several) and not os.path.exists(one)
    # mamba_ssm's rows of a wider tensor, packed: the markers of their regimes too (a first step keys them so)
    mamba = WarmupProblem(256, mamba_ssm_row_stride=520)
    warmup([mamba], target="sm_90", jobs=1, progress=None, tokens=[4096])
    assert os.path.exists(compile_ahead.marker_path(mamba, SM90, (warmup_module.ONE_GROUP_S,)))
    assert not os.path.exists(compile_ahead.marker_path(mamba, SM90, (warmup_module.MULTI_GROUP_S,)))


@pytest.mark.parametrize("problem", [WarmupProblem(512), WarmupProblem(256, width=8, activation=None)], ids=str)
def test_warmup_for_token_counts_covers_their_packed_calls(problem):
    """``tokens``: a subset of the full set, about half of it, that still covers packed calls of those
    token counts with any number of documents (one group of the dweight tree and two)."""
    full = {text for _, text in problem_specializations([problem], SM90)}
    for S in (5000, 20000):
        part = {text for _, text in problem_specializations([problem], SM90, (S,))}
        assert part < full and len(part) <= len(full) * 0.6, (len(part), len(full))
        # every S of a regime launches the same variants (compile_ahead warms a regime by one S of it)
        assert part == {text for _, text in problem_specializations([problem], SM90, warmup_module.regime_tokens(S))}
        for n_docs in (1, 7, S // 3):
            for r in _training_launches(problem, S, n_docs):
                options, signature, constexprs, attrs = triton_specialization(r.kernel.fn, r.args, r.options, SM90)
                text = repr((sorted(signature.items()), sorted(constexprs.items()), sorted(attrs.items()),
                             sorted(options.__dict__.items())))
                assert text in part, f"{r.kernel.name} of S={S}, {n_docs} documents is not in the tokens={S} set"
    for bad in ((), (0,), (True,), ("4096",)):
        with pytest.raises(ValueError, match="tokens must be"):
            warmup([512], target="sm_90", progress=None, tokens=bad)


_KEYS_AFTER = """
import hashlib, sys
from cakeconv.cake_causal_conv1d_det_train_backend.kernels import launch
launch.cache_keys_in_fixed_order() if sys.argv[1] == "fixed" else None
first = {k.name: k for k in launch.KERNELS}[sys.argv[2]]
first.fn.cache_key  # a process whose first kernel is this one
launch.cache_keys_in_fixed_order()
print(",".join(k.fn.cache_key[:12] for k in launch.KERNELS))
"""


def _keys(order: str, first: str) -> str:
    out = subprocess.run([sys.executable, "-c", _KEYS_AFTER, order, first], capture_output=True, text=True, cwd=REPO,
                         env=dict(os.environ, PYTHONPATH=REPO), timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_cache_keys_do_not_depend_on_the_first_kernel():
    """Triton's keys depend on the order kernels are hashed in; the fixed order removes that."""
    assert _keys("fixed", "cake_conv_fwd_kernel") == _keys("fixed", "cake_conv_bwd_one_group_kernel")
    # without it they differ (what the fixed order is for): if Triton stops doing this, drop the workaround
    assert _keys("free", "cake_conv_fwd_kernel") != _keys("free", "cake_conv_bwd_one_group_kernel")


def test_warmup_command_line_and_errors(tmp_path):
    run = lambda *args: subprocess.run([sys.executable, "-m", "cakeconv", "warmup", *args], capture_output=True,  # noqa: E731
                                       text=True, cwd=REPO, timeout=120, env=dict(os.environ, PYTHONPATH=REPO))
    out = run("--channels", "512", "--target", "sm_75")
    assert out.returncode == 2 and "capability >= 80" in out.stderr
    out = run("--channels", "512", "--dtype", "fp8")
    assert out.returncode == 2 and "unknown dtype 'fp8'" in out.stderr
    out = run("--help")
    assert out.returncode == 0 and "--target" in out.stdout
    with pytest.raises(ValueError, match="width=9"):
        WarmupProblem(512, width=9)
    with pytest.raises(ValueError, match="C=500"):
        WarmupProblem(500)
    with pytest.raises(ValueError, match="'relu'"):
        WarmupProblem(512, activation="relu")
    out = run("--channels", "512", "--width", "1")
    assert out.returncode == 2 and "width=1" in out.stderr
    out = run("--channels", "512", "--tokens", "2")
    assert out.returncode == 2 and "tokens must be" in out.stderr
    out = run("--channels", "512,1024", "--mamba-ssm-row-stride", "1040")
    assert out.returncode == 2 and "one stride per --channels entry" in out.stderr
    with pytest.raises(ValueError, match="problems must be"):
        warmup(["512"], target="sm_90", progress=None)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA GPU here"):
            warmup([512], progress=None)


_STEP = """
import json, sys, torch
from triton import knobs
from cakeconv import cake_causal_conv1d_det
events = []
knobs.compilation.listener = lambda *, src, metadata, metadata_group, times, cache_hit: events.append(cache_hit)
C = int(sys.argv[1])
for S, docs in ((4096, 3), (4096, 1024), (8320, 3), (8320, 2080)):
    x = torch.randn(S, C, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(C, 4, device="cuda", requires_grad=True)
    cu = torch.linspace(0, S, docs + 1, device="cuda").round().int()
    cake_causal_conv1d_det(x, w, cu_seqlens=cu).sum().backward()
torch.cuda.synchronize()
print(json.dumps({"hits": sum(events), "compiled": len(events) - sum(events)}))
"""


@pytest.mark.gpu
def test_gpu_a_step_after_the_warmup_compiles_nothing(tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO, TRITON_CACHE_DIR=str(tmp_path / "cache"))
    warm = subprocess.run([sys.executable, "-m", "cakeconv", "warmup", "--channels", "512"], capture_output=True,
                          text=True, cwd=REPO, env=env, timeout=600)
    assert warm.returncode == 0, warm.stderr
    step = subprocess.run([sys.executable, "-c", _STEP, "512"], capture_output=True, text=True, cwd=REPO, env=env,
                          timeout=600)
    assert step.returncode == 0, step.stderr
    result = json.loads(step.stdout.strip().splitlines()[-1])
    assert result["compiled"] == 0 and result["hits"] > 0, (result, warm.stdout)


_PAIR_STEP = """
import json, torch
from triton import knobs
events = []
knobs.compilation.listener = lambda *, src, metadata, metadata_group, times, cache_hit: events.append(cache_hit)
""" + MAMBA_PAIR_STEPS + """
print(json.dumps({"hits": sum(events), "compiled": len(events) - sum(events)}))
"""


@pytest.mark.gpu
def test_gpu_a_mamba_ssm_step_after_its_warmup_compiles_nothing(tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO, TRITON_CACHE_DIR=str(tmp_path / "cache"))
    warm = subprocess.run([sys.executable, "-m", "cakeconv", "warmup", "--channels", "256", "--mamba-ssm-row-stride",
                           "520", "--bias", "yes"], capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    assert warm.returncode == 0, warm.stderr
    step = subprocess.run([sys.executable, "-c", _PAIR_STEP], capture_output=True, text=True, cwd=REPO, env=env,
                          timeout=600)
    assert step.returncode == 0, step.stderr
    result = json.loads(step.stdout.strip().splitlines()[-1])
    assert result["compiled"] == 0 and result["hits"] > 0, (result, warm.stdout)
