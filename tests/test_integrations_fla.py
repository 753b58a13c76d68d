"""cakeconv.integrations.fla: flash-linear-attention's ShortConvolution on cakeconv's op.

Tiers (cheapest first):

1. CPU, no flash-linear-attention needed (CI): the module imports without ``fla``; a stand-in
   ``FakeShortConvolution`` with ShortConvolution's constructor, parameters and forward, written
   in plain PyTorch from FLA 0.6.0's code (mask multiplied in place, cache/final state, SiLU or no
   activation, the residual added after the activation), is the base class. On it: what is routed
   to cakeconv (bitwise the functional op with the reference backend, and within FP32/BF16
   tolerance of FLA's semantics; W = 4 with SiLU, W = 3 and 7 without activation, W = 2 and 8 with
   "swish"), what is delegated (the base's forward gets the call unchanged), user errors, and
   ``swap_short_convolutions`` (count, idempotence, identity of the parameters, dtype, training
   mode, optimizer state, GatedDeltaNet's q/k/v fusion turned off, deepcopy and pickle).
2. CPU with flash-linear-attention importable (skipped otherwise): the real ``ShortConvolution``
   class and a ``GatedDeltaNetForCausalLM`` are constructible on the CPU (their Triton kernels are
   not run): subclassing, constructor, state-dict keys and values, the swap of a whole model, and
   the cakeconv path of a real swapped module against plain PyTorch.
3. GPU (marked ``gpu``; skipped without CUDA or without ``fla``): a GatedDeltaNet layer and a small
   GatedDeltaNetForCausalLM (hidden 256, 2 layers, vocab 1000, bf16), swapped against unswapped
   from the same init on packed varlen input: outputs, loss and every gradient within bf16
   tolerance; 50 AdamW steps whose losses track; greedy generation equal; the swapped model's step
   twice on the same inputs: the short convolutions' outputs and gradients bitwise equal (and a
   replay of each convolution on fixed captured tensors, bitwise); FLA's own ShortConvolution at
   W = 2, 3, 7, 8 with and without SiLU (only ``fla.modules`` needed) against the same module
   swapped, within bf16 tolerance. FLA's autotuned kernels run the
   first configuration their pruning keeps (``_fla_autotuning_first_candidate``): FLA ships no
   tuned configurations, and autotuning every kernel took minutes per test.

Shape legend: B batch rows, T tokens per row, S packed tokens, D channels, W taps, N sequences,
V vocabulary.
"""

from __future__ import annotations

import copy
import os
import pickle
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from cakeconv import cake_causal_conv1d_det
import cakeconv.integrations.fla as cfla
from cakeconv.integrations.fla import (
    CakeShortConvolutionMixin,
    cake_short_convolution_class,
    swap_short_convolutions,
    unswap_short_convolutions,
)
from cakeconv.integrations.report import CakeconvSwapWarning

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _fla_importable() -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import fla.modules  # noqa: F401
            import fla.layers  # noqa: F401
            import fla.models  # noqa: F401
    except Exception:  # ImportError, or a dependency of fla (transformers, einops) failing to load
        return False
    return True


HAS_FLA = _fla_importable()
needs_fla = pytest.mark.skipif(not HAS_FLA, reason="flash-linear-attention (fla 0.6.0) is not importable")


@pytest.fixture(autouse=True)
def _fla_autotuning_first_candidate(request):
    """GPU tests: each of FLA's autotuned kernels runs the first configuration its own pruning keeps.

    FLA 0.6.0 ships no tuned configurations for the H200, so every kernel compiles and times all of
    its candidates on first use: 5 of these tests took 450 s on an H200. These tests
    compare a swapped model with an unswapped one; both run the same FLA kernels with the same
    configuration either way, so the configuration chosen does not matter to what they check.
    examples/train_fla_model.py, which times steps, keeps FLA's own autotuning.
    ``CAKECONV_FLA_FULL_AUTOTUNE=1`` keeps it here too.
    """
    if "gpu" not in request.keywords or os.environ.get("CAKECONV_FLA_FULL_AUTOTUNE") == "1":
        yield
        return
    from triton.runtime.autotuner import Autotuner

    prune = Autotuner.prune_configs

    def first_candidate(self, kwargs, *args, **kw):
        return prune(self, kwargs, *args, **kw)[:1]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Autotuner, "prune_configs", first_candidate)
        yield

# --------------------------------------------------------------------------------------------------
# A plain-PyTorch stand-in for fla.modules.ShortConvolution (FLA 0.6.0's semantics).
# --------------------------------------------------------------------------------------------------


def fla_semantics_conv(x_BTD, weight_DW, bias_D, residual=None, cache_NDW=None, output_final_state=False,
                       cu_seqlens=None, activation="silu"):
    """FLA's causal_conv1d in plain PyTorch, FP32 math: returns (y of x's dtype, final state or None).

    Per sequence, with ``history`` the W rows before its first token (the cache's ``[D, W]`` columns,
    column W - 1 the most recent; zeros without a cache):
        pre[t] = bias + sum_k weight[:, k] * x[t - W + 1 + k],  y = act(pre) + residual
    and the final state is the sequence's last W rows (history included), as ``[D, W]``.
    """
    B, T, D = x_BTD.shape
    W = weight_DW.shape[1]
    if cu_seqlens is None:
        spans = [(b, 0, T) for b in range(B)]
    else:
        cu = cu_seqlens.tolist()
        spans = [(0, cu[n], cu[n + 1]) for n in range(len(cu) - 1)]
    y = torch.empty(B, T, D, dtype=torch.float32, device=x_BTD.device)
    finals = []
    w = weight_DW.float()
    for n, (b, start, stop) in enumerate(spans):
        hist_WD = (cache_NDW[n].float().t() if cache_NDW is not None
                   else torch.zeros(W, D, dtype=torch.float32, device=x_BTD.device))
        xp = torch.cat([hist_WD, x_BTD[b, start:stop].float()], dim=0)  # token t at row W + t
        L = stop - start
        pre = torch.zeros(L, D, dtype=torch.float32, device=x_BTD.device)
        for k in range(W):
            pre = pre + w[:, k] * xp[k + 1:k + 1 + L]
        if bias_D is not None:
            pre = pre + bias_D.float()
        out = pre * torch.sigmoid(pre) if activation in ("silu", "swish") else pre
        if residual is not None:
            out = out + residual[b, start:stop].float()
        y[b, start:stop] = out
        finals.append(xp[-W:].t())
    final = torch.stack(finals).to(x_BTD.dtype) if output_final_state else None
    return y.to(x_BTD.dtype), final


