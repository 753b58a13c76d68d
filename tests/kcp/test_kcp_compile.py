"""KCP ops under torch.compile(fullgraph=True), over gloo (tier 3); checks on EVERY rank.

``cake_causal_conv1d_det_kcp`` and ``cake_causal_conv1d_det_multi_kcp`` apply the KCP autograd
Functions, which, while compiling, call the torch custom ops
``torch.ops.cakeconv.cake_causal_conv1d_det_kcp_forward`` / ``..._backward``; the KcpContext and the
RecomputeHandleDetKcp reach them as their process-local ``op_id`` ints (kcp/ops.py). On 1 and 2 ranks, for a zigzag layout and an explicit table of 1- and 2-token
fragments (multi-hop halos), each rank compiles (Inductor) two small models,

    single: Linear -> bf16 -> KCP conv (taps, bias)                    -> y,  loss(y)
    multi:  Linear -> bf16 -> split in 3 (C = 8, 16, 8) -> multi conv  -> ys, sum of losses
            (the middle tensor without a bias)

and checks that y and every gradient are bitwise eager's, on new data and on a second context
(a new ``op_id``, S_local and D: one recompile, then dynamic ints), with exactly one exchange in
the forward and one in the backward (no graph break, no eager fallback: ``torch._dynamo.explain``
counts 0 breaks, and the compile counter stays under the recompile limit). With a recompute
handle: the compiled model with a non-reentrant ``torch.utils.checkpoint`` inside (the compiled
backward recomputes the op: without a handle it exchanges again, with one it reads the stored rows
and exchanges nothing; bitwise the plain run either way), and eager checkpoints (non-reentrant
and reentrant) around a compiled function; a compiled forward that finds a filled handle outside
a backward raises; ``clear()`` makes it reusable. Under TRITON_INTERPRET=1 (marked interpret):
the same on the Triton backend, 2 ranks, one model.

In this process (no process group, 1-rank context): ``torch.library.opcheck`` of both ops (on inputs
without gradients: the ops carry no autograd formula of their own, the Functions do), the id
registry, the autograd Functions compiled (same bits as the ops), and bad input raising the eager
error when the compiled graph runs.

The Linears have no bias: Inductor sums a Linear's bias gradient in its own order (torch's matter,
not the op's; see tests/test_compile.py). Exchanges and collectives are counted as in
test_kcp_recompute.py.

Shape legend: T global tokens, S local rows, C channels, P ranks, D local segments.
"""

from __future__ import annotations

import gc
import os

import pytest
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounterWithBackend
from torch.utils.checkpoint import checkpoint

from cakeconv import (
    RecomputeHandleDetKcp,
    build_kcp_context,
    cake_causal_conv1d_det_kcp,
    cake_causal_conv1d_det_multi_kcp,
)
from cakeconv.cake_causal_conv1d_det_train_backend.kcp.ops import (
    HANDLES,
    NO_HANDLE,
    CakeCausalConv1dDetFunctionKcp,
    CakeCausalConv1dDetMultiFunctionKcp,
)
from cakeconv.cake_causal_conv1d_det_train_backend.kcp.context import CONTEXTS

from ._dist import run_on_ranks
from .test_kcp_recompute import _contexts, _install_counters, _take

FWD = torch.ops.cakeconv.cake_causal_conv1d_det_kcp_forward
BWD = torch.ops.cakeconv.cake_causal_conv1d_det_kcp_backward

C_IN = 16
CS = (8, 16, 8)  # the multi model's three tensors


class _Single(torch.nn.Module):
    """Linear (fp32, no bias) -> bf16 -> KCP conv + SiLU -> y and a loss that depends on y."""

    def __init__(self, backend="reference"):
        super().__init__()
        g = torch.Generator().manual_seed(11)
        self.lin = torch.nn.Linear(C_IN, C_IN, bias=False)
        with torch.no_grad():
            self.lin.weight.copy_(torch.randn(C_IN, C_IN, generator=g) * 0.3)
        self.w = torch.nn.Parameter(torch.randn(C_IN, 4, generator=g) * 0.5)
        self.b = torch.nn.Parameter(torch.randn(C_IN, generator=g) * 0.5)
        self.backend = backend

    def conv(self, h, ctx, handle):
        return cake_causal_conv1d_det_kcp(h, self.w, ctx, bias=self.b, recompute_handle=handle, backend=self.backend)

    def forward(self, x, ctx, handle=None, ckpt=False):
        h = self.lin(x).to(torch.bfloat16)
        if ckpt:
            y = checkpoint(self.conv, h, ctx, handle, use_reentrant=False)
        else:
            y = self.conv(h, ctx, handle)
        return (y,), (y.float() * y.float()).sum()


