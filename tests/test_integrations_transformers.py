"""cakeconv.integrations.transformers: ``swap_causal_conv1d`` on each of transformers' designs.

The swap rebinds modeling modules' globals: process-wide. Every test here starts and ends with
``unswap_causal_conv1d()`` (the autouse fixture ``nothing_swapped``), and a model compared against
a swapped one runs before the swap.

Tiers (cheapest first):

1. CPU, no transformers needed: stand-ins written here after transformers' code, with this file
   as their modeling module. ``ModuleLevelMixer`` calls the global ``causal_conv1d_fn`` of this
   file (a PyTorch fallback that refuses ``seq_idx``, as transformers 5.x's does) from a forward
   wrapped in two decorators; ``HelperLevelMixer`` reaches that global through a decorated module
   function (transformers 5.25's ``causal_conv1d_forward``); ``AttributeMixer`` holds
   ``self.causal_conv1d_fn = None`` and ``self.causal_conv1d_update = None`` as transformers 4.57's
   Qwen3-Next layer. On them: the report (one entry per depthwise convolution, ``swapped`` counts),
   idempotence, the process-wide effect, ``unswap_causal_conv1d`` restoring the very objects, what
   reaches cakeconv, seq_idx and unknown keywords, other activations, prefill + decode, parameters
   and optimizer, deepcopy and pickle, the unreached cases with their reasons and the warning, the
   mamba_ssm path with a stand-in ``cakeconv.integrations.mamba_ssm``, errors.
2. CPU with transformers importable (``pytest.importorskip``; the ``test`` extra installs it): each
   of the 25 families of transformers 5.25 whose modeling file calls the short convolution, a tiny
   random model (config only, nothing downloaded, FP32, cake backend "reference"), run before the
   swap and after it: every call of the modeling module's ``causal_conv1d_fn`` reaches cakeconv's
   op (counted, with the same widths and activations), loss and every gradient within FP32
   tolerance, the same greedy tokens, ``seq_idx`` through the family's ``causal_conv1d_forward``
   keeping documents apart (and reaching the convolution from the model's forward where the layers
   pass it on), and a report naming each convolution (Qwen4-Exp's dilated one unreached, with its
   reason). The seven Mamba-style families with a stand-in mamba_ssm package (fused kernels resolved
   to it by transformers' own decorator): ``cakeconv.integrations.mamba_ssm`` is swapped and its
   report merged. Form 3's hub kernels (``kernels.kernelize``'s place) on LFM2. Qwen3-Next's
   swapped convolution repeats bitwise; a swapped model deep-copies and pickles.
3. GPU (marked ``gpu``): Qwen3-Next in bf16 on the Triton backend (transformers' PyTorch delta
   rule, which every GPU and Triton version runs backward), within bf16 tolerance, with step
   times; the LFM2, LFM2-MoE, LFM3 and Inkling models in bf16, within bf16 tolerance.

Shape legend: B batch rows, T tokens per row, D channels, W taps, V vocabulary.
"""

from __future__ import annotations

import copy
import functools
import pickle
import sys
import time
import types
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import cakeconv.integrations
import cakeconv.integrations.dao as cdao
from cakeconv import cake_causal_conv1d_det
from cakeconv.integrations import transformers as ctf
from cakeconv.integrations.report import CakeconvSwapWarning, SwapEntry, SwapReport
from cakeconv.integrations.transformers import is_swapped, swap_causal_conv1d, unswap_causal_conv1d

THIS = sys.modules[__name__]
FALLBACK_CALLS = []


# --------------------------------------------------------------------------- stand-ins (tier 1)

def causal_conv1d_fn(hidden_states, weight, bias=None, activation=None, **kwargs):
    """transformers 5.x's PyTorch fallback, as its wrapper behaves without causal-conv1d."""
    if kwargs.get("seq_idx") is not None:
        raise ValueError("`causal_conv1d_fn` can't keep packed sequences apart without `causal_conv1d`")
    FALLBACK_CALLS.append(activation)
    T = hidden_states.shape[-1]
    out = F.conv1d(hidden_states.to(weight.dtype), weight.unsqueeze(1), bias, padding=weight.shape[-1] - 1,
                   groups=hidden_states.shape[1])[..., :T]
    if activation == "gelu":
        out = F.gelu(out)
    elif activation is not None:
        out = F.silu(out)
    return out.to(hidden_states.dtype)


ORIGINAL_FN = causal_conv1d_fn


def count_calls(forward):
    """Like transformers' ``force_accelerate_hooks``: a wrapper holding ``forward`` in its closure."""
    @functools.wraps(forward)
    def wrapped(self, *args, **kwargs):
        self.wrapper_calls += 1
        return forward(self, *args, **kwargs)
    return wrapped


def rename_kwarg(old, new):
    """Like transformers' ``deprecate_kwarg``: a decorator factory, two closures deep."""
    def decorator(forward):
        @functools.wraps(forward)
        def wrapped(*args, **kwargs):
            if old in kwargs:
                kwargs[new] = kwargs.pop(old)
            return forward(*args, **kwargs)
        return wrapped
    return decorator


class MixerBase(nn.Module):
    def __init__(self, D=16, W=4, activation="silu", bias=False, dilation=1):
        super().__init__()
        self.proj = nn.Linear(D, D, bias=False)
        self.conv1d = nn.Conv1d(D, D, W, groups=D, padding=W - 1, bias=bias, dilation=dilation)
        self.activation = activation
        self.wrapper_calls = 0

    def forward(self, hidden_states, **kwargs):
        return self.proj(hidden_states)


class ModuleLevelMixer(MixerBase):
    """transformers 5.x's form: the global causal_conv1d_fn, called from a decorated forward."""

    @count_calls
    @rename_kwarg("cache_params", "cache")
    def forward(self, hidden_states, cache=None, **kwargs):
        x_BDT = super().forward(hidden_states).transpose(1, 2)
        y_BDT = causal_conv1d_fn(x_BDT, self.conv1d.weight.squeeze(1), self.conv1d.bias, activation=self.activation,
                                 **kwargs)
        return y_BDT.transpose(1, 2)


def keep_args(fn):
    """A decorator holding ``fn`` in its closure (transformers' hub-kernel decorators without ``kernels``)."""
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        return fn(*args, **kwargs)
    return wrapped


@keep_args
def conv_forward(conv1d, x_BDT, activation=None, **kwargs):
    """transformers 5.25's ``causal_conv1d_forward``: a module function between the layer and
    ``causal_conv1d_fn``."""
    return causal_conv1d_fn(x_BDT, conv1d.weight.squeeze(1), conv1d.bias, activation=activation, **kwargs)