class FakeShortConvolution(nn.Conv1d):
    """ShortConvolution's constructor, attributes and forward (FLA 0.6.0), in plain PyTorch.

    Records each forward call's arguments in ``self.calls`` so tests can tell which calls reached it.
    """

    def __init__(self, hidden_size, kernel_size, bias=False, activation="silu", backend="triton", device=None,
                 dtype=None, **kwargs):
        super().__init__(in_channels=hidden_size, out_channels=hidden_size, kernel_size=kernel_size,
                         padding=kernel_size - 1, groups=hidden_size, bias=bias, device=device, dtype=dtype)
        self.hidden_size = hidden_size
        self.activation = None
        if activation is not None:
            assert activation in ["silu", "swish"], f"Activation `{activation}` not supported yet."
            self.activation = activation
        self.backend = backend
        self.calls = []

    def forward(self, x, residual=None, mask=None, cache=None, output_final_state=False, cu_seqlens=None,
                chunk_indices=None, **kwargs):
        self.calls.append(dict(x=x, residual=residual, mask=mask, cache=cache, output_final_state=output_final_state,
                               cu_seqlens=cu_seqlens, chunk_indices=chunk_indices, kwargs=dict(kwargs)))
        if mask is not None:
            if cu_seqlens is not None:
                raise ValueError("`mask` and `cu_seqlens` cannot be provided at the same time")
            x = x.mul_(mask.unsqueeze(-1))
        shape = x.shape
        x_BTD = x.reshape(shape[0], shape[1], -1)
        y, final = fla_semantics_conv(x_BTD, self.weight.reshape(self.in_channels, -1), self.bias,
                                      residual=None if residual is None else residual.reshape(x_BTD.shape),
                                      cache_NDW=cache, output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                                      activation=self.activation)
        return y.view(shape), final


class FakeShortConvolutionVariant(FakeShortConvolution):
    """A subclass of the base (another library's variant): swap_short_convolutions leaves it alone."""


class FakeGatedDeltaNet(nn.Module):
    """Three convolutions and a ``_use_fused_qkv_conv`` method, as FLA's GatedDeltaNet has."""

    def __init__(self, D=16, dtype=None, conv_cls=FakeShortConvolution):
        super().__init__()
        self.q_proj = nn.Linear(D, D, bias=False, dtype=dtype)
        self.q_conv1d = conv_cls(D, 4, dtype=dtype)
        self.k_conv1d = conv_cls(D, 4, dtype=dtype)
        self.v_conv1d = conv_cls(2 * D, 4, bias=True, dtype=dtype)

    def _use_fused_qkv_conv(self, last_state=None, use_cache=False, cu_seqlens=None):
        return last_state is None and not use_cache and cu_seqlens is None


CakeFake = cake_short_convolution_class(FakeShortConvolution)


def _rel(a, b) -> float:
    """||a - b|| / ||b|| in FP64 (0 for two empty or all-zero tensors)."""
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    den = b.norm().item()
    num = (a - b).norm().item()
    return num / den if den > 0 else num


def _random_cu(S, gen, *, empty=True):
    cuts = [0]
    while cuts[-1] < S:
        n = int(torch.randint(0 if empty else 1, 12, (), generator=gen))
        cuts.append(min(S, cuts[-1] + n))
    return torch.tensor(cuts, dtype=torch.int32)


# --------------------------------------------------------------------------------------------------
# Tier 1: CPU, no fla needed.
# --------------------------------------------------------------------------------------------------


def test_imports_without_fla():
    """With `fla` blocked, the module imports, does not import fla, and asks for it only when used."""
    code = (
        "import sys\n"
        "import cakeconv.integrations, cakeconv.integrations.fla as f\n"
        "assert not any(m == 'fla' or m.startswith('fla.') for m in sys.modules), 'fla was imported'\n"
        "sys.modules['fla'] = None  # any `import fla...` now raises ImportError\n"
        "from cakeconv.integrations.fla import *\n"
        "import torch.nn as nn\n"
        "for attempt in (lambda: f.CakeShortConvolution, lambda: f.swap_short_convolutions(nn.Linear(8, 8)),\n"
        "                lambda: f.cake_short_convolution_class()):\n"
        "    try:\n"
        "        attempt()\n"
        "    except ImportError as e:\n"
        "        assert 'flash-linear-attention' in str(e), e\n"
        "    else:\n"
        "        raise SystemExit('no ImportError')\n"
        "print('OK')\n"
    )
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert done.returncode == 0 and done.stdout.strip().endswith("OK"), done.stdout + done.stderr


def test_class_constructor_and_state_dict_match_the_base():
    torch.manual_seed(3)
    base = FakeShortConvolution(24, 4, bias=True)
    torch.manual_seed(3)
    cake = CakeFake(24, 4, bias=True)
    assert isinstance(cake, FakeShortConvolution) and isinstance(cake, nn.Conv1d)
    assert type(cake).__name__ == "CakeFakeShortConvolution" and cake.cake_backend == "auto"
    sd, sd_cake = base.state_dict(), cake.state_dict()
    assert list(sd) == list(sd_cake) == ["weight", "bias"]
    assert sd_cake["weight"].shape == (24, 1, 4) and sd_cake["bias"].shape == (24,)
    assert all(torch.equal(sd[k], sd_cake[k]) for k in sd)  # same init under the same seed
    other = CakeFake(24, 4, bias=True, activation="swish", cake_backend="reference")
    other.load_state_dict(base.state_dict())
    base.load_state_dict(other.state_dict())
    assert other.activation == "swish" and other.cake_backend == "reference"
    assert "cake_backend=reference" in repr(other)
    assert cake_short_convolution_class(FakeShortConvolution) is CakeFake  # built once
    assert cake_short_convolution_class(CakeFake) is CakeFake


