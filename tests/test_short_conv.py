"""CakeShortConv (tier 1 on the CPU, plus one 2-rank gloo run for the KCP path).

What is checked:
- initialisation: shapes, the Conv1d bound 1/sqrt(4) = 0.5, uniform statistics, and bitwise the
  values of n Conv1d modules drawn under the same seed;
- the forward (single and several tensors) is bitwise the functional op, outputs and gradients;
- Conv1d compatibility: ``[C, 1, 4]`` state dicts load (also nested in a parent layer, as when a
  flash-linear-attention ShortConvolution is swapped out), from_conv1d / to_conv1d round trip, and
  the outputs and gradients equal ``act(conv1d(pad(x, (W - 1, 0))))`` per document, for several
  widths W and act SiLU or none (FP32 tolerance: torch's conv1d sums the W taps in its own order);
- KCP on 2 gloo ranks: every rank's outputs and dx bitwise the single-rank module call on its
  tokens, with and without activation checkpointing and a recompute handle.

Shape legend: S packed tokens, C channels, B batch rows, T tokens per row, N documents.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from cakeconv import RecomputeHandleDetKcp, build_kcp_context, cake_causal_conv1d_det
from cakeconv.short_conv import CakeShortConv
from tests.helpers import random_cu_seqlens
from tests.kcp._dist import run_on_ranks

QKV_CHANNELS = (8, 16, 24)  # three tensors with their own C, as q, k, v of a layer


def _grads(module):
    return [None if p.grad is None else p.grad.clone() for p in module.parameters()]


# --------------------------------------------------------------------------- construction / init


def test_init_matches_conv1d_bitwise_and_bounds():
    torch.manual_seed(123)
    module = CakeShortConv(list(QKV_CHANNELS), bias=True)
    torch.manual_seed(123)
    convs = [nn.Conv1d(C, C, 4, groups=C) for C in QKV_CHANNELS]
    for i, (C, conv) in enumerate(zip(QKV_CHANNELS, convs)):
        assert module.weights[i].shape == (C, 4) and module.biases[i].shape == (C,)
        assert module.weights[i].dtype == torch.float32
        assert torch.equal(module.weights[i], conv.weight.view(C, 4))
        assert torch.equal(module.biases[i], conv.bias)

    torch.manual_seed(7)
    single = CakeShortConv(16)
    torch.manual_seed(7)
    conv = nn.Conv1d(16, 16, 4, groups=16, bias=False)
    assert single.bias is None and torch.equal(single.weight, conv.weight.view(16, 4))


def test_init_statistics():
    # U(-0.5, 0.5): mean 0, std 0.5 / sqrt(3); 4096 * 4 draws put the sample std within ~1%.
    torch.manual_seed(0)
    module = CakeShortConv(4096, bias=True)
    w, b = module.weight.detach(), module.bias.detach()
    assert w.abs().max().item() <= 0.5 and b.abs().max().item() <= 0.5
    assert w.abs().max().item() > 0.49  # the bound is reached, not a narrower one
    assert abs(w.mean().item()) < 0.01
    assert abs(w.std().item() - 0.5 / 3**0.5) < 0.005
    assert abs(b.std().item() - 0.5 / 3**0.5) < 0.015


def test_extra_repr():
    assert repr(CakeShortConv(16)) == (
        "CakeShortConv(channels=16, bias=False, kernel_size=4, activation=silu, dtype=torch.float32)")
    multi = CakeShortConv([8, 16], bias=True, dtype=torch.bfloat16)
    assert multi.extra_repr() == "channels=(8, 16), bias=True, kernel_size=4, activation=silu, dtype=torch.bfloat16"


def test_bad_arguments():
    with pytest.raises(ValueError, match="kernel_size must be an int from 2 to 8, got kernel_size=9"):
        CakeShortConv(16, kernel_size=9)
    with pytest.raises(ValueError, match="'relu'"):
        CakeShortConv(16, activation="relu")
    with pytest.raises(ValueError, match="multiple of 8, got 12"):
        CakeShortConv([16, 12])
    with pytest.raises(ValueError, match="at least one"):
        CakeShortConv([])
    with pytest.raises(TypeError, match="float16"):
        CakeShortConv(16, dtype=torch.float16)

    single, multi = CakeShortConv(16), CakeShortConv([8, 16])
    x = torch.randn(5, 16)
    with pytest.raises(ValueError, match="forward takes a tensor, got list"):
        single([x])
    with pytest.raises(ValueError, match="list of 2 tensors, got Tensor"):
        multi(x)
    with pytest.raises(ValueError, match="has 2 tensors"):
        multi([x])
    with pytest.raises(ValueError, match="KCP path only"):
        single(x, recompute_handle=RecomputeHandleDetKcp())
    ctx = build_kcp_context(torch.tensor([0, 5]))  # no process group: a 1-rank context
    with pytest.raises(ValueError, match="not both"):
        single(x, cu_seqlens=torch.tensor([0, 5]), kcp_context=ctx)
    with pytest.raises(ValueError, match=r"weight must be \[16, 1, 4\] or \[16, 4\], got \(16, 1, 3\)"):
        single.load_conv1d_state_dict({"weight": torch.zeros(16, 1, 3)})
    with pytest.raises(ValueError, match="has bias but"):
        single.load_conv1d_state_dict({"weight": torch.zeros(16, 1, 4), "bias": torch.zeros(16)})
    with pytest.raises(ValueError, match="got 1 Conv1d state dicts"):
        multi.load_conv1d_state_dict({"weight": torch.zeros(8, 1, 4)})
    with pytest.raises(ValueError, match="depthwise Conv1d of width 2..8"):
        CakeShortConv.from_conv1d(nn.Conv1d(16, 16, 9, groups=16))
    with pytest.raises(ValueError, match=r"same kernel_size, got \[3, 4\]"):
        CakeShortConv.from_conv1d([nn.Conv1d(8, 8, 3, groups=8), nn.Conv1d(8, 8, 4, groups=8)])


# ----------------------------------------------------------------------- forward vs the op


# Grid rationale: bf16 activations (the training dtype) with and without bias, packed [S, C] with
# empty and 1-3 token documents, [1, S, C] and [B, T, C]; S = 37 is odd (tail handling).
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape_kind", ["packed", "packed_1SC", "batched"])
def test_forward_single_bitwise_vs_functional(bias, shape_kind):
    torch.manual_seed(1)
    module = CakeShortConv(16, bias=bias)
    gen = torch.Generator().manual_seed(2)
    cu = None
    if shape_kind == "batched":
        x = torch.randn(3, 11, 16, generator=gen).to(torch.bfloat16)
    else:
        x = torch.randn(37, 16, generator=gen).to(torch.bfloat16)
        cu = random_cu_seqlens(37, gen)
        if shape_kind == "packed_1SC":
            x = x[None]
    dy = torch.randn(x.shape, generator=gen).to(torch.bfloat16)

    x_mod = x.clone().requires_grad_(True)
    y_mod = module(x_mod, cu_seqlens=cu)
    y_mod.backward(dy)

    x_fn = x.clone().requires_grad_(True)
    w_fn = module.weight.detach().clone().requires_grad_(True)
    b_fn = module.bias.detach().clone().requires_grad_(True) if bias else None
    y_fn = cake_causal_conv1d_det(x_fn, w_fn, b_fn, cu_seqlens=cu)
    y_fn.backward(dy)

    assert y_mod.shape == x.shape and y_mod.dtype == x.dtype
    assert torch.equal(y_mod, y_fn)
    assert torch.equal(x_mod.grad, x_fn.grad)
    assert torch.equal(module.weight.grad, w_fn.grad)
    if bias:
        assert torch.equal(module.bias.grad, b_fn.grad)


def test_forward_multi_bitwise_vs_functional():
    torch.manual_seed(3)
    module = CakeShortConv(list(QKV_CHANNELS), bias=True)
    gen = torch.Generator().manual_seed(4)
    cu = random_cu_seqlens(29, gen)
    xs = [torch.randn(29, C, generator=gen).to(torch.bfloat16).requires_grad_(True) for C in QKV_CHANNELS]
    dys = [torch.randn(29, C, generator=gen).to(torch.bfloat16) for C in QKV_CHANNELS]
    ys = module(xs, cu_seqlens=cu)
    assert isinstance(ys, tuple) and len(ys) == 3
    torch.autograd.backward(ys, dys)
    for i, C in enumerate(QKV_CHANNELS):
        x = xs[i].detach().clone().requires_grad_(True)
        w = module.weights[i].detach().clone().requires_grad_(True)
        b = module.biases[i].detach().clone().requires_grad_(True)
        y = cake_causal_conv1d_det(x, w, b, cu_seqlens=cu)
        y.backward(dys[i])
        assert torch.equal(ys[i], y), f"tensor {i}: y"
        assert torch.equal(xs[i].grad, x.grad), f"tensor {i}: dx"
        assert torch.equal(module.weights[i].grad, w.grad), f"tensor {i}: dweight"
        assert torch.equal(module.biases[i].grad, b.grad), f"tensor {i}: dbias"


def test_one_rank_kcp_context_bitwise_vs_single_rank():
    """Without a process group, build_kcp_context gives a 1-rank context; the KCP path must agree."""
    torch.manual_seed(5)
    module = CakeShortConv(list(QKV_CHANNELS), bias=True)
    gen = torch.Generator().manual_seed(6)
    cu = random_cu_seqlens(24, gen)
    xs = [torch.randn(24, C, generator=gen) for C in QKV_CHANNELS]
    ys_single = module(xs, cu_seqlens=cu)
    ys_kcp = module(xs, kcp_context=build_kcp_context(cu))
    for y_s, y_k in zip(ys_single, ys_kcp):
        assert torch.equal(y_s, y_k)


# ------------------------------------------------------------------------- Conv1d compatibility


class ShortConvolutionLike(nn.Conv1d):
    """Stand-in for flash-linear-attention's ShortConvolution: an nn.Conv1d with weight [C, 1, W]."""

    def __init__(self, hidden_size, kernel_size=4, bias=False):
        super().__init__(hidden_size, hidden_size, kernel_size, groups=hidden_size, padding=kernel_size - 1, bias=bias)