class _Multi(torch.nn.Module):
    """Linear (fp32, no bias) -> bf16 -> 3 channel slices -> ONE multi KCP call -> sum of losses."""

    def __init__(self, backend="reference"):
        super().__init__()
        g = torch.Generator().manual_seed(12)
        self.lin = torch.nn.Linear(C_IN, sum(CS), bias=False)
        with torch.no_grad():
            self.lin.weight.copy_(torch.randn(sum(CS), C_IN, generator=g) * 0.3)
        self.ws = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(c, 4, generator=g) * 0.5) for c in CS])
        self.b0 = torch.nn.Parameter(torch.randn(CS[0], generator=g) * 0.5)
        self.b2 = torch.nn.Parameter(torch.randn(CS[2], generator=g) * 0.5)
        self.backend = backend

    def conv(self, h, ctx, handle):
        xs = torch.split(h, list(CS), dim=1)
        return cake_causal_conv1d_det_multi_kcp(list(xs), list(self.ws), ctx, biases=[self.b0, None, self.b2],
                                                recompute_handle=handle, backend=self.backend)

    def forward(self, x, ctx, handle=None, ckpt=False):
        h = self.lin(x).to(torch.bfloat16)
        if ckpt:
            ys = checkpoint(self.conv, h, ctx, handle, use_reentrant=False)
        else:
            ys = self.conv(h, ctx, handle)
        loss = sum((y.float() * y.float()).sum() for y in ys)
        return tuple(ys), loss


def _run(model, fn, x, ctx, handle=None, ckpt=False):
    """Forward + backward; (outputs and every gradient, cloned), forward counts, backward counts."""
    model.zero_grad(set_to_none=True)
    xg = x.clone().requires_grad_(True)
    _take()
    ys, loss = fn(xg, ctx, handle, ckpt)
    fwd = _take()
    loss.backward()
    bwd = _take()
    out = {f"y{i}": y.detach().clone() for i, y in enumerate(ys)}
    out["dx"] = xg.grad.clone()
    for name, p in model.named_parameters():
        assert p.grad is not None, f"{name} has no gradient"
        out[f"d{name}"] = p.grad.clone()
    return out, fwd, bwd


def _assert_bitwise(got, want, what):
    assert got.keys() == want.keys(), what
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, f"{what}: {k}"
        assert torch.equal(got[k], want[k]), f"{what}: {k} differs from eager"


def _x(ctx, seed):
    g = torch.Generator().manual_seed(seed)
    return ctx.shard(torch.randn(ctx.total_tokens, C_IN, generator=g))


def _ops_in(graph_module):
    """call_function targets of a graph and of its subgraphs (the autograd Function's HOP)."""
    return [n.target for m in graph_module.modules() for n in m.graph.nodes if n.op == "call_function"]


# ------------------------------------------------------------------------------- on every rank