# Grid: W = 4 with SiLU over dtype x packing x bias; the other widths and activations (LFM2's W = 3
# and LFM3's W = 7 without activation, the extremes with FLA's "swish") once each, BF16 packed with bias.
@pytest.mark.parametrize("W,activation,dtype,packed,bias", [
    *[(4, "silu", dtype, packed, bias) for dtype in (torch.float32, torch.bfloat16) for packed in (False, True)
      for bias in (False, True)],
    (3, None, torch.bfloat16, True, True),
    (7, None, torch.float32, False, False),
    (2, "swish", torch.bfloat16, True, True),
    (8, "swish", torch.float32, True, False),
])
def test_training_path_is_cakeconv(W, activation, dtype, packed, bias, monkeypatch):
    """Routed calls: bitwise the functional op (reference backend) at the module's width and
    activation, close to FLA's semantics."""
    gen = torch.Generator().manual_seed(11)
    D = 24
    torch.manual_seed(5)
    conv = CakeFake(D, W, bias=bias, activation=activation, dtype=dtype, cake_backend="reference")
    cake_act = None if activation is None else "silu"
    seen = []

    def counting(x, weight, *args, **kwargs):
        seen.append((tuple(weight.shape), kwargs.get("activation", "silu")))
        return cake_causal_conv1d_det(x, weight, *args, **kwargs)

    monkeypatch.setattr(cfla, "cake_causal_conv1d_det", counting)
    if packed:
        cu = _random_cu(53, gen)
        x = torch.randn(1, 53, D, generator=gen).to(dtype)
    else:
        cu = None
        x = torch.randn(3, 17, D, generator=gen).to(dtype)
    dy = torch.randn(x.shape, generator=gen).to(dtype)
    assert conv.delegation_reason(x, cu_seqlens=cu) is None

    x1 = x.clone().requires_grad_()
    y1, final = conv(x1, cu_seqlens=cu)
    assert final is None and y1.shape == x.shape and y1.dtype == dtype
    assert conv.calls == []  # the base's forward was not called
    assert seen == [((D, W), cake_act)], "cakeconv ran, at the module's width and activation"
    y1.backward(dy)
    grads1 = [x1.grad] + [p.grad.clone() for p in conv.parameters()]

    conv.zero_grad(set_to_none=True)
    x2 = x.clone().requires_grad_()
    y2 = cake_causal_conv1d_det(x2, conv.weight.view(D, W), conv.bias, cu_seqlens=cu, activation=cake_act,
                                backend="reference")
    y2.backward(dy)
    grads2 = [x2.grad] + [p.grad.clone() for p in conv.parameters()]
    assert torch.equal(y1, y2)
    for g1, g2 in zip(grads1, grads2):
        assert g1.dtype == g2.dtype and torch.equal(g1, g2)
    assert grads1[1].shape == (D, 1, W) and grads1[1].dtype == dtype

    # Against FLA's semantics (the base's forward), outputs and gradients.
    conv.zero_grad(set_to_none=True)
    x3 = x.clone().requires_grad_()
    y3, _ = FakeShortConvolution.forward(conv, x3, cu_seqlens=cu)
    y3.backward(dy)
    grads3 = [x3.grad] + [p.grad.clone() for p in conv.parameters()]
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert _rel(y1, y3) < tol
    for g1, g3 in zip(grads1, grads3):
        assert _rel(g1, g3) < tol


def test_training_path_with_residual_and_mask():
    gen = torch.Generator().manual_seed(2)
    D = 16
    conv = CakeFake(D, 4, bias=True, cake_backend="reference")
    x = torch.randn(2, 9, D, generator=gen)
    residual = torch.randn(2, 9, D, generator=gen)
    mask = (torch.rand(2, 9, generator=gen) > 0.3).to(torch.int64)

    x_cake, x_fla = x.clone(), x.clone()
    y_cake, _ = conv(x_cake, residual=residual, mask=mask)
    y_fla, _ = FakeShortConvolution.forward(conv, x_fla, residual=residual, mask=mask)
    assert len(conv.calls) == 1  # the stand-in's own call only: the routed call did not reach it
    assert torch.equal(x_cake, x_fla) and torch.equal(x_cake, x * mask.unsqueeze(-1))  # masked in place, as FLA
    assert _rel(y_cake, y_fla) < 1e-6
    plain = cake_causal_conv1d_det(x * mask.unsqueeze(-1), conv.weight.view(D, 4), conv.bias, backend="reference")
    assert torch.equal(y_cake, plain + residual)

    # A residual of another dtype is added in FP32 and rounded once to x's dtype.
    xb = x.to(torch.bfloat16)
    yb, _ = conv(xb, residual=residual)
    plain_b = cake_causal_conv1d_det(xb, conv.weight.view(D, 4), conv.bias, backend="reference")
    assert yb.dtype == torch.bfloat16 and torch.equal(yb, (plain_b.float() + residual).to(torch.bfloat16))


def test_delegated_calls_reach_the_base_unchanged():
    gen = torch.Generator().manual_seed(4)
    D = 16
    x = torch.randn(2, 6, D, generator=gen)
    cache = torch.randn(2, D, 4, generator=gen)
    cases = [
        (CakeFake(D, 4), dict(cache=cache), "cache"),
        (CakeFake(D, 4), dict(output_final_state=True), "output_final_state"),
        (CakeFake(D, 4), dict(cp_context=object()), "cp_context"),
        (CakeFake(D, 9, activation=None), {}, "kernel_size = 9"),
        (CakeFake(D, 1), {}, "kernel_size = 1"),
        (CakeFake(12, 4), {}, "multiple of 8"),
        (CakeFake(D, 4, dtype=torch.float16), {}, "weight dtype"),
    ]
    for conv, kwargs, why in cases:
        C = conv.in_channels
        xi = x[..., :C].to(conv.weight.dtype).contiguous()
        reason = conv.delegation_reason(xi, **kwargs)
        assert reason is not None and why in reason, (why, reason)
        if "cp_context" in kwargs:  # the stand-in has no context parallelism: only check it was called
            conv(xi, **kwargs)
            assert len(conv.calls) == 1 and conv.calls[0]["kwargs"] == kwargs
            continue
        y, final = conv(xi.clone(), **kwargs)
        assert len(conv.calls) == 1, why
        call = conv.calls[0]
        assert call["cache"] is kwargs.get("cache") and call["output_final_state"] == kwargs.get("output_final_state", False)
        y_ref, final_ref = FakeShortConvolution.forward(conv, xi.clone(), **kwargs)
        assert torch.equal(y, y_ref)
        assert (final is None) == (final_ref is None) and (final is None or torch.equal(final, final_ref))
    # x of another rank, e.g. [B, T, H, K]: delegated.
    conv = CakeFake(D, 4)
    x4 = x.view(2, 6, 2, 8)
    assert "x of shape (2, 6, 2, 8)" in conv.delegation_reason(x4)
    y4, _ = conv(x4)
    assert len(conv.calls) == 1 and y4.shape == x4.shape


@pytest.mark.parametrize("W,activation", [(4, "silu"), (3, None)])
def test_decode_after_a_cakeconv_prefill_matches_the_base(W, activation):
    """The training path gives no state; a prefill with output_final_state (delegated) then decode steps."""
    gen = torch.Generator().manual_seed(9)
    D = 16
    conv = CakeFake(D, W, bias=True, activation=activation, cake_backend="reference")
    x = torch.randn(1, 12, D, generator=gen)
    y_all, _ = conv(x.clone())  # cakeconv
    y_pre, state = conv(x[:, :8].clone(), output_final_state=True)  # delegated
    ys = [y_pre]
    for t in range(8, 12):
        y_t, state = conv(x[:, t:t + 1].clone(), cache=state, output_final_state=True)  # delegated
        ys.append(y_t)
    assert _rel(torch.cat(ys, dim=1), y_all) < 1e-6