class HelperLevelMixer(MixerBase):
    """transformers 5.25's form without ``kernels``: forward calls a module function that calls the
    global causal_conv1d_fn."""

    def forward(self, hidden_states, **kwargs):
        x_BDT = super().forward(hidden_states).transpose(1, 2)
        return conv_forward(self.conv1d, x_BDT, activation=self.activation, **kwargs).transpose(1, 2)


def torch_update(x, conv_state, weight, bias=None, activation=None):
    """transformers 4.57's PyTorch decode step (the state is a shift register)."""
    T = x.shape[-1]
    new = torch.cat([conv_state, x], dim=-1).to(weight.dtype)
    conv_state.copy_(new[:, :, -conv_state.shape[-1]:])
    out = F.conv1d(new, weight.unsqueeze(1), bias, groups=x.shape[1])[..., -T:]
    return F.silu(out).to(x.dtype)


class AttributeMixer(MixerBase):
    """transformers 4.57's form: instance attributes, None without causal-conv1d."""

    def __init__(self, *args, update=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.causal_conv1d_fn = None
        self.causal_conv1d_update = update

    def forward(self, hidden_states, conv_state=None):
        x_BDT = self.proj(hidden_states).transpose(1, 2)
        T = x_BDT.shape[-1]
        if conv_state is not None and T == 1:
            y_BDT = self.causal_conv1d_update(x_BDT, conv_state, self.conv1d.weight.squeeze(1), self.conv1d.bias,
                                              self.activation)
        elif self.causal_conv1d_fn is not None:
            y_BDT = self.causal_conv1d_fn(x=x_BDT, weight=self.conv1d.weight.squeeze(1), bias=self.conv1d.bias,
                                          activation=self.activation, seq_idx=None)
        else:
            y_BDT = F.silu(self.conv1d(x_BDT)[..., :T])
        if conv_state is not None and T > 1:
            conv_state.copy_(F.pad(x_BDT, (conv_state.shape[-1] - T, 0)).detach())
        return y_BDT.transpose(1, 2)


class Stack(nn.Module):
    def __init__(self, cls, n=2, **kwargs):
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(cls(**kwargs) for _ in range(n))
        self.head = nn.Linear(16, 16)

    def forward(self, h, **kwargs):
        for layer in self.layers:
            h = h + layer(h, **kwargs)
        return self.head(h)


@pytest.fixture(autouse=True)
def nothing_swapped():
    """The swap is process-wide: each test starts and ends with every swap of this module undone."""
    unswap_causal_conv1d()
    yield
    unswap_causal_conv1d()


@pytest.fixture
def cake_calls(monkeypatch):
    """The calls that reach cakeconv's op through the integration: (cu_seqlens, taps shape, activation)."""
    calls = []

    def counting(x, weight, *args, **kwargs):
        calls.append((kwargs.get("cu_seqlens"), tuple(weight.shape), kwargs.get("activation", "silu")))
        return cake_causal_conv1d_det(x, weight, *args, **kwargs)

    monkeypatch.setattr(cdao, "cake_causal_conv1d_det", counting)
    FALLBACK_CALLS.clear()
    return calls


def _grads(model):
    return {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None}


def _quiet_swap(model, **kwargs):
    """``swap_causal_conv1d`` with its warning (tested on its own) silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CakeconvSwapWarning)
        return swap_causal_conv1d(model, **kwargs)


def test_module_level_form_is_rebound_process_wide(cake_calls):
    twin, model = Stack(ModuleLevelMixer), Stack(ModuleLevelMixer)
    h = torch.randn(2, 11, 16)
    y_plain = twin(h)  # before the swap: transformers' function
    y_plain.sum().backward()
    assert len(FALLBACK_CALLS) == 2 and not cake_calls
    report = swap_causal_conv1d(model)
    assert isinstance(report, SwapReport) and report.integration == "transformers"
    assert [e.where for e in report.entries] == ["layers.0.conv1d", "layers.1.conv1d"]
    assert all(e.on_cakeconv and e.newly_swapped and e.what == "Conv1d" for e in report.entries)
    assert f"ModuleLevelMixer calls causal_conv1d_fn of {__name__}, rebound" in report.entries[0].why
    assert report.swapped == 2 and swap_causal_conv1d(model).swapped == 0
    assert isinstance(THIS.causal_conv1d_fn, ctf.CakeCausalConv1dForTransformers)
    assert is_swapped(model.layers[0]) and is_swapped(twin.layers[0]), "process-wide: the twin is swapped too"
    assert not is_swapped(model.head) and type(model.layers[0]) is ModuleLevelMixer, "no class is changed"
    y = model(h)
    assert len(cake_calls) == 2 and len(FALLBACK_CALLS) == 2, "the swapped layers call cakeconv only"
    assert model.layers[0].wrapper_calls == 1, "the decorators still run"
    assert (y - y_plain).abs().max().item() < 1e-5
    y.sum().backward()
    g, g_plain = _grads(model), _grads(twin)
    assert all((g[k] - g_plain[k]).abs().max().item() < 1e-5 for k in g)
    model(h, cache_params=None)  # the renamed keyword still arrives renamed
    undone = unswap_causal_conv1d()
    assert [(e.where, e.on_cakeconv, e.newly_swapped) for e in undone.entries] == [
        (f"{__name__}.causal_conv1d_fn", False, True)]
    assert THIS.causal_conv1d_fn is ORIGINAL_FN, "the very object is back"
    assert not is_swapped(twin.layers[0]) and not unswap_causal_conv1d().entries
    twin(h)
    assert len(FALLBACK_CALLS) == 4 and len(cake_calls) == 4, "the twin runs transformers' function again"


def test_module_function_between_layer_and_fn_is_reached(cake_calls):
    plain, model = Stack(HelperLevelMixer), Stack(HelperLevelMixer)
    h = torch.randn(2, 9, 16)
    y_plain = plain(h)
    assert swap_causal_conv1d(model).swapped == 2 and swap_causal_conv1d(model).swapped == 0
    y = model(h)
    assert len(cake_calls) == 2 and len(FALLBACK_CALLS) == 2, "the layers reach cakeconv through the helper"
    assert (y - y_plain).abs().max().item() < 1e-5
    assert conv_forward.__wrapped__.__globals__ is vars(THIS), "the helper itself is the module's own"
    seq_idx = torch.tensor([[0] * 4 + [1] * 5] * 2, dtype=torch.int32)
    y = model(h, seq_idx=seq_idx)
    assert cake_calls[-1][0] is not None, "seq_idx passes through the helper's keywords"
    assert (y[:, 4:] - model(h[:, 4:])).abs().max().item() < 1e-5


def test_module_level_form_takes_seq_idx_and_ignores_other_keywords(cake_calls):
    model = Stack(ModuleLevelMixer, n=1)
    h = torch.randn(1, 12, 16)
    seq_idx = torch.tensor([[0] * 5 + [1] * 7], dtype=torch.int32)
    with pytest.raises(ValueError, match="packed sequences"):
        model(h, seq_idx=seq_idx)  # unswapped, the fallback refuses it
    swap_causal_conv1d(model)
    y = model(h, seq_idx=seq_idx, cu_seq_lens_q=torch.tensor([0, 5, 12]), max_length_q=7)
    assert cake_calls[-1][0] is not None, "seq_idx reached cakeconv as document boundaries"
    parts = [model(h[:, :5]), model(h[:, 5:])]
    assert (y - torch.cat(parts, dim=1)).abs().max().item() < 1e-5, "the documents stay apart"


def test_a_global_patched_after_the_swap_is_seen_and_left_by_the_unswap(cake_calls):
    model = Stack(ModuleLevelMixer, n=1)
    swap_causal_conv1d(model)
    bound = THIS.causal_conv1d_fn
    h = torch.randn(1, 6, 16)
    try:
        THIS.causal_conv1d_fn = lambda x, *args, **kwargs: torch.zeros_like(x)
        assert torch.count_nonzero(model.layers[0](h)) == 0, "the layers read the module's global at call time"
        undone = unswap_causal_conv1d()
        assert undone.entries[0].why == "rebound by someone else since the swap; left as it is"
        assert not undone.entries[0].newly_swapped and THIS.causal_conv1d_fn is not ORIGINAL_FN
    finally:
        THIS.causal_conv1d_fn = bound  # put back by its patcher: the swap's binding, no longer recorded
    assert swap_causal_conv1d(model).swapped == 0, "a binding of the swap found again is adopted"
    assert unswap_causal_conv1d().swapped == 1 and THIS.causal_conv1d_fn is ORIGINAL_FN


def test_module_level_form_passes_other_activations_to_transformers(cake_calls):
    model = Stack(ModuleLevelMixer, n=1, activation="gelu")
    h = torch.randn(2, 7, 16)
    y_plain = model(h)
    swap_causal_conv1d(model)
    assert torch.equal(model(h), y_plain)
    assert not cake_calls and FALLBACK_CALLS == ["gelu", "gelu"]


def test_attribute_form_is_per_instance_with_decode_and_unswap(cake_calls):
    plain, model = Stack(AttributeMixer, n=1), Stack(AttributeMixer, n=1)
    report = swap_causal_conv1d(model)
    assert report.swapped == 1 and swap_causal_conv1d(model).swapped == 0
    assert report.entries[0].why == "AttributeMixer.causal_conv1d_fn (instance attribute) set to cakeconv's"
    layer = model.layers[0]
    assert layer.causal_conv1d_fn is cdao.causal_conv1d_fn
    assert layer.causal_conv1d_update is cdao.causal_conv1d_update, "None becomes the delegated update"
    assert not is_swapped(plain.layers[0]) and plain.layers[0].causal_conv1d_fn is None, "per instance"
    h = torch.randn(2, 9, 16)
    y, y_plain = model(h), plain(h)
    assert len(cake_calls) == 1 and (y - y_plain).abs().max().item() < 1e-5
    state = torch.zeros(2, 16, 3)  # prefill 6 tokens, then one token at a time through the update
    pre = layer(h[:, :6], conv_state=state)
    steps = [layer(h[:, t:t + 1], conv_state=state) for t in range(6, 9)]
    assert (torch.cat([pre] + steps, dim=1) - layer(h)).abs().max().item() < 1e-5
    kept = Stack(AttributeMixer, n=1, update=torch_update)
    swap_causal_conv1d(kept, cake_backend="reference")
    assert kept.layers[0].causal_conv1d_update is torch_update, "an update already there is kept"
    assert kept.layers[0].causal_conv1d_fn.keywords == {"backend": "reference"}
    undone = unswap_causal_conv1d(model)
    assert [e.where for e in undone.entries] == [f"{__name__}.causal_conv1d_fn", "layers.0"] and undone.swapped == 2
    assert layer.causal_conv1d_fn is None and layer.causal_conv1d_update is None and not is_swapped(layer)
    assert is_swapped(kept.layers[0]), "an unswap with a model leaves other models' attributes"
    unswap_causal_conv1d()
    assert kept.layers[0].causal_conv1d_fn is None and kept.layers[0].causal_conv1d_update is torch_update


def test_swap_keeps_parameters_state_and_copies(cake_calls):
    model = Stack(ModuleLevelMixer)
    params = {k: p for k, p in model.named_parameters()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    swap_causal_conv1d(model, cake_backend="reference")
    assert all(p is params[k] for k, p in model.named_parameters())
    assert list(model.state_dict()) == list(state)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    h = torch.randn(2, 10, 16)
    model(h).square().mean().backward()
    optimizer.step()
    assert not torch.equal(model.layers[0].conv1d.weight, state["layers.0.conv1d.weight"])
    y = model(h)
    calls = len(cake_calls)
    for twin in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert all(is_swapped(layer) for layer in twin.layers) and type(twin.layers[0]) is ModuleLevelMixer
        assert torch.equal(twin(h), y)
    assert len(cake_calls) == calls + 4
    loaded = Stack(ModuleLevelMixer)
    loaded.load_state_dict(model.state_dict())
    assert (loaded(h) - y).abs().max().item() < 1e-5


def test_unreached_convolutions_are_reported_with_a_warning():
    """A dilated convolution in a swapped module, one whose layer does not call the function, and
    one with no layer around it: each named with its reason, and the swap warns."""
    model = nn.Sequential(Stack(ModuleLevelMixer, n=1), MixerBase(dilation=2), nn.Sequential(), nn.Conv1d(8, 8, 3))
    model[2].conv = nn.Conv1d(8, 8, 4, groups=8)
    with pytest.warns(CakeconvSwapWarning, match="2 of 3 places stay off cakeconv"):
        report = swap_causal_conv1d(model)
    entries = {e.where: e for e in report.entries}
    assert list(entries) == ["0.layers.0.conv1d", "1.conv1d", "2.conv"], "only depthwise convolutions"
    assert entries["0.layers.0.conv1d"].on_cakeconv
    assert not entries["1.conv1d"].on_cakeconv and "dilated convolution (dilation 2)" in entries["1.conv1d"].why
    assert entries["2.conv"].why == "Sequential (torch.nn.modules.container) neither holds nor binds causal_conv1d_fn"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not swap_causal_conv1d(nn.Sequential(nn.Linear(4, 4), nn.Conv1d(4, 4, 3))).entries
    assert _quiet_swap(nn.Conv1d(8, 8, 4, groups=8)).entries[0].why == \
        "no layer owns it, so nothing calls causal_conv1d_fn on it"


def test_swap_bad_arguments():
    with pytest.raises(TypeError, match="torch.nn.Module"):
        swap_causal_conv1d(lambda x: x)
    with pytest.raises(ValueError, match="cake_backend"):
        swap_causal_conv1d(Stack(ModuleLevelMixer), cake_backend="cuda")
    with pytest.raises(TypeError, match="None or a torch.nn.Module"):
        unswap_causal_conv1d("model")
    with pytest.raises(TypeError, match="torch.nn.Module"):
        is_swapped(ModuleLevelMixer)
    assert THIS.causal_conv1d_fn is ORIGINAL_FN, "a refused swap changes nothing"


# ------------------------------------------------------------- mamba_ssm's fused kernels (tier 1)

class StandInCakeMambaSsm:
    """``cakeconv.integrations.mamba_ssm``'s API, recording its calls; ``reached``: what its swap says."""

    def __init__(self, reached=True):
        self.calls, self.reached, self.bound = [], reached, False

    def _entries(self, on, why, changed):
        names = ("causal_conv1d_fwd_function", "causal_conv1d_bwd_function")
        return tuple(SwapEntry(f"mamba_ssm.ops.triton.ssd_combined.{n}", "function", on, why, changed) for n in names)

    def swap(self, *, cake_backend="auto"):
        self.calls.append(("swap", cake_backend))
        warnings.warn("a stand-in's own warning, left to the merged report", CakeconvSwapWarning)
        if not self.reached:
            return SwapReport("mamba_ssm", self._entries(False, "module does not import (stand-in)", False))
        changed, self.bound = not self.bound, True
        return SwapReport("mamba_ssm", self._entries(True, "rebound (stand-in)", changed))

    def unswap(self):
        self.calls.append(("unswap",))
        self.bound = False
        return SwapReport("mamba_ssm", self._entries(False, "restored (stand-in)", True))

    def is_swapped(self):
        return self.bound


@pytest.fixture
def stand_in_mamba(monkeypatch):
    """This file (the stand-ins' modeling module) binds mamba_ssm's fused kernel, and
    ``cakeconv.integrations.mamba_ssm`` is a stand-in (set ``.reached`` before the swap)."""
    def mamba_split_conv1d_scan_combined(*args, **kwargs):
        raise AssertionError("not called in these tests")

    # mamba_ssm's fused Mamba2 kernel, bound as transformers 4.57 binds it (the function itself)
    mamba_split_conv1d_scan_combined.__module__ = "mamba_ssm.ops.triton.ssd_combined"
    stand_in = StandInCakeMambaSsm()
    monkeypatch.setattr(THIS, "fused_kernel", mamba_split_conv1d_scan_combined, raising=False)
    monkeypatch.setitem(sys.modules, "cakeconv.integrations.mamba_ssm", stand_in)
    monkeypatch.setattr(cakeconv.integrations, "mamba_ssm", stand_in, raising=False)
    return stand_in


def test_fused_mamba_ssm_kernels_are_swapped_and_merged(stand_in_mamba, recwarn):
    model = Stack(ModuleLevelMixer, n=1)
    report = swap_causal_conv1d(model, cake_backend="reference")
    assert stand_in_mamba.calls == [("swap", "reference")]
    assert report.integration == "transformers+mamba_ssm" and len(report.entries) == 3
    conv = report.entries[0]
    assert conv.on_cakeconv and conv.newly_swapped and "its fused training path (mamba_split_conv1d_scan_combined " \
        "of mamba_ssm.ops.triton.ssd_combined) through cakeconv.integrations.mamba_ssm" in conv.why
    assert not [w for w in recwarn if issubclass(w.category, CakeconvSwapWarning)], "all reached: no warning"
    assert swap_causal_conv1d(model).swapped == 0
    undone = unswap_causal_conv1d(model)
    assert stand_in_mamba.calls[-1] == ("unswap",) and undone.integration == "transformers+mamba_ssm"
    assert unswap_causal_conv1d().entries == (), "nothing left to undo"
    assert stand_in_mamba.calls.count(("unswap",)) == 1


def test_fused_mamba_ssm_kernels_unreached_are_reported(stand_in_mamba):
    stand_in_mamba.reached = False
    with pytest.warns(CakeconvSwapWarning) as caught:
        report = swap_causal_conv1d(Stack(ModuleLevelMixer, n=1))
    assert len(caught) == 1, "the merged report warns once"
    conv = report.entries[0]
    assert not conv.on_cakeconv and conv.why.startswith(
        "ModuleLevelMixer's fused training path (mamba_ssm, CUDA, no cache) runs the convolution inside "
        "mamba_split_conv1d_scan_combined of mamba_ssm.ops.triton.ssd_combined (module does not import (stand-in)")
    unswap_causal_conv1d()
    assert ("unswap",) not in stand_in_mamba.calls, "the mamba_ssm swap changed nothing, so it is not undone"


# ------------------------------------------------------------------- transformers' families (tier 2)

TINY = dict(vocab_size=96, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
            max_position_embeddings=128)
LINEAR = dict(linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
              linear_num_value_heads=4)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
MAMBA2 = dict(mamba_d_state=16, mamba_n_heads=4, mamba_d_head=32, mamba_chunk_size=16)
MLA = dict(num_key_value_heads=2, intermediate_size=96, moe_intermediate_size=32, num_experts=4,
           num_experts_per_token=2, num_shared_experts=1, kv_lora_rank=16, qk_rope_head_dim=8, v_head_dim=16,
           qk_nope_head_dim=16, head_dim=8, linear_head_dim=16, linear_num_heads=2,
           layer_types=["linear_attention", "full_attention"], mlp_layer_types=["dense", "sparse"], pad_token_id=0,
           eos_token_id=2)
INKLING2 = dict(head_dim=32, swa_num_attention_heads=2, swa_num_key_value_heads=1, swa_head_dim=32,
                sliding_window_size=8, rel_extent=16, layer_types=["hybrid_sliding", "hybrid"],
                moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2, unpadded_vocab_size=96,
                n_layers_per_attn_res_block=1, eos_token_id=2, log_scaling_n_floor=16)

# family -> (model class, config class, config fields beyond TINY). Every family's convolutions are
# reached but those named in UNREACHED; NO_SEQ_IDX: layers that do not pass seq_idx on to the conv.
FAMILIES = {
    "bailing_hybrid": ("BailingHybridForCausalLM", "BailingHybridConfig",
                       dict(MLA, num_expert_group=1, topk_group=1, first_k_dense_replace=1, layer_group_size=2,
                            expert_swiglu_limit_list=[0, 0], share_expert_swiglu_limit_list=[0, 0],
                            num_nextn_predict_layers=0)),
    "bamba": ("BambaForCausalLM", "BambaConfig", dict(MAMBA2, intermediate_size=96, attn_layer_indices=[1])),
    "falcon_h1": ("FalconH1ForCausalLM", "FalconH1Config", dict(MAMBA2, intermediate_size=96, mamba_d_ssm=64,
                                                                 mamba_d_head=16)),
    "falcon_mamba": ("FalconMambaForCausalLM", "FalconMambaConfig", dict(state_size=8, intermediate_size=128,
                                                                         time_step_rank=8)),
    "glm5_next": ("Glm5NextForConditionalGeneration", "Glm5NextConfig",
                  dict(text_config=dict(TINY, num_key_value_heads=2, intermediate_size=96, moe_intermediate_size=32,
                                        n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, kv_lora_rank=16,
                                        q_lora_rank=16, qk_rope_head_dim=0, v_head_dim=16, qk_nope_head_dim=16,
                                        linear_head_dim=16, linear_num_heads=2,
                                        layer_types=["linear_attention", "indexed_attention"],
                                        mlp_layer_types=["dense", "sparse"], indexer_types=["full", "full"],
                                        hc_mult=2, index_topk=16, index_kpool=4, index_head_dim=16, index_n_heads=2,
                                        pad_token_id=0),
                       vision_config=dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=32,
                                          out_hidden_size=64))),
    "granitemoehybrid": ("GraniteMoeHybridForCausalLM", "GraniteMoeHybridConfig",
                         dict(MAMBA2, intermediate_size=96, num_local_experts=4, num_experts_per_tok=2,
                              shared_intermediate_size=32, layer_types=["linear_attention", "attention"])),
    "inkling": ("InklingForCausalLM", "InklingTextConfig",
                dict(head_dim=32, swa_num_attention_heads=2, swa_num_key_value_heads=1, swa_head_dim=32,
                     sliding_window_size=8, rel_extent=16, layer_types=["hybrid_sliding", "hybrid"],
                     mlp_layer_types=["dense", "sparse"], intermediate_size=96, moe_intermediate_size=32,
                     n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1)),
    "inkling2": ("Inkling2ForCausalLM", "Inkling2TextConfig", INKLING2),
    "inkling2_loop": ("Inkling2LoopForCausalLM", "Inkling2LoopTextConfig",
                      dict(INKLING2, num_hidden_layers=3, layer_types=["hybrid_sliding", "hybrid", "hybrid_sliding"],
                           loop_layer_index_start=1, loop_layer_index_end=2, loop_num_passes=2, loop_gate_rank=8)),
    "jamba": ("JambaForCausalLM", "JambaConfig",
              dict(intermediate_size=96, num_experts=4, num_experts_per_tok=2, expert_layer_period=2,
                   expert_layer_offset=1, attn_layer_period=2, attn_layer_offset=1, mamba_d_state=8, mamba_dt_rank=8,
                   use_mamba_kernels=False)),
    "kimi_linear": ("KimiLinearForCausalLM", "KimiLinearConfig", dict(MLA, bos_token_id=1)),
    "lara_mini": ("LaraMiniForCausalLM", "LaraMiniConfig",
                  dict(**LINEAR, **MOE, head_dim=32, shared_expert_intermediate_size=32,
                       layer_types=["linear_attention", "full_attention"], eos_token_id=2, sliding_window=8)),
    "lfm2": ("Lfm2ForCausalLM", "Lfm2Config", dict(intermediate_size=96, layer_types=["conv", "full_attention"])),
    "lfm2_moe": ("Lfm2MoeForCausalLM", "Lfm2MoeConfig",
                 dict(MOE, intermediate_size=96, num_dense_layers=1, layer_types=["conv", "full_attention"])),
    "lfm3": ("Lfm3ForCausalLM", "Lfm3Config", dict(intermediate_size=96, head_dim=32,
                                                   layer_types=["conv", "full_attention"], pad_token_id=0,
                                                   bos_token_id=1, eos_token_id=2)),
    "mamba": ("MambaForCausalLM", "MambaConfig", dict(state_size=8, intermediate_size=128, time_step_rank=8)),
    "mamba2": ("Mamba2ForCausalLM", "Mamba2Config", dict(num_heads=4, head_dim=32, state_size=16, n_groups=1,
                                                         chunk_size=16)),
    "nemotron_h": ("NemotronHForCausalLM", "NemotronHConfig",
                   dict(layers_block_type=["mamba", "attention"], head_dim=32, intermediate_size=96, ssm_state_size=16,
                        mamba_num_heads=4, mamba_head_dim=32, n_groups=1, chunk_size=16, moe_intermediate_size=32,
                        moe_shared_expert_intermediate_size=32, n_routed_experts=4)),
    "olmo_hybrid": ("OlmoHybridForCausalLM", "OlmoHybridConfig",
                    dict(LINEAR, intermediate_size=96, layer_types=["linear_attention", "full_attention"],
                         pad_token_id=0, eos_token_id=2)),
    "qwen3_5": ("Qwen3_5ForCausalLM", "Qwen3_5TextConfig",
                dict(LINEAR, intermediate_size=96, head_dim=32, layer_types=["linear_attention", "full_attention"])),
    "qwen3_5_moe": ("Qwen3_5MoeForCausalLM", "Qwen3_5MoeTextConfig",
                    dict(**LINEAR, **MOE, head_dim=32, shared_expert_intermediate_size=32,
                         layer_types=["linear_attention", "full_attention"])),
    "qwen3_next": ("Qwen3NextForCausalLM", "Qwen3NextConfig",
                   dict(**LINEAR, **MOE, intermediate_size=96, head_dim=32, shared_expert_intermediate_size=32,
                        layer_types=["linear_attention", "full_attention"])),
    "qwen4_exp": ("Qwen4ExpForCausalLM", "Qwen4ExpTextConfig",
                  dict(**LINEAR, **MOE, head_dim=32, shared_expert_intermediate_size=32,
                       layer_types=["linear_attention", "indexed_attention"], hc_count=2, hc_lowrank=8,
                       ple_layer_ids=[1], ple_embed_dim=16, ngram_size=2, heads_per_ngram=2,
                       ngram_vocab_size_base=1000, make_ngram_vocab_size_divisible_by=8, split_ngram_parts=4,
                       eos_token_id=2, indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=32, indexer_budget=16,
                       indexer_compress_ratio=4)),
    "zamba": ("ZambaForCausalLM", "ZambaConfig",
              dict(intermediate_size=96, attention_hidden_size=128, attention_head_dim=64, n_mamba_heads=2,
                   mamba_d_state=8, mamba_dt_rank=8, attn_layer_period=2, attn_layer_offset=1, use_mamba_kernels=False,
                   num_hidden_layers=3, layers_block_type=["mamba", "hybrid", "hybrid"])),
    "zamba2": ("Zamba2ForCausalLM", "Zamba2Config",
               dict(intermediate_size=96, mamba_d_state=16, n_mamba_heads=4, mamba_headdim=32, chunk_size=16,
                    layers_block_type=["mamba", "hybrid"], hybrid_layer_ids=[1], use_mamba_kernels=False)),
}
UNREACHED = {"qwen4_exp": {"model.layers.0.ple.conv1d": "Qwen4ExpTextPLELayer's dilated convolution (dilation 2)"}}
NO_SEQ_IDX = {"falcon_mamba", "inkling", "jamba", "mamba"}
FUSED_FAMILIES = ("bamba", "falcon_h1", "granitemoehybrid", "mamba", "mamba2", "nemotron_h", "zamba2")


