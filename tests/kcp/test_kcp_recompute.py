"""RecomputeHandleDetKcp under torch.utils.checkpoint, over gloo (tier 3); checks on EVERY rank.

For the single form (``cake_causal_conv1d_det_kcp``, handle key "conv") and the multi form
(``cake_causal_conv1d_det_multi_kcp``, key "conv_multi"), on a zigzag layout and on an explicit
table of 1- and 2-token fragments (multi-hop halos), each rank runs the conv

    plain (no checkpoint)                                   exchanges: forward 1, backward 1
    checkpoint(use_reentrant=True / False), no handle       exchanges: forward 1, backward 2
    checkpoint(use_reentrant=True / False), with a handle   exchanges: forward 1, backward 1
    nested checkpoints (handle made outside both)           exchanges: forward 1, backward 1 with a
                                                            handle, else 3 (reentrant) / 2 (not)

and asserts those counts, and that y and every gradient are bitwise the plain run's. Exchanges are
counted by wrapping ``start_exchange`` (every rank calls it once per exchange, peers or not); the
exchanges that issue messages (a rank without peers in that direction issues none) are counted too
and must add up the same way (with a handle the backward issues exactly the plain backward's
messages; without, the plain forward's and backward's).

The handle's rules: after the forward it holds exactly its key; a second forward outside a backward
with the filled handle raises RuntimeError (on every rank, before any exchange, so nobody hangs);
``clear()`` makes it reusable.

Shape legend: T global tokens, S local rows, C channels, P ranks.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.distributed as dist
from torch.utils.checkpoint import checkpoint

import cakeconv.cake_causal_conv1d_det_train_backend.kcp.ops as kcp_mod
from cakeconv import RecomputeHandleDetKcp, build_kcp_context, cake_causal_conv1d_det_kcp, cake_causal_conv1d_det_multi_kcp

from tests.helpers import deal_fragments

from ._dist import run_on_ranks
from .test_kcp_plan import random_cu_seqlens

BACKEND = "reference"
CS = (8, 16)  # channels of the multi form's two tensors (the single form uses CS[0])


# --------------------------------------------------------------------------------- counting

COUNTS = {"exchange": 0, "collective": 0}


def _install_counters():
    """Count exchanges and collectives in this rank process (idempotent).

    Every exchange of the KCP ops goes through ``start_exchange`` (kcp/exchange.py), which the ops
    module imported into its own namespace: that name is wrapped. An exchange counts as a
    collective when it issues messages (the rank has peers in that direction).
    """
    if getattr(kcp_mod.start_exchange, "_counted", False):
        return
    real_start = kcp_mod.start_exchange

    def start(send, recv, tables, *args, **kwargs):
        COUNTS["exchange"] += 1
        if tables.sends or tables.recvs:
            COUNTS["collective"] += 1
        return real_start(send, recv, tables, *args, **kwargs)

    start._counted = True
    kcp_mod.start_exchange = start


def _take():
    """The counts since the last call, then reset."""
    out = dict(COUNTS)
    COUNTS["exchange"] = COUNTS["collective"] = 0
    return out


# ----------------------------------------------------------------------------------- inputs

def _contexts(rank, world, seed):
    rng = random.Random(seed)
    T = 6 * 2 * world
    cu_zz = sorted(set(min(c, T) for c in random_cu_seqlens(rng, 8, 9)) | {T})
    cu_fr = random_cu_seqlens(rng, 8, 7)
    cu_fr = cu_fr + [cu_fr[-1] + 5]  # a last document long enough to span fragments of several ranks
    frags = deal_fragments(rng, cu_fr[-1], world, (1, 1, 2))  # spans of 1 or 2 tokens
    assert all(frags)  # every rank gets at least one
    return [
        ("zigzag", build_kcp_context(torch.tensor(cu_zz, dtype=torch.int32), layout="zigzag")),
        ("fragments", build_kcp_context(torch.tensor(cu_fr, dtype=torch.int32), fragments=frags)),
    ]


def _inputs(ctx, seed, width=4):
    """Per tensor i: global x, dy (bf16) and taps [C_i, width] / bias (FP32), same on every rank;
    local shards."""
    g = torch.Generator().manual_seed(seed)
    T = ctx.total_tokens
    out = []
    for C in CS:
        x = torch.randn(T, C, generator=g).to(torch.bfloat16)
        dy = torch.randn(T, C, generator=g).to(torch.bfloat16)
        w = torch.randn(C, width, generator=g) * 0.5
        b = torch.randn(C, generator=g) * 0.5
        out.append((ctx.shard(x), ctx.shard(dy), w, b))
    return out


# ------------------------------------------------------------------------------------- runs

def _conv(form, ctx, handle, activation="silu"):
    """The checkpointed function: args are (x_0, w_0, b_0, x_1, w_1, b_1), outputs a tuple of y."""
    if form == "single":
        def f(x, w, b, *_unused):
            return (cake_causal_conv1d_det_kcp(x, w, ctx, bias=b, activation=activation, recompute_handle=handle,
                                               backend=BACKEND),)
    else:
        def f(x0, w0, b0, x1, w1, b1):
            return tuple(cake_causal_conv1d_det_multi_kcp([x0, x1], [w0, w1], ctx, biases=[b0, b1],
                                                          activation=activation, recompute_handle=handle,
                                                          backend=BACKEND))
    return f


def _wrap(f, mode):
    """mode: None (plain), True / False (checkpoint use_reentrant), ("nested", r) (checkpoint in checkpoint)."""
    if mode is None:
        return f
    if isinstance(mode, tuple):
        reentrant = mode[1]

        def outer(*args):
            ys = checkpoint(f, *args, use_reentrant=reentrant)
            return tuple(y * 2 for y in ys)  # exact, so the bits stay comparable

        return lambda *args: checkpoint(outer, *args, use_reentrant=reentrant)
    return lambda *args: checkpoint(f, *args, use_reentrant=mode)


def _run(form, ctx, data, mode, handle, activation="silu"):
    """Forward + backward; returns (outputs and grads, forward counts, backward counts)."""
    leaves = []
    for x, _, w, b in data:
        leaves += [x.clone().requires_grad_(True), w.clone().requires_grad_(True), b.clone().requires_grad_(True)]
    fn = _wrap(_conv(form, ctx, handle, activation), mode)
    _take()
    ys = fn(*leaves)
    fwd = _take()
    if form == "single":
        ys, dys, used = ys[:1], [data[0][1]], leaves[:3]
    else:
        dys, used = [d[1] for d in data], leaves
    if isinstance(mode, tuple):
        ys = [y / 2 for y in ys]  # undoes the outer y * 2 exactly: y and dy as in the plain run
    torch.autograd.backward(list(ys), dys)
    bwd = _take()
    outs = [y.detach() for y in ys] + [t.grad for t in used]
    assert all(t is not None for t in outs)
    return outs, fwd, bwd


def _case(rank, world, name, ctx, form, seed, width=4, activation="silu", modes=None):
    """The table of the module docstring for one context and form (conv width ``width``; ``modes``:
    the checkpoint modes, default all four); the stored histories are [D, width - 1, C_i]."""
    key = "conv" if form == "single" else "conv_multi"
    where = f"rank {rank}/{world} {name} {form} W={width} activation={activation}"
    data = _inputs(ctx, seed, width)
    plain, fwd0, bwd0 = _run(form, ctx, data, None, None, activation)
    assert fwd0["exchange"] == 1 and bwd0["exchange"] == 1, (where, fwd0, bwd0)
    for mode in modes or (True, False, ("nested", True), ("nested", False)):
        for use_handle in (False, True):
            what = f"{where} checkpoint={mode} handle={use_handle}"
            handle = RecomputeHandleDetKcp() if use_handle else None
            outs, fwd, bwd = _run(form, ctx, data, mode, handle, activation)
            assert fwd == fwd0, (what, "forward counts", fwd, fwd0)
            if use_handle:
                assert set(handle.entries) == {key}, (what, handle)
                hists = handle.entries[key]
                assert [tuple(h.shape) for h in hists] == [(ctx.num_segments, width - 1, C)
                                                           for C in (CS[:1] if form == "single" else CS)], what
                # the recompute exchanged nothing: only the backward's own (future) exchange
                assert bwd == bwd0, (what, "backward counts", bwd, bwd0)
            else:
                # the recompute's forward exchange(s) + the backward's exchange; a reentrant
                # checkpoint in a reentrant checkpoint recomputes the conv twice (outer and inner)
                recomputes = 2 if mode == ("nested", True) else 1
                assert bwd["exchange"] == recomputes + 1, (what, bwd)
                assert bwd["collective"] == recomputes * fwd0["collective"] + bwd0["collective"], (what, bwd, fwd0, bwd0)
            for i, (a, b) in enumerate(zip(outs, plain)):
                assert a.dtype == b.dtype and torch.equal(a, b), (what, f"output/grad {i} differs from the plain run")
    return True


def _handle_rules(rank, world, name, ctx, form, seed):
    """A filled handle raises on a second forward outside a backward; clear() makes it reusable."""
    key = "conv" if form == "single" else "conv_multi"
    data = _inputs(ctx, seed)
    handle = RecomputeHandleDetKcp()
    plain, _, _ = _run(form, ctx, data, None, None)
    leaves = []
    for x, _, w, b in data:
        leaves += [x.clone().requires_grad_(True), w.clone().requires_grad_(True), b.clone().requires_grad_(True)]
    fn = _conv(form, ctx, handle)
    _take()
    ys = checkpoint(fn, *leaves, use_reentrant=False)
    assert _take()["exchange"] == 1 and set(handle.entries) == {key}
    # every rank passes the filled handle: every rank raises, before any exchange
    with pytest.raises(RuntimeError, match=key):
        fn(*[t.detach() for t in leaves])
    with pytest.raises(RuntimeError, match=key):
        with torch.no_grad():
            checkpoint(fn, *leaves, use_reentrant=True)
    assert _take()["exchange"] == 0
    # the first step's backward is unharmed
    n = 1 if form == "single" else 2
    torch.autograd.backward(list(ys[:n]), [d[1] for d in data[:n]])
    assert _take()["exchange"] == 1
    got = [y.detach() for y in ys[:n]] + [t.grad for t in (leaves[:3] if form == "single" else leaves)]
    assert all(torch.equal(a, b) for a, b in zip(got, plain)), f"rank {rank}: {name} {form} after the refused forward"
    # the handle still holds the entry after the backward: the next step must clear() it
    with pytest.raises(RuntimeError, match="clear"):
        fn(*[t.detach() for t in leaves])
    handle.clear()
    assert handle.entries == {}
    outs, fwd, bwd = _run(form, ctx, data, True, handle)
    assert fwd["exchange"] == 1 and bwd["exchange"] == 1 and set(handle.entries) == {key}
    assert all(torch.equal(a, b) for a, b in zip(outs, plain)), f"rank {rank}: {name} {form} after clear()"
    return True


def _all(rank, world, seed):
    _install_counters()
    n = 0
    for name, ctx in _contexts(rank, world, seed):
        assert ctx.num_local_tokens > 0
        for form in ("single", "multi"):
            n += _case(rank, world, name, ctx, form, seed + 7)
            n += _handle_rules(rank, world, name, ctx, form, seed + 8)
    return n


@pytest.mark.dist
@pytest.mark.parametrize("world", [2, 4])
def test_recompute_handle_on_every_rank(world):
    done = run_on_ranks(_all, world, 300 + world, timeout_s=240)
    assert done == [8] * world