def test_user_errors_raise_value_error():
    D = 16
    conv = CakeFake(D, 4, cake_backend="reference")
    x = torch.randn(1, 10, D)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    with pytest.raises(ValueError, match="`mask` and `cu_seqlens`"):
        conv(x, mask=torch.ones(1, 10), cu_seqlens=cu)
    with pytest.raises(ValueError, match=r"mask must be \[B, T\] = \[1, 10\]"):
        conv(x, mask=torch.ones(10))
    with pytest.raises(ValueError, match=r"packed as \[1, S, D\]"):
        conv(torch.randn(2, 5, D), cu_seqlens=cu)
    with pytest.raises(ValueError, match="residual must have x's shape"):
        conv(x, residual=torch.randn(1, 9, D))
    with pytest.raises(ValueError, match="cu_seqlens must end"):  # cakeconv's own check
        conv(x, cu_seqlens=torch.tensor([0, 4, 9], dtype=torch.int32))
    with pytest.raises(ValueError, match="cake_backend must be one of"):
        CakeFake(D, 4, cake_backend="cuda")
    with pytest.raises(ValueError, match="cake_backend must be one of"):
        swap_short_convolutions(nn.Sequential(), cake_backend="fast", base_class=FakeShortConvolution)
    with pytest.raises(TypeError, match="torch.nn.Module"):
        swap_short_convolutions([conv], base_class=FakeShortConvolution)
    with pytest.raises(TypeError, match="Conv1d"):
        swap_short_convolutions(nn.Sequential(), base_class=nn.Linear)
    with pytest.raises(TypeError, match="not the Cake class"):
        swap_short_convolutions(nn.Sequential(), base_class=CakeFake)
    y, _ = conv(x, cu_seqlens=cu)  # nothing left half-built
    assert y.shape == x.shape


def test_bitwise_repeatable():
    gen = torch.Generator().manual_seed(1)
    D = 32
    conv = CakeFake(D, 4, bias=True, dtype=torch.bfloat16, cake_backend="reference")
    cu = _random_cu(97, gen)
    x = torch.randn(1, 97, D, generator=gen).to(torch.bfloat16)
    dy = torch.randn(1, 97, D, generator=gen).to(torch.bfloat16)
    outs = []
    for _ in range(2):
        conv.zero_grad(set_to_none=True)
        xi = x.clone().requires_grad_()
        y, _ = conv(xi, cu_seqlens=cu)
        y.backward(dy)
        outs.append([y, xi.grad, conv.weight.grad, conv.bias.grad])
    for a, b in zip(*outs):
        assert torch.equal(a, b)


def test_swap_in_place_keeps_everything_and_is_idempotent():
    torch.manual_seed(0)
    model = nn.Sequential(FakeGatedDeltaNet(16, dtype=torch.bfloat16), FakeGatedDeltaNet(16, dtype=torch.bfloat16))
    model[1].eval()
    model.add_module("variant", FakeShortConvolutionVariant(8, 4))
    shared = model[0].q_conv1d
    model.add_module("shared", shared)  # the same module twice: swapped (and counted) once
    params_before = {name: p for name, p in model.named_parameters()}
    values_before = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert model[0]._use_fused_qkv_conv(last_state=None, use_cache=False, cu_seqlens=None)

    with pytest.warns(UserWarning, match=r"variant \(FakeShortConvolutionVariant\): a subclass"):
        assert swap_short_convolutions(model, cake_backend="reference", base_class=FakeShortConvolution).swapped == 6
    with pytest.warns(UserWarning, match="variant"):
        assert swap_short_convolutions(model, base_class=FakeShortConvolution).swapped == 0  # idempotent
    assert type(model.variant) is FakeShortConvolutionVariant
    for layer in (model[0], model[1]):
        for conv in (layer.q_conv1d, layer.k_conv1d, layer.v_conv1d):
            assert type(conv) is CakeFake and conv.cake_backend == "reference"
            assert conv.weight.dtype == torch.bfloat16
        assert layer._use_fused_qkv_conv(last_state=None, use_cache=False, cu_seqlens=None) is False
    assert model.shared is model[0].q_conv1d
    assert model[0].training and not model[1].training and not model[1].v_conv1d.training
    assert {name: p for name, p in model.named_parameters()} == params_before  # the same Parameter objects
    assert all(torch.equal(values_before[k], v) for k, v in model.state_dict().items())
    assert list(model.state_dict()) == list(values_before)

    # The optimizer built before the swap trains the swapped modules.
    x = torch.randn(1, 10, 16, dtype=torch.bfloat16)
    cu = torch.tensor([0, 3, 10], dtype=torch.int32)
    y, _ = model[0].q_conv1d(x, cu_seqlens=cu)
    assert model[0].q_conv1d.calls == []
    y.float().square().sum().backward()
    before = model[0].q_conv1d.weight.detach().clone()
    opt.step()
    assert not torch.equal(before, model[0].q_conv1d.weight)

    # deepcopy and pickle keep the class, the routing and the turned-off fusion.
    y, _ = model[0].q_conv1d(x, cu_seqlens=cu)
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert type(clone[1].v_conv1d) is CakeFake and clone[1].v_conv1d.cake_backend == "reference"
        assert clone[0]._use_fused_qkv_conv(last_state=None, use_cache=False, cu_seqlens=None) is False
        y2, _ = clone[0].q_conv1d(x, cu_seqlens=cu)
        assert torch.equal(y2, y.detach())


def test_swap_report_names_every_convolution_and_unswap_restores():
    model = nn.Sequential(FakeGatedDeltaNet(16))
    model.add_module("wide", FakeShortConvolution(16, 9, activation=None))  # W = 9: swapped, every call to FLA
    model.add_module("variant", FakeShortConvolutionVariant(8, 4))
    values_before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.warns(CakeconvSwapWarning, match="2 of 5 places stay off cakeconv") as caught:
        report = swap_short_convolutions(model, cake_backend="reference", base_class=FakeShortConvolution)
    assert "wide (CakeFakeShortConvolution): swapped, but every call goes to FLA: kernel_size = 9" in str(caught[0].message)
    rows = {e.where: e for e in report.entries}
    assert list(rows) == ["0.q_conv1d", "0.k_conv1d", "0.v_conv1d", "wide", "variant"]
    for name in ("0.q_conv1d", "0.k_conv1d", "0.v_conv1d"):
        assert rows[name].on_cakeconv and rows[name].newly_swapped and "fused q/k/v conv is turned off" in rows[name].why
    assert not rows["wide"].on_cakeconv and rows["wide"].newly_swapped
    assert not rows["variant"].on_cakeconv and not rows["variant"].newly_swapped
    assert report.swapped == 4 and len(report.on_cakeconv) == 3
    assert "3 of 5 places run cakeconv (4 changed by this call)" in str(report)

    undone = unswap_short_convolutions(model)
    assert [e.where for e in undone.entries] == ["0.q_conv1d", "0.k_conv1d", "0.v_conv1d", "wide"]
    assert str(undone).startswith("fla unswap: 4 of 4 places restored, 0 still run cakeconv")
    assert all(type(m) is FakeShortConvolution for m in (model[0].q_conv1d, model[0].v_conv1d, model.wide))
    assert "cake_backend" not in model.wide.__dict__ and "_use_fused_qkv_conv" not in model[0].__dict__
    assert model[0]._use_fused_qkv_conv(last_state=None, use_cache=False, cu_seqlens=None)
    assert all(torch.equal(values_before[k], v) for k, v in model.state_dict().items())
    assert unswap_short_convolutions(model).entries == ()
    with pytest.raises(TypeError, match="torch.nn.Module"):
        unswap_short_convolutions([model])