def build_family(family, device="cpu", dtype=torch.float32):
    """A tiny random model of ``family`` (config only, nothing downloaded), or a skip."""
    transformers = pytest.importorskip("transformers")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    model_name, config_name, fields = FAMILIES[family]
    if not hasattr(transformers, model_name):
        pytest.skip(f"transformers {transformers.__version__} has no {model_name}")
    fields = dict(fields) if "text_config" in fields else dict(TINY, **fields)
    config = getattr(transformers, config_name)(**fields)
    torch.manual_seed(0)
    return getattr(transformers, model_name)(config).to(device, dtype)


def depthwise_convs(model):
    return [name for name, m in model.named_modules() if isinstance(m, nn.Conv1d) and m.groups == m.in_channels > 1]


def modeling_module(model):
    """The modeling module of ``model``'s convolutions' layers."""
    named = dict(model.named_modules())
    owner = named[depthwise_convs(model)[0].rpartition(".")[0]]
    return sys.modules[type(owner).__module__]


@pytest.fixture
def transformers_calls(monkeypatch):
    """Install, in a modeling module, a counter in front of its ``causal_conv1d_fn``: the calls that
    reach transformers' own function, as (W, activation). Call it with the model before the swap."""
    calls = []

    def install(model):
        module = modeling_module(model)
        original = module.causal_conv1d_fn

        def counting(x, weight, *args, **kwargs):
            calls.append((weight.shape[-1], kwargs.get("activation")))
            return original(x, weight, *args, **kwargs)

        monkeypatch.setattr(module, "causal_conv1d_fn", counting)
        return counting

    install.calls = calls
    return install


