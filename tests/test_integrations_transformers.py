"""cakeconv.integrations.transformers: ``swap_causal_conv1d`` on each of transformers' designs.

Tiers (cheapest first):

1. CPU, no transformers needed: stand-ins written here after transformers' code. ``ModuleLevelMixer``
   calls the global ``causal_conv1d_fn`` of this file (a PyTorch fallback that refuses ``seq_idx``,
   as transformers 5.x's does) from a forward wrapped in two decorators (one keeping the wrapped
   function in a closure, one in ``functools.wraps``) and from a helper method, and reaches
   ``super()``; ``HelperLevelMixer`` reaches that global through a decorated module function (as
   transformers 5.25's ``causal_conv1d_forward`` without the ``kernels`` package);
   ``AttributeMixer`` holds ``self.causal_conv1d_fn = None`` and
   ``self.causal_conv1d_update = None`` as transformers 4.57's Qwen3-Next layer. On them: the count,
   idempotence, per-instance effect (an unswapped twin keeps the fallback), what reaches cakeconv,
   seq_idx and unknown keywords, the decorators still running, prefill + decode, parameters and
   optimizer, deepcopy and pickle, errors.
2. CPU with transformers importable (``pytest.importorskip``; the ``test`` extra installs it): a tiny
   randomly initialised ``Qwen3NextForCausalLM`` (config only, nothing downloaded) swapped against
   unswapped, FP32: logits, loss and every gradient within FP32 tolerance, greedy tokens equal, the
   swapped convolutions' outputs bitwise equal on a second step; the families whose short
   convolution has another width or no activation (LFM2 and LFM2-MoE: W = 3, LFM3: W = 7, Inkling:
   W = 4, all without activation), each a tiny random model trained one step swapped against
   unswapped (every call counted at cakeconv's op with the real width and activation None; loss and
   every gradient within FP32 tolerance), and LFM2's layer on packed documents (``seq_idx``); and the
   model-swap benchmark's ``--dry-run``.
3. GPU (marked ``gpu``): the same model in bf16 on the Triton backend (transformers' PyTorch delta
   rule, which every GPU and Triton version runs backward), within bf16 tolerance, plus the step
   times of both, and of Dao's function where causal-conv1d imports; the LFM2, LFM2-MoE, LFM3 and
   Inkling models of tier 2 in bf16, within bf16 tolerance (each skipped where the installed
   transformers lacks it).

Shape legend: B batch rows, T tokens per row, D channels, W taps, V vocabulary.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import pickle
import subprocess
import sys
import time

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import cakeconv.integrations.dao as cdao
from cakeconv import cake_causal_conv1d_det
from cakeconv.integrations.transformers import is_swapped, swap_causal_conv1d

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FALLBACK_CALLS = []
TAP_SCALE = 1.0  # a global of the "modeling module" that the swapped methods read


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
    def __init__(self, D=16, W=4, activation="silu", bias=False):
        super().__init__()
        self.proj = nn.Linear(D, D, bias=False)
        self.conv1d = nn.Conv1d(D, D, W, groups=D, padding=W - 1, bias=bias)
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
        y_BDT = self.convolve(x_BDT, **kwargs)
        return y_BDT.transpose(1, 2)

    def convolve(self, x_BDT, **kwargs):
        return causal_conv1d_fn(x_BDT, self.conv1d.weight.squeeze(1) * TAP_SCALE, self.conv1d.bias,
                                activation=self.activation, **kwargs)


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
    return {k: p.grad.detach().clone() for k, p in model.named_parameters()}


def test_module_level_form_is_swapped_per_instance(cake_calls):
    plain, model = Stack(ModuleLevelMixer), Stack(ModuleLevelMixer)
    assert swap_causal_conv1d(model) == 2
    assert swap_causal_conv1d(model) == 0
    layer = model.layers[0]
    assert is_swapped(layer) and not is_swapped(plain.layers[0]) and not is_swapped(model.head)
    assert type(layer).__name__ == "ModuleLevelMixer" and isinstance(layer, ModuleLevelMixer)
    assert type(plain.layers[0]) is ModuleLevelMixer, "the class itself is untouched"
    h = torch.randn(2, 11, 16)
    y_plain = plain(h)
    assert len(FALLBACK_CALLS) == 2 and not cake_calls
    y = model(h)
    assert len(cake_calls) == 2 and len(FALLBACK_CALLS) == 2, "the swapped layers call cakeconv only"
    assert layer.wrapper_calls == 1, "the decorators still run"
    assert (y - y_plain).abs().max().item() < 1e-5
    y.sum().backward()
    y_plain.sum().backward()
    g, g_plain = _grads(model), _grads(plain)
    assert all((g[k] - g_plain[k]).abs().max().item() < 1e-5 for k in g)
    model(h, cache_params=None)  # the renamed keyword still arrives renamed


def test_module_function_between_layer_and_fn_is_rebound(cake_calls):
    plain, model = Stack(HelperLevelMixer), Stack(HelperLevelMixer)
    assert swap_causal_conv1d(model) == 2 and swap_causal_conv1d(model) == 0
    assert is_swapped(model.layers[0]) and not is_swapped(plain.layers[0])
    h = torch.randn(2, 9, 16)
    y_plain = plain(h)
    assert len(FALLBACK_CALLS) == 2 and not cake_calls
    y = model(h)
    assert len(cake_calls) == 2 and len(FALLBACK_CALLS) == 2, "the swapped layers reach cakeconv through the helper"
    assert (y - y_plain).abs().max().item() < 1e-5
    assert conv_forward.__globals__["causal_conv1d_fn"] is causal_conv1d_fn, "the module itself is untouched"
    seq_idx = torch.tensor([[0] * 4 + [1] * 5] * 2, dtype=torch.int32)
    y = model(h, seq_idx=seq_idx)
    assert cake_calls[-1][0] is not None, "seq_idx passes through the helper's keywords"
    assert (y[:, 4:] - model(h[:, 4:])).abs().max().item() < 1e-5


def test_module_level_form_takes_seq_idx_and_ignores_other_keywords(cake_calls):
    model = Stack(ModuleLevelMixer, n=1)
    swap_causal_conv1d(model)
    h = torch.randn(1, 12, 16)
    seq_idx = torch.tensor([[0] * 5 + [1] * 7], dtype=torch.int32)
    with pytest.raises(ValueError, match="packed sequences"):
        Stack(ModuleLevelMixer, n=1)(h, seq_idx=seq_idx)  # the unswapped fallback refuses it
    y = model(h, seq_idx=seq_idx, cu_seq_lens_q=torch.tensor([0, 5, 12]), max_length_q=7)
    assert cake_calls[-1][0] is not None, "seq_idx reached cakeconv as document boundaries"
    parts = [model(h[:, :5]), model(h[:, 5:])]
    assert (y - torch.cat(parts, dim=1)).abs().max().item() < 1e-5, "the documents stay apart"


def test_swapped_methods_see_the_module_globals_of_the_latest_swap(monkeypatch, cake_calls):
    first = Stack(ModuleLevelMixer, n=1)
    swap_causal_conv1d(first)
    h = torch.randn(1, 6, 16)
    assert torch.count_nonzero(first.layers[0](h))
    monkeypatch.setattr(sys.modules[__name__], "TAP_SCALE", 0.0)
    assert torch.count_nonzero(first.layers[0](h)), "a global patched after the swap is not seen yet"
    swap_causal_conv1d(Stack(ModuleLevelMixer, n=1))
    assert torch.count_nonzero(first.layers[0](h)) == 0, "the next swap refreshes every swapped class"


def test_module_level_form_passes_other_activations_to_transformers(cake_calls):
    model = Stack(ModuleLevelMixer, n=1, activation="gelu")
    plain = Stack(ModuleLevelMixer, n=1, activation="gelu")
    swap_causal_conv1d(model)
    h = torch.randn(2, 7, 16)
    assert torch.equal(model(h), plain(h))
    assert not cake_calls and FALLBACK_CALLS == ["gelu", "gelu"]


def test_attribute_form_none_and_decode(cake_calls):
    plain, model = Stack(AttributeMixer, n=1), Stack(AttributeMixer, n=1)
    assert swap_causal_conv1d(model) == 1 and swap_causal_conv1d(model) == 0
    layer = model.layers[0]
    assert layer.causal_conv1d_fn is cdao.causal_conv1d_fn
    assert layer.causal_conv1d_update is cdao.causal_conv1d_update, "None becomes the delegated update"
    assert type(layer) is AttributeMixer, "the attribute form changes no class"
    h = torch.randn(2, 9, 16)
    y, y_plain = model(h), plain(h)
    assert len(cake_calls) == 1 and (y - y_plain).abs().max().item() < 1e-5
    # prefill 6 tokens, then one token at a time through the update
    state = torch.zeros(2, 16, 3)
    lay = layer
    pre = lay(h[:, :6], conv_state=state)
    steps = [lay(h[:, t:t + 1], conv_state=state) for t in range(6, 9)]
    got = torch.cat([pre] + steps, dim=1)
    want = lay(h)
    assert (got - want).abs().max().item() < 1e-5
    kept = Stack(AttributeMixer, n=1, update=torch_update)
    swap_causal_conv1d(kept)
    assert kept.layers[0].causal_conv1d_update is torch_update, "an update already there is kept"


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
    for twin in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert all(is_swapped(layer) for layer in twin.layers)
        assert type(twin.layers[0]) is type(model.layers[0])
        assert torch.equal(twin(h), y)
    loaded = Stack(ModuleLevelMixer)
    loaded.load_state_dict(model.state_dict())
    assert (loaded(h) - y).abs().max().item() < 1e-5


def test_swap_bad_arguments():
    with pytest.raises(TypeError, match="torch.nn.Module"):
        swap_causal_conv1d(lambda x: x)
    with pytest.raises(ValueError, match="cake_backend"):
        swap_causal_conv1d(Stack(ModuleLevelMixer), cake_backend="cuda")
    assert swap_causal_conv1d(nn.Sequential(nn.Linear(4, 4), nn.Conv1d(4, 4, 3))) == 0


# ------------------------------------------------------------------- a real transformers model

def tiny_config(**over):
    transformers = pytest.importorskip("transformers")
    fields = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  layer_types=["linear_attention", "full_attention"], num_attention_heads=2, num_key_value_heads=1,
                  head_dim=32, linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
                  linear_num_key_heads=2, linear_num_value_heads=4, num_experts=4, num_experts_per_tok=2,
                  moe_intermediate_size=32, shared_expert_intermediate_size=32, max_position_embeddings=256)
    fields.update(over)
    return transformers.Qwen3NextConfig(**fields)


def _use_torch_delta_rules(monkeypatch, keep_function_modules=False):
    from transformers.models.qwen3_next import modeling_qwen3_next as module

    monkeypatch.syspath_prepend(os.path.join(REPO, "benchmarks"))
    from bench_model_swap import torch_delta_rules as plain_rules

    for name, fn in plain_rules().items():
        assert not isinstance(fn, nn.Module) and not hasattr(fn, "__wrapped__"), name
        if not (keep_function_modules and isinstance(getattr(module, name), nn.Module)):
            monkeypatch.setattr(module, name, fn)


@pytest.fixture
def torch_delta_rules(monkeypatch):
    """transformers' PyTorch gated delta rules (chunked and recurrent) in place of the ones it
    resolved at import: flash-linear-attention's when ``fla`` imports (the ``test`` extra installs
    fla-core), whose Triton kernels need a GPU. Set before the swap, which copies the modeling
    module's globals."""
    _use_torch_delta_rules(monkeypatch)