def test_swap_a_bare_convolution():
    conv = FakeShortConvolution(16, 4)
    assert swap_short_convolutions(conv, base_class=FakeShortConvolution).swapped == 1
    assert type(conv) is CakeFake
    assert swap_short_convolutions(conv, base_class=FakeShortConvolution).swapped == 0


# --------------------------------------------------------------------------------------------------
# Tier 2: CPU with the real fla classes (no fla kernel runs).
# --------------------------------------------------------------------------------------------------


def _tiny_gdn_config(**overrides):
    from fla.models import GatedDeltaNetConfig

    kwargs = dict(hidden_size=256, num_hidden_layers=2, vocab_size=1000, num_heads=4, head_dim=64, expand_v=2.0,
                  attn_mode="chunk", max_position_embeddings=4096)
    kwargs.update(overrides)
    return GatedDeltaNetConfig(**kwargs)


@needs_fla
def test_fla_class_constructor_and_state_dict():
    import inspect

    from fla.modules import ShortConvolution

    cls = cfla.CakeShortConvolution
    assert cls is cake_short_convolution_class() and cls.__name__ == "CakeShortConvolution"
    assert issubclass(cls, ShortConvolution) and cls.__module__ == "cakeconv.integrations.fla"
    fla_params = list(inspect.signature(ShortConvolution.__init__).parameters)
    cake_params = list(inspect.signature(cls.__init__).parameters)
    assert [p for p in cake_params if p != "cake_backend"] == fla_params
    for bias in (False, True):
        torch.manual_seed(1)
        ref = ShortConvolution(hidden_size=64, kernel_size=4, bias=bias, activation="silu")
        torch.manual_seed(1)
        cake = cls(hidden_size=64, kernel_size=4, bias=bias, activation="silu")
        assert list(ref.state_dict()) == list(cake.state_dict())
        for k, v in ref.state_dict().items():
            assert torch.equal(v, cake.state_dict()[k])
        assert cake.weight.shape == (64, 1, 4) and cake.backend == ref.backend
        ref.load_state_dict(cake.state_dict())
        cake.load_state_dict(ref.state_dict())


@needs_fla
def test_fla_model_swap_on_cpu():
    from fla.models import GatedDeltaNetForCausalLM

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = GatedDeltaNetForCausalLM(_tiny_gdn_config()).to(torch.bfloat16)
    values = {k: v.clone() for k, v in model.state_dict().items()}
    params = dict(model.named_parameters())
    attn = model.model.layers[0].attn
    assert attn._use_fused_qkv_conv(last_state=None, use_cache=False, cu_seqlens=None)
    assert swap_short_convolutions(model).swapped == 6
    assert swap_short_convolutions(model).swapped == 0
    assert dict(model.named_parameters()) == params
    assert all(torch.equal(values[k], v) for k, v in model.state_dict().items())
    for layer in model.model.layers:
        for conv in (layer.attn.q_conv1d, layer.attn.k_conv1d, layer.attn.v_conv1d):
            assert type(conv) is cfla.CakeShortConvolution and conv.weight.dtype == torch.bfloat16
        assert layer.attn._use_fused_qkv_conv(last_state=None, use_cache=False, cu_seqlens=None) is False
    assert model.training
    clone = pickle.loads(pickle.dumps(model))
    assert type(clone.model.layers[1].attn.v_conv1d) is cfla.CakeShortConvolution

    # The cakeconv path of a real swapped module on the CPU (reference backend) against plain PyTorch.
    conv = attn.v_conv1d
    gen = torch.Generator().manual_seed(0)
    cu = _random_cu(70, gen)
    x = torch.randn(1, 70, conv.in_channels, generator=gen).to(torch.bfloat16)
    assert conv.delegation_reason(x, cu_seqlens=cu) is None
    assert conv.delegation_reason(x, cu_seqlens=cu, output_final_state=True) == "output_final_state = True"
    y, final = conv(x, cu_seqlens=cu)
    y_ref, _ = fla_semantics_conv(x, conv.weight.view(-1, 4), conv.bias, cu_seqlens=cu)
    assert final is None and y.dtype == torch.bfloat16 and _rel(y, y_ref) < 1e-2


# --------------------------------------------------------------------------------------------------
# Tier 3: GPU (flash-linear-attention's kernels).
# --------------------------------------------------------------------------------------------------
# The helpers take the device so that the same code can be driven elsewhere; the tests run them on CUDA.

DOC_LENGTHS = [1, 7, 64, 3, 200, 1, 513, 90, 17, 640, 2, 33, 477]  # 2048 tokens, 13 documents
UNPACKED_BT = (4, 512)  # the [B, T, D] layer case
# Swapped against FLA, per tensor: ||swapped - fla|| / ||fla|| <= TOL + NOISE_FACTOR * floor, where floor is
# the same measure for FLA's model with the q/k/v projections' outputs (the convolutions' inputs) moved by
# about one bf16 ulp: the difference that last-bit changes at the convolutions make downstream. A tensor
# whose value is mostly bf16 noise (a gradient with heavy cancellation) thereby gets a matching allowance,
# while a wrong convolution (wrong tap, document boundary, residual, dtype) is far above it.
TOL_OUT = 1e-2
TOL_GRAD = 2e-2
NOISE_FACTOR = 4.0