def step_outputs(model, ids_BT):
    """Logits, loss and every gradient of one training step (FP32 copies)."""
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids_BT, labels=ids_BT)
    out.loss.backward()
    return out.logits.detach().float(), out.loss.detach().float(), {k: g.float() for k, g in _grads(model).items()}


def assert_close_outputs(got, want, tol):
    logits, loss, grads = got
    logits_ref, loss_ref, grads_ref = want
    assert (logits - logits_ref).abs().max().item() <= tol * logits_ref.abs().max().item()
    assert abs(loss.item() - loss_ref.item()) <= tol * loss_ref.item()
    assert grads.keys() == grads_ref.keys()
    for name, g in grads.items():
        err = (g - grads_ref[name]).abs().max().item()
        assert err <= tol * max(1.0, grads_ref[name].abs().max().item()), (name, err)


def _greedy(model, prompt_BT):
    with torch.no_grad():
        return model.generate(prompt_BT, max_new_tokens=4, do_sample=False)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_swapped_against_unswapped(family, cake_calls, transformers_calls):
    """One tiny model per family, run before the swap and after it (module docstring, tier 2)."""
    model = build_family(family)
    counting = transformers_calls(model)
    ids_BT = torch.randint(0, 96, (2, 23), generator=torch.Generator().manual_seed(3))
    want = step_outputs(model, ids_BT)
    plain_calls = sorted(transformers_calls.calls)
    tokens = _greedy(model, ids_BT[:1, :6])
    assert plain_calls and not cake_calls
    module = modeling_module(model)
    conv, owner = _conv_and_owner(model)
    x_BDT = torch.randn(1, conv.in_channels, 12, generator=torch.Generator().manual_seed(5))
    seq_idx_BT = torch.tensor([[0] * 5 + [1] * 7], dtype=torch.int32)
    activation = _activation(plain_calls, conv)
    with pytest.raises(ValueError, match="packed sequences"):
        module.causal_conv1d_forward(conv, x_BDT, None, 0, activation=activation, seq_idx=seq_idx_BT)

    report = _quiet_swap(model, cake_backend="reference")
    unreached = UNREACHED.get(family, {})
    assert [e.where for e in report.entries] == depthwise_convs(model)
    for entry in report.entries:
        assert entry.on_cakeconv == (entry.where not in unreached), entry
        assert entry.newly_swapped == entry.on_cakeconv
        if entry.where in unreached:
            assert entry.why.startswith(unreached[entry.where])
        else:
            assert f"calls causal_conv1d_fn of {module.__name__}, rebound to cakeconv's" in entry.why
    assert module.causal_conv1d_fn.original is counting

    transformers_calls.calls.clear()
    got = step_outputs(model, ids_BT)
    assert not transformers_calls.calls, "no call of the step reaches transformers' function"
    assert sorted((shape[1], activation) for _, shape, activation in cake_calls) == [
        (W, "silu" if act in ("silu", "swish") else act) for W, act in plain_calls], "every call reaches cakeconv's op"
    assert_close_outputs(got, want, tol=2e-5)
    assert torch.equal(_greedy(model, ids_BT[:1, :6]), tokens)

    del cake_calls[:]
    with torch.no_grad():
        y_BDT = module.causal_conv1d_forward(conv, x_BDT, None, 0, activation=activation, seq_idx=seq_idx_BT)
        parts = [module.causal_conv1d_forward(conv, x_BDT[..., s], None, 0, activation=activation)
                 for s in (slice(0, 5), slice(5, 12))]
    assert cake_calls[0][0] is not None and (y_BDT - torch.cat(parts, dim=-1)).abs().max().item() < 1e-5
    del cake_calls[:]
    try:
        with torch.no_grad():
            model(input_ids=ids_BT[:1, :12], seq_idx=seq_idx_BT)
    except ValueError as error:  # a later op of a layer (a delta rule, a scan) refuses seq_idx on the CPU
        assert "packed sequences" in str(error)
    assert (cake_calls[0][0] is not None) == (family not in NO_SEQ_IDX), "seq_idx from the model's forward"
    undone = unswap_causal_conv1d(model)
    assert undone.swapped == 1 and module.causal_conv1d_fn is counting