@pytest.fixture
def cpu_delta_rules(monkeypatch):
    """``torch_delta_rules`` for CPU inputs, where a rule that is a ``kernels`` function module
    (transformers 5.25) is kept: its wrapper sends CPU inputs to the PyTorch rule itself, and the
    module's private copies unpickle only when the global is still such a module."""
    _use_torch_delta_rules(monkeypatch, keep_function_modules=True)


def tiny_pair(device="cpu", dtype=torch.float32, **over):
    from transformers import Qwen3NextForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.manual_seed(0)
    plain = Qwen3NextForCausalLM(tiny_config(**over)).to(device, dtype)
    model = copy.deepcopy(plain)
    return plain, model


def compare_step(plain, model, ids, tol):
    out_plain = plain(input_ids=ids, labels=ids)
    out = model(input_ids=ids, labels=ids)
    out_plain.loss.backward()
    out.loss.backward()
    scale = out_plain.logits.abs().max().item()
    assert (out.logits - out_plain.logits).abs().max().item() <= tol * scale
    assert abs(out.loss.item() - out_plain.loss.item()) <= tol * out_plain.loss.item()
    g_plain = dict(plain.named_parameters())
    for name, p in model.named_parameters():
        ref = g_plain[name].grad
        err = (p.grad.float() - ref.float()).abs().max().item()
        assert err <= tol * max(1.0, ref.abs().max().item()), (name, err)
    return out