def _compiled_bitwise(rank, world, contexts, seed):
    """Both models compiled: bits, exchange counts, no break, no fallback; explain; Function == op."""
    for make in (_Single, _Multi):
        torch._dynamo.reset()
        model = make()
        counter = CompileCounterWithBackend("inductor")
        compiled = torch.compile(model, fullgraph=True, backend=counter)
        for name, ctx in contexts:  # the second context: new op_id, S_local and D
            for step in range(2):
                what = f"rank {rank}/{world} {make.__name__} {name} step {step}"
                x = _x(ctx, seed + 17 * step)
                want, fwd0, bwd0 = _run(model, model, x, ctx)
                got, fwd, bwd = _run(model, compiled, x, ctx)
                _assert_bitwise(got, want, what)
                assert fwd["exchange"] == 1 and bwd["exchange"] == 1, (what, fwd, bwd)
                assert fwd == fwd0 and bwd == bwd0, (what, fwd, bwd, fwd0, bwd0)
        assert 1 <= counter.frame_count < torch._dynamo.config.recompile_limit, counter.frame_count

        name, ctx = contexts[0]
        ex = torch._dynamo.explain(model)(_x(ctx, seed), ctx)
        assert ex.graph_break_count == 0 and ex.graph_count == 1, (rank, make.__name__, ex)
        assert any(t in (FWD, FWD.default) for t in _ops_in(ex.graphs[0])), _ops_in(ex.graphs[0])

    # The autograd Function runs the same op and helpers: the same bits as the public function.
    name, ctx = contexts[1]
    x = _x(ctx, seed).to(torch.bfloat16)
    model = _Single()
    outs = []
    for use_function in (False, True):
        xg, wg, bg = (t.detach().clone().requires_grad_(True) for t in (x, model.w, model.b))
        if use_function:
            y = CakeCausalConv1dDetFunctionKcp.apply(xg, wg, bg, ctx, "reference", None)
        else:
            y = cake_causal_conv1d_det_kcp(xg, wg, ctx, bias=bg, backend="reference")
        (y.float() * y.float()).sum().backward()
        outs.append([y.detach(), xg.grad, wg.grad, bg.grad])
    assert all(torch.equal(a, b) for a, b in zip(*outs)), f"rank {rank}: Function vs op"


def _compiled_checkpoint_with_handle(rank, world, contexts, seed):
    """Recompute handle with compiled code: checkpoint inside the compiled model, and around it."""
    for make in (_Single, _Multi):
        key = "conv" if make is _Single else "conv_multi"
        torch._dynamo.reset()
        model = make()
        # Inductor (min-cut partitioner) for one model, aot_eager for the other (test time)
        counter = CompileCounterWithBackend("inductor" if make is _Single else "aot_eager")
        compiled = torch.compile(model, fullgraph=True, backend=counter)
        for name, ctx in contexts:
            what = f"rank {rank}/{world} {make.__name__} {name}"
            x = _x(ctx, seed)
            plain, fwd0, bwd0 = _run(model, model, x, ctx)
            # 1. non-reentrant checkpoint INSIDE the compiled graph. The compiled backward
            #    recomputes the checkpointed op: without a handle it exchanges again, with one it
            #    reads the stored rows. Either way the bits are the plain run's.
            got, fwd, bwd = _run(model, compiled, x, ctx, None, True)
            _assert_bitwise(got, plain, f"{what} compiled checkpoint, no handle")
            assert fwd == fwd0 and bwd["exchange"] == 2, (what, fwd, bwd)
            for step in range(2):  # a new handle each micro-step (a new op_id each time)
                handle = RecomputeHandleDetKcp()
                got, fwd, bwd = _run(model, compiled, x, ctx, handle, True)
                _assert_bitwise(got, plain, f"{what} compiled checkpoint + handle, step {step}")
                assert set(handle.entries) == {key}, (what, handle)
                assert [tuple(h.shape) for h in handle.entries[key]] == [
                    (ctx.num_segments, 3, c) for c in ((C_IN,) if make is _Single else CS)], what
                assert fwd == fwd0 and bwd == bwd0, (what, "the recompute exchanged", fwd, bwd, bwd0)
            # 2. eager checkpoints AROUND a compiled function (non-reentrant and reentrant).
            compiled_conv = torch.compile(model.conv, fullgraph=True, backend="aot_eager")
            for reentrant in (False, True):
                handle = RecomputeHandleDetKcp()

                def outer(x_, ctx_, handle_, ckpt_, lin=model.lin, conv=compiled_conv, reentrant=reentrant):
                    h = lin(x_).to(torch.bfloat16)
                    ys = checkpoint(conv, h, ctx_, handle_, use_reentrant=reentrant)
                    ys = ys if isinstance(ys, tuple) else (ys,)
                    return ys, sum((y.float() * y.float()).sum() for y in ys)

                got, fwd, bwd = _run(model, outer, x, ctx, handle)
                _assert_bitwise(got, plain, f"{what} checkpoint(reentrant={reentrant}) of a compiled fn + handle")
                assert fwd == fwd0 and bwd == bwd0 and set(handle.entries) == {key}, (what, reentrant, fwd, bwd)
            # 3. a compiled forward that finds the filled handle outside a backward raises (on
            #    every rank, before any exchange); clear() makes it reusable.
            with pytest.raises(RuntimeError, match=key):
                compiled(x, ctx, handle, True)
            assert _take()["exchange"] == 0, what
            handle.clear()
            got, fwd, bwd = _run(model, compiled, x, ctx, handle, True)
            _assert_bitwise(got, plain, f"{what} after clear()")
            assert fwd == fwd0 and bwd == bwd0, what
        # every compiled call above ran compiled (no silent eager fallback at the recompile limit)
        assert 1 <= counter.frame_count < torch._dynamo.config.recompile_limit, counter.frame_count
    return counter.frame_count