def _conv_and_owner(model):
    named = dict(model.named_modules())
    name = depthwise_convs(model)[0]
    return named[name], named[name.rpartition(".")[0]]


def _activation(plain_calls, conv):
    """The activation the family passes with this convolution's width (they agree in every family)."""
    return next(act for W, act in plain_calls if W == conv.kernel_size[0])


def fake_mamba_ssm(monkeypatch):
    """A stand-in mamba_ssm package in sys.modules: the modules ``cakeconv.integrations.mamba_ssm``
    rebinds (its ``MODULE_BINDINGS``), with causal-conv1d's names bound to None (not installed), and
    the two fused kernels. Returns {module name: module}."""
    from cakeconv.integrations.mamba_ssm import MODULE_BINDINGS

    for name in [n for n in sys.modules if n == "mamba_ssm" or n.startswith("mamba_ssm.")]:
        monkeypatch.delitem(sys.modules, name)
    modules = {}
    for dotted, bound_names in MODULE_BINDINGS.items():
        parts = dotted.split(".")
        for depth in range(1, len(parts) + 1):
            name = ".".join(parts[:depth])
            if name not in modules:
                modules[name] = types.ModuleType(name)
                modules[name].__path__ = []
                monkeypatch.setitem(sys.modules, name, modules[name])
                if depth > 1:
                    setattr(modules[".".join(parts[:depth - 1])], parts[depth - 1], modules[name])
        for bound in bound_names:
            setattr(modules[dotted], bound, None)
    for module_name, fused in (("mamba_ssm.ops.triton.ssd_combined", "mamba_split_conv1d_scan_combined"),
                               ("mamba_ssm.ops.selective_scan_interface", "mamba_inner_fn")):
        def kernel(*args, **kwargs):
            raise AssertionError("the CPU takes transformers' PyTorch path")
        kernel.__name__ = kernel.__qualname__ = fused
        kernel.__module__ = module_name
        setattr(modules[module_name], fused, kernel)
    return modules