def test_qwen3_next_swapped_against_unswapped_cpu(torch_delta_rules, cake_calls):
    plain, model = tiny_pair()
    assert swap_causal_conv1d(model) == 1  # one GatedDeltaNet layer
    assert swap_causal_conv1d(model) == 0
    ids = torch.randint(0, 96, (2, 37), generator=torch.Generator().manual_seed(1))
    compare_step(plain, model, ids, tol=2e-5)
    assert len(cake_calls) == 1
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
            model(input_ids=ids, labels=ids).loss.backward()
    finally:
        cdao.cake_causal_conv1d_det = real
    assert torch.equal(outputs[0], outputs[1]), "the swapped convolution repeats bitwise"
    prompt = ids[:1, :6]
    with torch.no_grad():
        want = plain.generate(prompt, max_new_tokens=5, do_sample=False)
        got = model.generate(prompt, max_new_tokens=5, do_sample=False)
    assert torch.equal(got, want)


def test_qwen3_next_swap_is_per_instance_and_survives_copies(cpu_delta_rules, cake_calls):
    """Whichever of the forms the installed transformers has (5.25 with ``kernels``: the layer's
    private kernel function): an unswapped twin keeps transformers' function, and a swapped model
    deep-copied or pickled is still swapped and gives the same logits."""
    plain, model = tiny_pair()
    assert swap_causal_conv1d(model) == 1
    layer = next(m for m in model.modules() if is_swapped(m))
    assert not any(is_swapped(m) for m in plain.modules())
    ids = torch.randint(0, 96, (2, 19), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        plain(input_ids=ids)
        assert not cake_calls, "the unswapped twin does not reach cakeconv"
        want = model(input_ids=ids).logits
        assert len(cake_calls) == 1
        for twin in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
            assert sum(is_swapped(m) for m in twin.modules()) == 1
            assert type(next(m for m in twin.modules() if is_swapped(m))).__name__ == type(layer).__name__
            assert torch.equal(twin(input_ids=ids).logits, want)
    assert len(cake_calls) == 3


# Families whose short convolution is not Qwen3-Next's W = 4 + SiLU: family -> (model class, config
# class, config fields beyond TINY_FIELDS, W, convolution modules swapped). Every one passes
# activation=None; Inkling has four convolutions per layer (k, v, after attention, after the MLP).
TINY_FIELDS = dict(vocab_size=96, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                   max_position_embeddings=128)
SHORT_CONV_FAMILIES = {
    "lfm2": ("Lfm2ForCausalLM", "Lfm2Config", dict(intermediate_size=96, layer_types=["conv", "full_attention"]), 3, 1),
    "lfm2_moe": ("Lfm2MoeForCausalLM", "Lfm2MoeConfig",
                 dict(intermediate_size=96, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                      num_dense_layers=1, layer_types=["conv", "full_attention"]), 3, 1),
    "lfm3": ("Lfm3ForCausalLM", "Lfm3Config",
             dict(intermediate_size=96, head_dim=32, layer_types=["conv", "full_attention"], pad_token_id=0,
                  bos_token_id=1, eos_token_id=2), 7, 1),
    "inkling": ("InklingForCausalLM", "InklingTextConfig",
                dict(head_dim=32, swa_num_attention_heads=2, swa_num_key_value_heads=1, swa_head_dim=32,
                     sliding_window_size=8, rel_extent=16, layer_types=["hybrid_sliding", "hybrid"],
                     mlp_layer_types=["dense", "sparse"], intermediate_size=96, moe_intermediate_size=32,
                     n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1), 4, 8),
}


def short_conv_pair(family, device="cpu", dtype=torch.float32):
    """(unswapped, swapped copy, W, convolutions): a tiny random model of ``family`` (config only,
    nothing downloaded) and a deep copy of it after ``swap_causal_conv1d``."""
    transformers = pytest.importorskip("transformers")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    model_name, config_name, fields, W, n_convs = SHORT_CONV_FAMILIES[family]
    if not hasattr(transformers, model_name):
        pytest.skip(f"transformers {transformers.__version__} has no {model_name}")
    config = getattr(transformers, config_name)(**TINY_FIELDS, **fields)
    torch.manual_seed(0)
    plain = getattr(transformers, model_name)(config).to(device, dtype)
    model = copy.deepcopy(plain)
    assert swap_causal_conv1d(model) == n_convs and swap_causal_conv1d(model) == 0
    return plain, model, W, n_convs


@pytest.mark.parametrize("family", list(SHORT_CONV_FAMILIES))
def test_short_conv_family_trains_through_cakeconv(family, cake_calls):
    """One training step swapped against unswapped: each convolution ran cakeconv's op once, with
    its real width and no activation; loss, logits and every gradient within FP32 tolerance."""
    plain, model, W, n_convs = short_conv_pair(family)
    ids = torch.randint(0, 96, (2, 23), generator=torch.Generator().manual_seed(3))
    compare_step(plain, model, ids, tol=2e-5)
    assert [(shape[1], activation) for _, shape, activation in cake_calls] == [(W, None)] * n_convs


def test_lfm2_layer_keeps_packed_documents_apart(cake_calls):
    """LFM2's convolution layer with seq_idx (transformers' fallback refuses it): the documents of a
    packed row give what they give alone."""
    plain, model, _, _ = short_conv_pair("lfm2")
    layer, plain_layer = model.model.layers[0].conv, plain.model.layers[0].conv
    h = torch.randn(1, 12, 64, generator=torch.Generator().manual_seed(5))
    seq_idx = torch.tensor([[0] * 5 + [1] * 7], dtype=torch.int32)
    with pytest.raises(ValueError, match="packed sequences"):
        plain_layer(h, seq_idx=seq_idx)
    with torch.no_grad():
        y = layer(h, seq_idx=seq_idx)
        parts = torch.cat([layer(h[:, :5]), layer(h[:, 5:])], dim=1)
    assert cake_calls[0][0] is not None, "seq_idx reached cakeconv as document boundaries"
    assert (y - parts).abs().max().item() < 1e-5


def test_model_swap_benchmark_dry_run(tmp_path):
    pytest.importorskip("transformers")
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), BENCH_COMMIT="test")
    out = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "bench_model_swap.py"), "--dry-run",
                          "--out", str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    result = json.loads((tmp_path / "bench_model_swap.json").read_text())
    rows = result["rows"]
    assert set(rows) >= {"transformers", "cakeconv"} and result["env"]["commit"] == "test"
    for row in rows.values():
        assert row["error"] is None and row["median_ms"] > 0
    assert abs(rows["cakeconv"]["first_loss"] - rows["transformers"]["first_loss"]) < 1e-4
    assert "cakeconv" in out.stdout and "vs transformers" in out.stdout