def packed_batch(device, V=1000, lengths=DOC_LENGTHS, seed=0):
    """input_ids [1, S], labels [1, S] (-100 at each document's first token) and cu_seqlens [N + 1].

    Tokens follow one fixed Markov chain (each token has 4 likely successors; the same chain for
    every ``seed``), so that a few optimizer steps lower the loss; ``seed`` picks the walk.
    """
    succ_VK = torch.randint(0, V, (V, 4), generator=torch.Generator().manual_seed(1234))
    gen = torch.Generator().manual_seed(seed)
    cu = torch.tensor([0] + list(lengths), dtype=torch.int64).cumsum(0).to(torch.int32)
    S = int(cu[-1])
    pick = torch.randint(0, 4, (S,), generator=gen).tolist()
    fresh = torch.randint(0, V, (S,), generator=gen).tolist()
    succ = succ_VK.tolist()
    starts = set(cu[:-1].tolist())
    ids = []
    for t in range(S):
        ids.append(fresh[t] if t in starts else succ[ids[-1]][pick[t]])
    ids = torch.tensor(ids, dtype=torch.int64)
    labels = ids.clone()
    labels[cu[:-1].long()] = -100  # shift_labels then ignore the prediction across a document boundary
    return ids[None].to(device), labels[None].to(device), cu.to(device)


FAMILIES = ("gated_deltanet", "delta_net")
_REFUSALS: dict = {}


def gated_backward_refusal(device):
    """FLA's message if it refuses GatedDeltaNet's backward on this device, else None.

    FLA 0.6.0 raises in its gated ``chunk_bwd_dqkwg`` on Hopper GPUs with Triton >= 3.4 and < 3.7.1
    unless tilelang is installed ("produces incorrect results", its issue #640): with or without
    cakeconv, no GatedDeltaNet trains there. DeltaNet holds its short convolutions the same way
    and its backward does not use that kernel, so the gradient tests run on it there.
    """
    key = str(device)
    if key not in _REFUSALS:
        from fla.layers import GatedDeltaNet

        torch.manual_seed(0)
        layer = GatedDeltaNet(hidden_size=128, head_dim=64, num_heads=2, mode="chunk", layer_idx=0)
        layer = layer.to(device=device, dtype=torch.bfloat16)
        x = torch.randn(1, 64, 128, device=device, dtype=torch.bfloat16, requires_grad=True)
        try:
            layer(x)[0].float().sum().backward()
            _REFUSALS[key] = None
        except RuntimeError as error:
            if "chunk_bwd_dqkwg" not in str(error):
                raise
            _REFUSALS[key] = str(error)
    return _REFUSALS[key]


def trainable_family(device):
    """GatedDeltaNet where FLA runs its backward, else DeltaNet (gated_backward_refusal)."""
    return "gated_deltanet" if gated_backward_refusal(device) is None else "delta_net"


def _tiny_config(family, **overrides):
    from fla.models import DeltaNetConfig

    if family == "gated_deltanet":
        return _tiny_gdn_config(**overrides)
    kwargs = dict(hidden_size=256, num_hidden_layers=2, vocab_size=1000, num_heads=4, attn_mode="chunk",
                  max_position_embeddings=4096)
    kwargs.update(overrides)
    return DeltaNetConfig(**kwargs)


def make_models(device, family="gated_deltanet", dtype=torch.bfloat16, seed=0, **config):
    """(fla_model, swapped_model): a small causal LM of ``family`` and a deep copy of it, swapped."""
    from fla.models import DeltaNetForCausalLM, GatedDeltaNetForCausalLM

    cls = GatedDeltaNetForCausalLM if family == "gated_deltanet" else DeltaNetForCausalLM
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = cls(_tiny_config(family, **config)).to(device=device, dtype=dtype)
    ref.train()
    cake = copy.deepcopy(ref)
    assert swap_short_convolutions(cake).swapped == 2 * 3
    return ref, cake


def perturb_conv_inputs(model, seed=0):
    """Hooks that move the q/k/v projections' outputs by about one bf16 ulp (in place of a deep copy's).

    Each element is multiplied by 1 + s * 2**-7 with s in {-1, 0, 1} drawn at random, then rounded back
    to its dtype. Returns the hook handles.
    """
    gen = torch.Generator().manual_seed(seed)

    def hook(module, args, output):
        s = (torch.randint(0, 3, output.shape, generator=gen) - 1).to(device=output.device, dtype=torch.float32)
        return (output.float() * (1 + s * 2.0 ** -7)).to(output.dtype)

    return [m.register_forward_hook(hook) for name, m in model.named_modules()
            if name.rsplit(".", 1)[-1] in ("q_proj", "k_proj", "v_proj")]


def grads_of(model):
    return {name: p.grad for name, p in model.named_parameters() if p.grad is not None}


def close_to_fla(name, got, fla, noisy, tol):
    """got within tol + NOISE_FACTOR * rel(noisy, fla) of fla; returns (error, allowance)."""
    err, floor = _rel(got, fla), _rel(noisy, fla)
    allowance = tol + NOISE_FACTOR * floor
    assert err <= allowance, (f"{name}: relative difference to FLA {err:.3g} > {allowance:.3g} "
                              f"(tol {tol} + {NOISE_FACTOR} x one-ulp noise floor {floor:.3g})")
    return err, allowance


def compare_grads(ref, cake, noisy, tol=TOL_GRAD):
    """Every parameter gradient of the swapped model close to FLA's; returns the worst (ratio, name, err)."""
    g_ref, g_cake, g_noisy = grads_of(ref), grads_of(cake), grads_of(noisy)
    assert set(g_ref) == set(g_cake) == set(g_noisy)
    conv_params = {name for name, _ in cake.named_parameters() if "conv1d" in name}
    assert conv_params and conv_params <= set(g_cake)
    worst = (0.0, "", 0.0)
    for name in g_ref:
        err, allowance = close_to_fla(f"gradient {name}", g_cake[name], g_ref[name], g_noisy[name], tol)
        worst = max(worst, (err / allowance, name, err))
    return worst


def count_cake_calls(monkeypatch):
    """Counts the cakeconv calls made by the swapped modules (the module's global name is patched)."""
    calls = []
    real = cfla.cake_causal_conv1d_det

    def counted(*args, **kwargs):
        calls.append(tuple(args[0].shape))
        return real(*args, **kwargs)

    monkeypatch.setattr(cfla, "cake_causal_conv1d_det", counted)
    return calls