def _fused_kernel_name(value):
    """The mamba_ssm kernel (one of ``FUSED_NAMES``) that a global of a modeling module stands for, or None:
    the name ``kernels`` records (transformers 5.25 with ``kernels``), else transformers' function's."""
    if isinstance(value, nn.Module):
        name = getattr(value, "kernel_layer_name", None)
        return name if name in ctf.FUSED_NAMES else None
    name = getattr(ctf._implementation(value), "__name__", "") if callable(value) else ""
    if name.endswith("split_conv1d_scan_combined"):  # transformers names it after the family (mamba2_...)
        return "mamba_split_conv1d_scan_combined"
    return name if name == "mamba_inner_fn" else None


@pytest.mark.parametrize("family", FUSED_FAMILIES)
def test_fused_family_with_a_stand_in_mamba_ssm(family, monkeypatch):
    """transformers' decorator resolves the family's fused kernel to a stand-in mamba_ssm; the swap
    then calls ``cakeconv.integrations.mamba_ssm.swap()``, whose report is merged, and the unswap
    undoes it."""
    from cakeconv.integrations import mamba_ssm as cake_mamba_ssm

    model = build_family(family)
    from transformers.integrations.hub_kernels import use_kernel_func_from_hub_with_fallback

    stand_in = fake_mamba_ssm(monkeypatch)
    module = modeling_module(model)
    for name, value in list(vars(module).items()):
        fused_name = _fused_kernel_name(value)
        if fused_name is not None:
            def torch_stand_in(*args, **kwargs):
                return None
            monkeypatch.setattr(module, name, use_kernel_func_from_hub_with_fallback(fused_name, "mamba_ssm")(
                torch_stand_in))
    fused = ctf._fused_mamba_ssm(module)
    impl_module = "mamba_ssm.ops.selective_scan_interface" if family == "mamba" else "mamba_ssm.ops.triton.ssd_combined"
    assert list(fused.values()) == [impl_module]
    with warnings.catch_warnings():
        warnings.simplefilter("error", CakeconvSwapWarning)  # every place is reached: no warning
        report = swap_causal_conv1d(model)
    assert report.integration == "transformers+mamba_ssm"
    convs = [e for e in report.entries if e.what != "function"]
    assert [e.where for e in convs] == depthwise_convs(model)
    assert all(e.on_cakeconv and f"its fused training path ({next(iter(fused))} of {impl_module}) through "
               f"cakeconv.integrations.mamba_ssm" in e.why for e in convs)
    assert stand_in[impl_module].causal_conv1d_fwd_function is cdao.causal_conv1d_fwd_function
    assert cake_mamba_ssm.is_swapped()
    undone = unswap_causal_conv1d(model)
    assert undone.integration == "transformers+mamba_ssm" and not cake_mamba_ssm.is_swapped()
    assert stand_in[impl_module].causal_conv1d_fwd_function is None