def test_model_swap_benchmark_forced_rows_reach_their_function(tmp_path, monkeypatch):
    """Where causal-conv1d imports, the benchmark adds the rows with Dao's function and the PyTorch
    fallback forced into the modeling module; each must reach its function (a stand-in for Dao's
    here: cakeconv's PyTorch implementation of its semantics) and start from the same loss."""
    pytest.importorskip("transformers")
    monkeypatch.syspath_prepend(os.path.join(REPO, "benchmarks"))
    import bench_model_swap as bench
    from cakeconv.integrations import dao as cdao

    monkeypatch.setattr(cdao, "dao_causal_conv1d", lambda: (cdao.torch_causal_conv1d_fn, cdao.torch_causal_conv1d_update))
    args = bench.parse_args(["--dry-run", "--out", str(tmp_path)])
    _use_torch_delta_rules(monkeypatch)
    config = bench.model_config(args)
    batch = bench.make_batch(args, torch.device("cpu"))
    subjects = bench.variants(args, config, torch.device("cpu"), torch.float32, batch)
    assert set(subjects) == {"transformers", "cakeconv", "dao", "pytorch"}
    losses = {name: float(step()) for name, (step, _) in subjects.items()}
    assert max(losses.values()) - min(losses.values()) < 1e-4, losses

    never = bench.ConvForced(bench.pytorch_conv, "a function no layer calls")
    with pytest.raises(RuntimeError, match="never called"):
        bench.checked(lambda: torch.zeros(()), never)()
    with pytest.raises(ValueError, match="seq_idx"):
        bench.pytorch_conv(torch.zeros(1, 2, 3), torch.zeros(2, 4), seq_idx=torch.zeros(1, 3, dtype=torch.int32))


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
    over = dict(hidden_size=256, linear_key_head_dim=64, linear_value_head_dim=64, head_dim=64,
                intermediate_size=512, vocab_size=1000)
    plain, model = tiny_pair("cuda", torch.bfloat16, **over)
    assert swap_causal_conv1d(model) == 1
    ids = torch.randint(0, 1000, (2, 512), generator=torch.Generator().manual_seed(2)).cuda()
    compare_step(plain, model, ids, tol=3e-2)
    assert cake_calls, "the swapped layer ran cakeconv"
    times = {"transformers": _step_ms(plain, ids), "cakeconv": _step_ms(model, ids)}
    # greedy tokens in FP32 (bf16 rounding could flip a near-tie of a random model's logits)
    plain32, model32 = plain.float(), model.float()
    prompt = ids[:1, :16]
    with torch.no_grad():
        assert torch.equal(model32.generate(prompt, max_new_tokens=8, do_sample=False),
                           plain32.generate(prompt, max_new_tokens=8, do_sample=False))
    print(f"\nQwen3-Next hidden 256, bf16, 2 x 512 tokens, forward+backward ms: {times} "
          f"(transformers ran {'Dao' if cdao.dao_causal_conv1d() else 'its PyTorch fallback'})")


@pytest.mark.gpu
@pytest.mark.parametrize("family", list(SHORT_CONV_FAMILIES))
def test_short_conv_family_swapped_against_unswapped_gpu(family, cake_calls):
    """The tiny models of ``test_short_conv_family_trains_through_cakeconv`` in bf16 on the Triton
    backend, within bf16 tolerance of transformers' own path (Dao's function at W <= 4 where
    causal-conv1d imports, else its PyTorch fallback)."""
    if SHORT_CONV_FAMILIES[family][3] > 4 and cdao.dao_causal_conv1d() is not None:
        pytest.skip("transformers' own path calls causal-conv1d, whose kernels take W = 2..4 only")
    plain, model, W, n_convs = short_conv_pair(family, "cuda", torch.bfloat16)
    ids = torch.randint(0, 96, (2, 300), generator=torch.Generator().manual_seed(3)).cuda()
    compare_step(plain, model, ids, tol=3e-2)
    assert [(shape[1], activation) for _, shape, activation in cake_calls] == [(W, None)] * n_convs