def check_layer(device, family, conv_bias, packed, monkeypatch=None):
    """A layer of ``family``: FLA, swapped, and FLA with one-ulp noise; returns the worst gradient.

    Where FLA refuses the layer's backward (gated_backward_refusal), the swapped layer must refuse
    it the same way, and only the outputs are compared (returns None).
    """
    from fla.layers import DeltaNet, GatedDeltaNet

    refusal = gated_backward_refusal(device) if family == "gated_deltanet" else None
    torch.manual_seed(1)
    if family == "gated_deltanet":
        ref = GatedDeltaNet(hidden_size=256, head_dim=64, num_heads=4, mode="chunk", conv_bias=conv_bias,
                            layer_idx=0)
    else:
        ref = DeltaNet(hidden_size=256, num_heads=4, mode="chunk", conv_bias=conv_bias, layer_idx=0)
    ref = ref.to(device=device, dtype=torch.bfloat16)
    cake, noisy = copy.deepcopy(ref), copy.deepcopy(ref)
    assert swap_short_convolutions(cake).swapped == 3
    perturb_conv_inputs(noisy)
    gen = torch.Generator().manual_seed(2)
    if packed:
        cu = torch.tensor([0] + DOC_LENGTHS, dtype=torch.int64).cumsum(0).to(torch.int32).to(device)
        shape, kwargs = (1, int(cu[-1]), 256), dict(cu_seqlens=cu)
    else:
        shape, kwargs = (*UNPACKED_BT, 256), {}  # GatedDeltaNet fuses q/k/v here; the swap turns that off
    x = torch.randn(shape, generator=gen).to(device=device, dtype=torch.bfloat16)
    do = torch.randn(shape, generator=gen).to(device=device, dtype=torch.bfloat16)
    outs = {}
    for key, layer in (("fla", ref), ("noisy", noisy), ("cake", cake)):
        calls = count_cake_calls(monkeypatch) if (key == "cake" and monkeypatch is not None) else None
        xi = x.clone().requires_grad_()
        o = layer(xi, **kwargs)[0]
        if refusal is None:
            o.backward(do)
        else:
            with pytest.raises(RuntimeError, match="chunk_bwd_dqkwg"):
                o.backward(do)
        outs[key] = (o.detach(), xi.grad)
        if calls is not None:
            assert len(calls) == 3, calls  # q, k and v went through cakeconv
    close_to_fla("output", outs["cake"][0], outs["fla"][0], outs["noisy"][0], TOL_OUT)
    if refusal is not None:
        return None
    close_to_fla("dx", outs["cake"][1], outs["fla"][1], outs["noisy"][1], TOL_GRAD)
    return compare_grads(ref, cake, noisy)


def check_model_step(device, family, monkeypatch=None):
    """The causal LM on a packed batch: logits, loss, every gradient; returns (losses, worst gradient).

    Where FLA refuses the backward (gated_backward_refusal): logits and loss only, worst gradient None.
    """
    refusal = gated_backward_refusal(device) if family == "gated_deltanet" else None
    ref, cake = make_models(device, family)
    noisy = copy.deepcopy(ref)
    perturb_conv_inputs(noisy)
    ids, labels, cu = packed_batch(device)
    outs = {}
    for key, model in (("fla", ref), ("noisy", noisy), ("cake", cake)):
        calls = count_cake_calls(monkeypatch) if (key == "cake" and monkeypatch is not None) else None
        out = model(input_ids=ids, labels=labels, cu_seqlens=cu)
        if refusal is None:
            out.loss.backward()
        else:
            with pytest.raises(RuntimeError, match="chunk_bwd_dqkwg"):
                out.loss.backward()
        outs[key] = (out.logits.detach(), out.loss.detach())
        if calls is not None:
            assert len(calls) == 6, calls
    close_to_fla("logits", outs["cake"][0], outs["fla"][0], outs["noisy"][0], TOL_OUT)
    close_to_fla("loss", outs["cake"][1], outs["fla"][1], outs["noisy"][1], TOL_OUT)
    worst = compare_grads(ref, cake, noisy) if refusal is None else None
    return outs["fla"][1].item(), outs["cake"][1].item(), worst


def train_both(device, family, steps=50, lr=2e-3, batches=4):
    """AdamW steps of both models on the same packed batches; returns the two loss lists."""
    ref, cake = make_models(device, family)
    data = [packed_batch(device, seed=s) for s in range(batches)]
    losses = {"fla": [], "cake": []}
    for model, key in ((ref, "fla"), (cake, "cake")):
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
        for step in range(steps):
            ids, labels, cu = data[step % batches]
            loss = model(input_ids=ids, labels=labels, cu_seqlens=cu).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses[key].append(loss.item())
    return losses["fla"], losses["cake"]


@torch.no_grad()
def generate_both(device, family, new_tokens=8):
    """Greedy generation (FLA's cache: delegated) of both models, and no-cache logits (cakeconv).

    Returns (tokens_fla, tokens_cake, (logits_cake, logits_fla, logits_noisy)).
    """
    ref, cake = make_models(device, family)
    noisy = copy.deepcopy(ref)
    for model in (ref, cake, noisy):
        model.eval()
    ids, _, _ = packed_batch(device)
    prompt = ids[:, :24]
    kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, use_cache=True,
                  pad_token_id=0)
    tokens_ref = ref.generate(input_ids=prompt, **kwargs)
    tokens_cake = cake.generate(input_ids=prompt, **kwargs)
    # With use_cache=False the swapped model's convolutions run cakeconv.
    perturb_conv_inputs(noisy)
    logits = [m(input_ids=ids[:, :256], use_cache=False).logits for m in (cake, ref, noisy)]
    return tokens_ref, tokens_cake, logits


def capture_conv_step(model, ids, labels, cu):
    """One forward + backward; for each swapped conv: x, y, dy, dx and its parameter gradients."""
    records, handles = {}, []
    for name, module in model.named_modules():
        if not isinstance(module, CakeShortConvolutionMixin):
            continue

        def hook(mod, args, kwargs, output, name=name):
            x = args[0] if args else kwargs["x"]
            y = output[0]
            rec = records[name] = {"x": x.detach().clone(), "y": y.detach().clone(),
                                   "cu": kwargs.get("cu_seqlens")}
            y.register_hook(lambda g, rec=rec: rec.__setitem__("dy", g.detach().clone()))
            x.register_hook(lambda g, rec=rec: rec.__setitem__("dx", g.detach().clone()))

        handles.append(module.register_forward_hook(hook, with_kwargs=True))
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=labels, cu_seqlens=cu).loss
    loss.backward()
    for h in handles:
        h.remove()
    for name, module in model.named_modules():
        if name in records:
            records[name]["dparams"] = [p.grad.detach().clone() for p in module.parameters()]
    return loss.detach(), records


def replay_conv(module, rec):
    """The convolution alone on captured x and dy: (y, dx, parameter gradients)."""
    module.zero_grad(set_to_none=True)
    x = rec["x"].clone().requires_grad_()
    y, _ = module(x, cu_seqlens=rec["cu"])
    y.backward(rec["dy"])
    out = [y.detach(), x.grad] + [p.grad.detach().clone() for p in module.parameters()]
    module.zero_grad(set_to_none=True)
    return out