def test_hub_kernels_on_the_private_functions(cake_calls):
    """Form 3 (transformers 5.25 with ``kernels``): a hub kernel that ``kernelize`` put on a layer's
    private ``causal_conv1d_fn`` is bypassed by the rebound global; one on its private
    ``causal_conv1d_forward`` is not reached, and the report says so."""
    model = build_family("lfm2")
    layer = model.model.layers[0].conv
    funcs = layer.__dict__.get(ctf.KERNEL_FUNCS)
    if not funcs:
        pytest.skip("transformers without the kernels package: no per-instance function modules")

    class Refusing(nn.Module):
        def forward(self, *args, **kwargs):
            raise AssertionError("the hub kernel ran")

    ids_BT = torch.randint(0, 96, (2, 9), generator=torch.Generator().manual_seed(6))
    private = funcs["causal_conv1d_fn"]
    private.forward = types.MethodType(Refusing.forward, private)  # what kernels.kernelize does
    report = swap_causal_conv1d(model)
    model(input_ids=ids_BT)
    assert report.entries[0].on_cakeconv and len(cake_calls) == 1
    forward = funcs["causal_conv1d_forward"]
    forward.forward = types.MethodType(Refusing.forward, forward)
    with pytest.warns(CakeconvSwapWarning):
        entry = swap_causal_conv1d(model).entries[0]
    assert not entry.on_cakeconv and entry.why == (
        "kernelize put a hub kernel on Lfm2ShortConv's causal_conv1d_forward, which does not call causal_conv1d_fn")