class FlaLayer(nn.Module):
    def __init__(self, convs):
        super().__init__()
        self.q_conv1d, self.k_conv1d, self.v_conv1d = convs


def _act(y, activation):
    return F.silu(y) if activation == "silu" else y


def _conv1d_reference(x_SC, conv_weight, conv_bias, cu, activation):
    """Per document: act(conv1d(pad(x, (W - 1, 0)))) with torch's conv1d (depthwise, [C, 1, W] taps)."""
    C, W = x_SC.shape[1], conv_weight.shape[-1]
    outs = []
    for d in range(len(cu) - 1):
        x_1CT = x_SC[cu[d]:cu[d + 1]].t()[None]
        outs.append(_act(F.conv1d(F.pad(x_1CT, (W - 1, 0)), conv_weight, conv_bias, groups=C), activation)[0].t())
    return torch.cat(outs, 0)


def test_conv1d_state_dict_round_trip():
    torch.manual_seed(8)
    convs = [ShortConvolutionLike(C, bias=True) for C in QKV_CHANNELS]

    # single form: a Conv1d state dict loads as is ([C, 1, 4] weight)
    single = CakeShortConv(16, bias=True)
    single.load_state_dict(convs[1].state_dict())
    assert torch.equal(single.weight, convs[1].weight.view(16, 4)) and torch.equal(single.bias, convs[1].bias)

    # a parent layer whose ShortConvolution was swapped for a CakeShortConv loads the old checkpoint
    old_layer = FlaLayer(convs)
    new_layer = FlaLayer([CakeShortConv(C, bias=True) for C in QKV_CHANNELS])
    new_layer.load_state_dict(old_layer.state_dict())
    assert torch.equal(new_layer.v_conv1d.weight, convs[2].weight.view(24, 4))

    # several form: weights.i keys accept [C, 1, 4] too; load_conv1d_state_dict / from_conv1d agree
    multi = CakeShortConv(list(QKV_CHANNELS), bias=True)
    state = {f"weights.{i}": c.weight.detach() for i, c in enumerate(convs)}
    state.update({f"biases.{i}": c.bias.detach() for i, c in enumerate(convs)})
    multi.load_state_dict(state)
    from_convs = CakeShortConv.from_conv1d(convs)
    loaded = CakeShortConv(list(QKV_CHANNELS), bias=True)
    loaded.load_conv1d_state_dict([c.state_dict() for c in convs])
    for i, conv in enumerate(convs):
        for m in (multi, from_convs, loaded):
            assert torch.equal(m.weights[i], conv.weight.view(-1, 4)) and torch.equal(m.biases[i], conv.bias)

    # export: to_conv1d gives the original modules' tensors back, and loads into a ShortConvolution
    exported = from_convs.to_conv1d()
    for conv, back in zip(convs, exported):
        assert isinstance(back, nn.Conv1d) and back.padding == (3,)
        assert torch.equal(back.weight, conv.weight) and torch.equal(back.bias, conv.bias)
        fresh = ShortConvolutionLike(conv.in_channels, bias=True)
        fresh.load_state_dict(back.state_dict())
        assert torch.equal(fresh.weight, conv.weight)
    assert isinstance(CakeShortConv(16).to_conv1d(), nn.Conv1d)