def check_step_twice_bitwise(device, family):
    """Returns the names of the convolutions whose inputs or upstream gradients varied between runs."""
    _, cake = make_models(device, family)
    ids, labels, cu = packed_batch(device)
    _, run1 = capture_conv_step(cake, ids, labels, cu)
    _, run2 = capture_conv_step(cake, ids, labels, cu)
    assert set(run1) == set(run2) and len(run1) == 6
    varied = []
    for name in run1:
        r1, r2 = run1[name], run2[name]
        assert "dy" in r1 and "dx" in r1, name
        same_x, same_dy = torch.equal(r1["x"], r2["x"]), torch.equal(r1["dy"], r2["dy"])
        if same_x:
            assert torch.equal(r1["y"], r2["y"]), name
        if same_x and same_dy:
            assert torch.equal(r1["dx"], r2["dx"]), name
            for a, b in zip(r1["dparams"], r2["dparams"]):
                assert torch.equal(a, b), name
        else:
            varied.append(f"{name}: x {'equal' if same_x else 'VARIED'}, dy {'equal' if same_dy else 'VARIED'}")
    # On fixed tensors (run 1's x and dy), each convolution twice: bitwise, and bitwise its in-model result.
    modules = dict(cake.named_modules())
    for name, rec in run1.items():
        first, second = replay_conv(modules[name], rec), replay_conv(modules[name], rec)
        for a, b in zip(first, second):
            assert torch.equal(a, b), name
        assert torch.equal(first[0], rec["y"]) and torch.equal(first[1], rec["dx"]), name
        for a, b in zip(first[2:], rec["dparams"]):
            assert torch.equal(a, b), name
    return varied


def _worst_text(worst):
    if worst is None:
        return "backward refused by FLA on this GPU (gated_backward_refusal): outputs compared, no gradients"
    return f"worst gradient {worst[1]}: relative difference {worst[2]:.3g} ({worst[0]:.2f} of its allowance)"


@pytest.mark.gpu
@needs_fla
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("conv_bias, packed", [(False, True), (True, True), (False, False)])
def test_gpu_layer_swapped_matches_fla(family, conv_bias, packed, monkeypatch):
    worst = check_layer("cuda", family, conv_bias, packed, monkeypatch)
    print(f"{family} layer conv_bias={conv_bias} packed={packed}: {_worst_text(worst)}")


@pytest.mark.gpu
@needs_fla
@pytest.mark.parametrize("family", FAMILIES)
def test_gpu_model_swapped_matches_fla(family, monkeypatch):
    loss_ref, loss_cake, worst = check_model_step("cuda", family, monkeypatch)
    print(f"{family} model loss fla {loss_ref:.5f} cake {loss_cake:.5f}; {_worst_text(worst)}")


@pytest.mark.gpu
@needs_fla
def test_gpu_gated_backward_refusal_is_flas_own():
    """Where FLA refuses GatedDeltaNet's backward, it is FLA's check (not cakeconv's) that raises."""
    refusal = gated_backward_refusal("cuda")
    print("GatedDeltaNet backward on this GPU:", "runs" if refusal is None else f"refused by FLA: {refusal}")
    if refusal is not None:
        assert "Triton" in refusal and "chunk_bwd_dqkwg" in refusal
        assert "cakeconv" not in refusal


@pytest.mark.gpu
@needs_fla
def test_gpu_model_training_tracks_fla():
    family = trainable_family("cuda")
    fla_losses, cake_losses = train_both("cuda", family, steps=50)
    diffs = [abs(a - b) / a for a, b in zip(fla_losses, cake_losses)]
    print(f"{family}, 50 steps: fla {fla_losses[0]:.4f} -> {fla_losses[-1]:.4f}, cake {cake_losses[0]:.4f} -> "
          f"{cake_losses[-1]:.4f}, max relative difference {max(diffs):.3g}")
    assert all(map(lambda v: v == v, fla_losses + cake_losses))  # no NaN
    assert max(diffs) < 0.05
    for losses in (fla_losses, cake_losses):
        assert sum(losses[-5:]) / 5 < losses[0] - 0.2  # it learns


@pytest.mark.gpu
@needs_fla
@pytest.mark.parametrize("family", FAMILIES)
def test_gpu_model_generation_after_swap(family):
    tokens_ref, tokens_cake, logits = generate_both("cuda", family)
    err, allowance = close_to_fla("no-cache logits", *logits, TOL_OUT)
    print(f"{family}: generated {tokens_ref.tolist()} / {tokens_cake.tolist()}; no-cache logits relative "
          f"difference {err:.3g} (allowance {allowance:.3g})")
    assert tokens_ref.shape[1] == 24 + 8
    assert torch.equal(tokens_ref, tokens_cake)


@pytest.mark.gpu
@needs_fla
def test_gpu_model_step_twice_conv_bitwise():
    family = trainable_family("cuda")
    varied = check_step_twice_bitwise("cuda", family)
    # Not an error: the convolutions are then checked on fixed tensors. Shown with `pytest -rP`.
    print(f"{family}: convolutions whose inputs varied between the two runs (FLA's other kernels):", varied or "none")


@pytest.mark.gpu
@pytest.mark.parametrize("W,activation", [(3, None), (7, None), (2, "silu"), (8, "swish")])
def test_gpu_short_convolution_any_width_matches_fla(W, activation, monkeypatch):
    """FLA's own ShortConvolution (its Triton kernels take any width and no activation) against the
    same module swapped, packed bf16: cakeconv ran at the module's width, and y, dx, dweight and
    dbias are within bf16 tolerance of FLA's."""
    ShortConvolution = pytest.importorskip("fla.modules").ShortConvolution
    D = 512
    torch.manual_seed(0)
    ref = ShortConvolution(D, W, bias=True, activation=activation).to(device="cuda", dtype=torch.bfloat16)
    cake = copy.deepcopy(ref)
    assert swap_short_convolutions(cake).swapped == 1
    calls = count_cake_calls(monkeypatch)
    cu = torch.tensor([0] + DOC_LENGTHS, dtype=torch.int64).cumsum(0).to(torch.int32).cuda()
    gen = torch.Generator().manual_seed(W)
    x, dy = (torch.randn(1, int(cu[-1]), D, generator=gen).to("cuda", torch.bfloat16) for _ in range(2))
    got = {}
    for key, module in (("fla", ref), ("cake", cake)):
        xi = x.clone().requires_grad_()
        y, _ = module(xi, cu_seqlens=cu)
        y.backward(dy)
        got[key] = (y.detach(), xi.grad, module.weight.grad, module.bias.grad)
    assert len(calls) == 1
    for name, a, b, tol in zip(("y", "dx", "dweight", "dbias"), got["cake"], got["fla"],
                               (TOL_OUT, TOL_GRAD, TOL_GRAD, TOL_GRAD)):
        assert _rel(a, b) < tol, (name, _rel(a, b))