def _all(rank, world, seed):
    _install_counters()
    contexts = _contexts(rank, world, seed)
    _compiled_bitwise(rank, world, contexts, seed)
    _compiled_checkpoint_with_handle(rank, world, contexts, seed + 1)
    return True


@pytest.mark.dist
@pytest.mark.parametrize("world", [1, 2])
def test_kcp_compile_bitwise_on_every_rank(world):
    assert run_on_ranks(_all, world, 500 + world, timeout_s=300) == [True] * world


def _interp(rank, world, seed):
    assert os.environ.get("TRITON_INTERPRET") == "1"
    _install_counters()
    _, ctx = _contexts(rank, world, seed)[1]  # 1- and 2-token fragments
    model = _Single(backend="triton")
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    x = _x(ctx, seed)
    want, _, _ = _run(model, model, x, ctx)
    got, fwd, bwd = _run(model, compiled, x, ctx)
    _assert_bitwise(got, want, f"rank {rank}: triton (interpreted), compiled vs eager")
    assert fwd["exchange"] == 1 and bwd["exchange"] == 1
    # checkpoint inside the compiled model + a handle: the original forward runs the overlapped
    # program (exchange in flight during the kernel), the recompute the stored-rows one: same bits
    handle = RecomputeHandleDetKcp()
    got, fwd, bwd = _run(model, compiled, x, ctx, handle, True)
    _assert_bitwise(got, want, f"rank {rank}: triton (interpreted), compiled checkpoint + handle vs eager")
    assert fwd["exchange"] == 1 and bwd["exchange"] == 1 and set(handle.entries) == {"conv"}
    reference = _Single(backend="reference")
    ref, _, _ = _run(reference, reference, x, ctx)
    # (the backends agree to rounding, not bitwise; bitwise KCP == single-rank per backend is test_kcp_ops')
    torch.testing.assert_close(got["y0"].float(), ref["y0"].float(), rtol=2e-2, atol=2e-2)
    return True


@pytest.mark.interpret
@pytest.mark.dist
def test_kcp_compile_triton_interpreted_on_every_rank():
    assert run_on_ranks(_interp, 2, 600, timeout_s=600) == [True, True]


# ------------------------------------------------------------------ this process (1-rank context)

def _local_context():
    return build_kcp_context(torch.tensor([0, 3, 4, 13, 20], dtype=torch.int32),
                             fragments=[[(10, 11), (0, 4), (4, 10), (11, 20)]])


def test_opcheck_forward_and_backward_ops():
    ctx = _local_context()
    g = torch.Generator().manual_seed(3)
    S, D = ctx.num_local_tokens, ctx.num_segments
    xs = [torch.randn(S, c, generator=g) for c in (8, 16)]
    ws = [torch.randn(c, 4, generator=g) for c in (8, 16)]
    bs = [torch.randn(8, generator=g), torch.empty(0)]  # the second tensor without a bias
    has_bias = [True, False]
    torch.library.opcheck(FWD, (xs, ws, bs, has_bias, ctx.op_id, D, NO_HANDLE, "conv_multi", "reference"))
    out = FWD(xs, ws, bs, has_bias, ctx.op_id, D, NO_HANDLE, "conv_multi", "reference")
    assert [tuple(t.shape) for t in out] == [(S, 8), (S, 16), (D, 3, 8), (D, 3, 16)]
    dys = [torch.randn(S, c, generator=g) for c in (8, 16)]
    torch.library.opcheck(BWD, (dys, xs, ws, bs, has_bias, out[2:], ctx.op_id, "reference"))
    grads = BWD(dys, xs, ws, bs, has_bias, out[2:], ctx.op_id, "reference")
    assert [tuple(t.shape) for t in grads] == [(S, 8), (S, 16), (8, 4), (16, 4), (8,), (0,)]