# Grid rationale: FP32 so the only difference to torch's conv1d is the order of the W-tap sum; the
# seed's width 4 + SiLU, and widths 3 and 7 without activation and 2 with SiLU (SPEC 1b).
@pytest.mark.parametrize("W,activation", [(4, "silu"), (3, None), (7, None), (2, "silu")],
                         ids=["W4_silu", "W3_None", "W7_None", "W2_silu"])
@pytest.mark.parametrize("bias", [False, True])
def test_loaded_conv1d_matches_torch_conv1d_per_document(bias, W, activation):
    torch.manual_seed(9)
    conv = ShortConvolutionLike(16, kernel_size=W, bias=bias)
    module = CakeShortConv.from_conv1d(conv, activation=activation)
    assert module.kernel_size == W and module.activation == activation
    gen = torch.Generator().manual_seed(10)
    cu = random_cu_seqlens(41, gen)
    x = torch.randn(41, 16, generator=gen)
    dy = torch.randn(41, 16, generator=gen)

    x_mod = x.clone().requires_grad_(True)
    y_mod = module(x_mod, cu_seqlens=cu)
    y_mod.backward(dy)

    x_ref = x.clone().requires_grad_(True)
    y_ref = _conv1d_reference(x_ref, conv.weight, conv.bias, cu.tolist(), activation)
    y_ref.backward(dy)

    torch.testing.assert_close(y_mod, y_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(x_mod.grad, x_ref.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(module.weight.grad, conv.weight.grad.view(16, W), rtol=1e-5, atol=1e-5)
    if bias:
        torch.testing.assert_close(module.bias.grad, conv.bias.grad, rtol=1e-5, atol=1e-5)

    # The exported Conv1d (padding=W - 1), as FLA/Mamba call it on one document: act(conv(x)[..., :T]).
    exported = module.to_conv1d()
    first = int(torch.argmax((cu[1:] - cu[:-1]).to(torch.int64)))
    start, stop = int(cu[first]), int(cu[first + 1])
    with torch.no_grad():
        y_conv = _act(exported(x[start:stop].t()[None])[..., :stop - start], activation)[0].t()
    torch.testing.assert_close(y_mod.detach()[start:stop], y_conv, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------ KCP, 2 ranks


def _kcp_module_checks(rank, world, seed):
    """Every rank: the several-tensor module on its shard == the single-rank module on its tokens."""
    results = {}
    for layout, lengths in (("zigzag", [5, 0, 1, 14, 2, 10]), ("zigzag_per_document", [8, 4, 0, 12])):
        cu_list = [0]
        for n in lengths:
            cu_list.append(cu_list[-1] + n)
        cu = torch.tensor(cu_list, dtype=torch.int32)
        T = cu_list[-1]
        gen = torch.Generator().manual_seed(seed)
        xs = [torch.randn(T, C, generator=gen).to(torch.bfloat16) for C in QKV_CHANNELS]
        dys = [torch.randn(T, C, generator=gen).to(torch.bfloat16) for C in QKV_CHANNELS]
        torch.manual_seed(seed)
        module = CakeShortConv(list(QKV_CHANNELS), bias=True)

        # the single-rank module call on the whole batch (every rank computes it)
        xs_single = [x.clone().requires_grad_(True) for x in xs]
        ys_single = module(xs_single, cu_seqlens=cu)
        torch.autograd.backward(ys_single, dys)
        grads_single = _grads(module)
        module.zero_grad(set_to_none=True)

        ctx = build_kcp_context(cu, layout=layout)
        idx = ctx.local_token_indices
        runs = {}
        for mode in ("plain", "checkpoint+handle"):
            xs_local = [ctx.shard(x).requires_grad_(True) for x in xs]
            if mode == "plain":
                ys = module(xs_local, kcp_context=ctx)
            else:
                handle = RecomputeHandleDetKcp()
                ys = checkpoint(lambda *a: module(list(a[:-1]), kcp_context=ctx, recompute_handle=a[-1]),
                                *xs_local, handle, use_reentrant=False)
                assert "conv_multi" in handle.entries, f"rank {rank}: the handle stored no history rows"
            torch.autograd.backward(ys, [ctx.shard(dy) for dy in dys])
            for i in range(len(QKV_CHANNELS)):
                assert torch.equal(ys[i], ys_single[i].detach()[idx]), f"rank {rank} {layout} {mode}: y[{i}]"
                assert torch.equal(xs_local[i].grad, xs_single[i].grad[idx]), f"rank {rank} {layout} {mode}: dx[{i}]"
            runs[mode] = _grads(module)
            module.zero_grad(set_to_none=True)

        # checkpointing with a handle changes no bit of the partial parameter gradients
        for g_plain, g_ckpt in zip(runs["plain"], runs["checkpoint+handle"]):
            assert torch.equal(g_plain, g_ckpt), f"rank {rank} {layout}: checkpointed parameter gradient"
        # the all-reduced partial sums are the single-rank gradients up to FP32 reordering
        for g_part, g_single in zip(runs["plain"], grads_single):
            dist.all_reduce(g_part)
            scale = max(1.0, g_single.abs().max().item())
            assert (g_part - g_single).abs().max().item() <= 1e-5 * scale, f"rank {rank} {layout}: parameter gradient"
        results[layout] = int(idx.numel())
    return results


@pytest.mark.dist
def test_kcp_two_ranks_bitwise_on_every_rank():
    results = run_on_ranks(_kcp_module_checks, 2, 11, timeout_s=120)
    assert [sum(r.values()) for r in results] == [16 + 12, 16 + 12]