def test_qwen3_next_repeats_bitwise_and_copies(cake_calls):
    """The swapped convolution's output repeats bitwise over steps, and a swapped model deep-copies
    and pickles (its copies are swapped too: the modeling module is) with the same logits."""
    model = build_family("qwen3_next")
    ids_BT = torch.randint(0, 96, (2, 37), generator=torch.Generator().manual_seed(1))
    swap_causal_conv1d(model)
    outputs = []
    real = cdao.cake_causal_conv1d_det

    def recording(*args, **kwargs):
        y = real(*args, **kwargs)
        outputs.append(y.detach().clone())
        return y

    cdao.cake_causal_conv1d_det = recording
    try:
        for _ in range(2):
            model.zero_grad()
            model(input_ids=ids_BT, labels=ids_BT).loss.backward()
    finally:
        cdao.cake_causal_conv1d_det = real
    assert len(outputs) == 2 and torch.equal(outputs[0], outputs[1])
    with torch.no_grad():
        want = model(input_ids=ids_BT).logits
        for twin in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
            assert sum(is_swapped(m) for m in twin.modules()) == sum(is_swapped(m) for m in model.modules()) > 0
            assert torch.equal(twin(input_ids=ids_BT).logits, want)


# ------------------------------------------------------------------- transformers' PyTorch delta rules

def _plain_function(rule):
    """transformers' own PyTorch function behind a decorated delta rule: the ``__wrapped__`` of its fallback
    wrapper (which picks fla's kernel when fla imports), also when that wrapper sits in a ``kernels`` function
    module (transformers 5.25: its forward holds the wrapper in a closure)."""
    if isinstance(rule, nn.Module):
        inner = [c.cell_contents for c in type(rule).forward.__closure__ or () if callable(c.cell_contents)]
        assert len(inner) == 1, f"a kernels function module holds one function, got {inner}"
        rule = inner[0]
    return getattr(rule, "__wrapped__", rule)


@pytest.fixture
def torch_delta_rules(monkeypatch):
    """transformers' PyTorch gated delta rules (chunked and recurrent) in place of the ones it
    resolved at import: flash-linear-attention's when ``fla`` imports (the ``test`` extra installs
    fla-core), whose Triton kernels need a GPU."""
    from transformers.models.qwen3_next import modeling_qwen3_next as module

    for name in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule"):
        fn = _plain_function(getattr(module, name))
        assert not isinstance(fn, nn.Module) and not hasattr(fn, "__wrapped__"), name
        monkeypatch.setattr(module, name, fn)


# ---------------------------------------------------------------------------------------- GPU

def _step_ms(model, ids, steps=5):
    for _ in range(2):
        model(input_ids=ids, labels=ids).loss.backward()
    torch.cuda.synchronize()
    times = []
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        model(input_ids=ids, labels=ids).loss.backward()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


@pytest.mark.gpu
def test_qwen3_next_swapped_against_unswapped_gpu(torch_delta_rules, cake_calls):
    # transformers' PyTorch delta rules here too: fla 0.6.0 refuses its chunked backward on Hopper
    # with Triton < 3.7.1
    transformers = pytest.importorskip("transformers")
    fields = dict(TINY, **FAMILIES["qwen3_next"][2])
    fields.update(hidden_size=256, linear_key_head_dim=64, linear_value_head_dim=64, head_dim=64, intermediate_size=512,
                  vocab_size=1000)
    torch.manual_seed(0)
    model = transformers.Qwen3NextForCausalLM(transformers.Qwen3NextConfig(**fields)).cuda().to(torch.bfloat16)
    ids = torch.randint(0, 1000, (2, 512), generator=torch.Generator().manual_seed(2)).cuda()
    want = step_outputs(model, ids)
    times = {"transformers": _step_ms(model, ids)}
    model32 = copy.deepcopy(model).float()  # greedy tokens in FP32 (bf16 could flip a near-tie)
    prompt = ids[:1, :16]
    tokens = _greedy(model32, prompt)
    assert swap_causal_conv1d(model).swapped == 1
    assert_close_outputs(step_outputs(model, ids), want, tol=3e-2)
    assert cake_calls, "the swapped layer ran cakeconv"
    times["cakeconv"] = _step_ms(model, ids)
    assert torch.equal(_greedy(model32, prompt), tokens)
    print(f"\nQwen3-Next hidden 256, bf16, 2 x 512 tokens, forward+backward ms: {times} "
          f"(transformers ran {'Dao' if cdao.dao_causal_conv1d() else 'its PyTorch fallback'})")


GPU_FAMILIES = ("lfm2", "lfm2_moe", "lfm3", "inkling")


@pytest.mark.gpu
@pytest.mark.parametrize("family", GPU_FAMILIES)
def test_family_swapped_against_unswapped_gpu(family, cake_calls):
    """The tiny models of ``test_family_swapped_against_unswapped`` in bf16 on the Triton backend,
    within bf16 tolerance of transformers' own path (Dao's function at W <= 4 where causal-conv1d
    imports, else its PyTorch fallback)."""
    model = build_family(family, "cuda", torch.bfloat16)
    conv, _ = _conv_and_owner(model)
    if conv.kernel_size[0] > 4 and cdao.dao_causal_conv1d() is not None:
        pytest.skip("transformers' own path calls causal-conv1d, whose kernels take W = 2..4 only")
    ids = torch.randint(0, 96, (2, 300), generator=torch.Generator().manual_seed(3)).cuda()
    want = step_outputs(model, ids)
    report = swap_causal_conv1d(model)
    assert_close_outputs(step_outputs(model, ids), want, tol=3e-2)
    assert len(cake_calls) == len(report.on_cakeconv) > 0