def test_registry_ids_are_sequential_weak_and_checked():
    ctx1, ctx2 = _local_context(), _local_context()
    h1, h2 = RecomputeHandleDetKcp(), RecomputeHandleDetKcp()
    assert ctx2.op_id == ctx1.op_id + 1 and h2.op_id == h1.op_id + 1
    assert CONTEXTS.lookup(ctx1.op_id) is ctx1 and HANDLES.lookup(h2.op_id) is h2
    n_ctx, n_handles, gone_ctx, gone_handle = len(CONTEXTS), len(HANDLES), ctx2.op_id, h2.op_id
    del ctx2, h2
    gc.collect()
    assert len(CONTEXTS) == n_ctx - 1 and len(HANDLES) == n_handles - 1  # held weakly: no leak
    with pytest.raises(RuntimeError, match=f"no live KcpContext with op_id {gone_ctx}"):
        CONTEXTS.lookup(gone_ctx)
    with pytest.raises(RuntimeError, match=f"no live RecomputeHandleDetKcp with op_id {gone_handle}"):
        HANDLES.lookup(gone_handle)
    # the eager autograd graph keeps its context alive until the backward
    x = torch.randn(ctx1.num_local_tokens, 8, requires_grad=True)
    y = cake_causal_conv1d_det_kcp(x, torch.randn(8, 4), _local_context())
    gc.collect()
    y.sum().backward()
    assert x.grad is not None


def test_functions_compile_and_match_the_ops():
    """CakeCausalConv1dDet(Multi)FunctionKcp.apply under compile: no break, the public ops' bits."""
    torch._dynamo.reset()
    ctx = _local_context()
    g = torch.Generator().manual_seed(5)
    x = torch.randn(20, 8, generator=g).to(torch.bfloat16)
    w, b = torch.randn(8, 4, generator=g), torch.randn(8, generator=g)

    def single(x_, w_, b_):
        return CakeCausalConv1dDetFunctionKcp.apply(x_, w_, b_, ctx, "reference", None)

    def multi(x_, w_, b_):
        return CakeCausalConv1dDetMultiFunctionKcp.apply(ctx, "reference", None, 1, x_, w_, b_)[0]

    def op(x_, w_, b_):
        return cake_causal_conv1d_det_kcp(x_, w_, ctx, bias=b_, backend="reference")

    def grads(fn):
        leaves = [t.clone().requires_grad_(True) for t in (x, w, b)]
        y = fn(*leaves)
        (y.float() * y.float()).sum().backward()
        return [y.detach()] + [t.grad for t in leaves]

    want = grads(op)
    for fn in (single, multi):
        for got in (grads(fn), grads(torch.compile(fn, fullgraph=True, backend="aot_eager"))):
            assert all(torch.equal(a, e) for a, e in zip(got, want)), fn.__name__


BAD = [
    # (description, change, exception, text)
    ("bf16 taps", dict(w=torch.zeros(8, 4, dtype=torch.bfloat16)), TypeError, "FP32"),
    ("rows", dict(x=torch.zeros(19, 8)), ValueError, "S_local = 20"),
    ("zero-size bias", dict(b=torch.zeros(0)), ValueError, "got shape (0,)"),
    ("backend", dict(backend="cuda"), ValueError, "'cuda'"),
]


@pytest.mark.parametrize("desc,change,exc,text", BAD, ids=[c[0] for c in BAD])
def test_bad_input_raises_under_compile(desc, change, exc, text):
    torch._dynamo.reset()
    ctx = _local_context()
    args = dict(x=torch.randn(20, 8), w=torch.randn(8, 4), b=torch.randn(8), backend="reference")
    args.update(change)
    backend = args["backend"]

    def f(x_, w_, b_, be=backend):
        return cake_causal_conv1d_det_kcp(x_, w_, ctx, bias=b_, backend=be).sum()

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    with pytest.raises(exc) as info:
        compiled(args["x"], args["w"], args["b"])
    assert text in str(info.value), str(info.value)
    # the next valid call works
    x, w, b = torch.randn(20, 8), torch.randn(8, 4), torch.randn(8)
    assert torch.equal(compiled(x, w, b, "reference"), f(x, w, b, "reference"))
