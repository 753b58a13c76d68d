"""Tier 1: the single-rank op as a torch custom op under torch.compile (CPU, reference backend).

``cake_causal_conv1d_det`` applies ``CakeCausalConv1dDetFunction``, whose forward and backward, while
compiling, call the custom ops ``torch.ops.cakeconv.cake_causal_conv1d_det_forward_into`` and
``..._backward_into`` (they write into given buffers). Checked here:
``torch.compile(fullgraph=True)`` of a small model (Linear -> op -> loss) compiles without a graph
break and gives bitwise the eager y and gradients (the op is opaque to the compiler, so its bits
are the eager entry points'); the Function and the op run the same code; ``torch.library.opcheck``
accepts both ops; bad input raises the eager ValueError/TypeError when the compiled graph runs.

The CASES include a width-3 conv without activation (SPEC 1b): the width and the activation reach
the custom ops as the weight's shape and a schema argument.

The model's Linear has no bias: Inductor sums a Linear's bias gradient over rows in its own order,
which is not bitwise eager's (torch's matter, not the op's); every other gradient is bitwise.

Shape legend: S packed tokens, C channels, B batch rows, T row length.
"""

import pytest
import torch
import torch._dynamo

from cakeconv import CakeCausalConv1dDetFunction, cake_causal_conv1d_det, cake_causal_conv1d_det_train_backward
from tests.helpers import make_inputs

FWD = torch.ops.cakeconv.cake_causal_conv1d_det_forward_into
BWD = torch.ops.cakeconv.cake_causal_conv1d_det_backward_into

C = 16


class _Model(torch.nn.Module):
    """Linear (fp32) -> cast to x_dtype -> conv of W taps + activation -> y and a loss that depends on y."""

    def __init__(self, x_dtype, w_dtype, b_dtype, width=4, activation="silu"):
        super().__init__()
        g = torch.Generator().manual_seed(5)
        self.lin = torch.nn.Linear(C, C, bias=False)
        with torch.no_grad():
            self.lin.weight.copy_(torch.randn(C, C, generator=g) * 0.3)
        self.w = torch.nn.Parameter((torch.randn(C, width, generator=g) * 0.5).to(w_dtype))
        self.b = torch.nn.Parameter((torch.randn(C, generator=g) * 0.5).to(b_dtype)) if b_dtype else None
        self.x_dtype = x_dtype
        self.activation = activation

    def forward(self, x, cu=None):
        h = self.lin(x).to(self.x_dtype)
        y = cake_causal_conv1d_det(h, self.w, self.b, cu_seqlens=cu, activation=self.activation)
        return y, (y.float() * y.float()).sum()


def _run(model, fn, x, cu):
    model.zero_grad(set_to_none=True)
    xg = x.clone().requires_grad_(True)
    y, loss = fn(xg, cu)
    loss.backward()
    # clones: under CUDA graphs (mode="reduce-overhead") a later replay reuses the output memory
    return {"y": y.detach().clone(), "dx": xg.grad.clone(),
            **{f"d{n}": p.grad.clone() for n, p in model.named_parameters()}}


def _assert_bitwise(got, want, what):
    assert got.keys() == want.keys()
    for k in want:
        assert want[k] is not None and got[k] is not None, f"{what}: {k} has no gradient"
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, f"{what}: {k}"
        assert torch.equal(got[k], want[k]), f"{what}: {k} differs from eager"


CASES = [
    # (id, x shape, cu_seqlens, x dtype, weight dtype, bias dtype, width, activation)
    ("SC_cu_bf16", (37, C), [0, 5, 6, 6, 20, 37], torch.bfloat16, torch.float32, torch.float32, 4, "silu"),
    ("BTC_fp32_bf16taps", (3, 11, C), None, torch.float32, torch.bfloat16, torch.float32, 4, "silu"),
    ("SC_cu_bf16_W3_none", (37, C), [0, 5, 6, 6, 20, 37], torch.bfloat16, torch.float32, torch.float32, 3, None),
]


@pytest.mark.parametrize("shape,cu,x_dtype,w_dtype,b_dtype,width,activation", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_compile_fullgraph_inductor_bitwise(shape, cu, x_dtype, w_dtype, b_dtype, width, activation):
    torch._dynamo.reset()
    model = _Model(x_dtype, w_dtype, b_dtype, width, activation)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    cu = None if cu is None else torch.tensor(cu, dtype=torch.int32)
    want = _run(model, model, x, cu)
    compiled = torch.compile(model, fullgraph=True, backend="inductor")
    _assert_bitwise(_run(model, compiled, x, cu), want, "inductor")
    # and again on new data (no recompile needed for the same shapes)
    x2 = torch.randn(*shape, generator=torch.Generator().manual_seed(2))
    _assert_bitwise(_run(model, compiled, x2, cu), _run(model, model, x2, cu), "inductor, new data")


def test_explain_no_graph_break_and_op_is_opaque():
    torch._dynamo.reset()
    model = _Model(torch.bfloat16, torch.float32, torch.float32)
    x = torch.randn(37, C)
    cu = torch.tensor([0, 5, 37], dtype=torch.int32)
    ex = torch._dynamo.explain(model)(x, cu)
    assert ex.graph_break_count == 0 and ex.graph_count == 1, ex
    # the Function's forward (a subgraph of its autograd HOP) holds the opaque op
    targets = [n.target for m in ex.graphs[0].modules() for n in m.graph.nodes if n.op == "call_function"]
    assert any(t in (FWD, FWD.default) for t in targets), targets


def _fn_model(x, w, b, cu):
    """The Function's own path (autograd.Function.apply) under compile."""
    return CakeCausalConv1dDetFunction.apply(x, w, b, cu, "auto")


@pytest.mark.parametrize("bias", [True, False])
def test_function_and_op_give_the_same_bits_eager_and_compiled(bias):
    torch._dynamo.reset()
    S = 29
    x, w, b, dy = make_inputs(S, C, dtype=torch.bfloat16, bias=bias, seed=3)
    cu = torch.tensor([0, 1, 2, 9, 29], dtype=torch.int32)

    def grads(fn):
        xs = [t.clone().requires_grad_(True) if t is not None else None for t in (x, w, b)]
        y = fn(xs[0], xs[1], xs[2], cu)
        y.backward(dy)
        return [y.detach()] + [t.grad for t in xs if t is not None]

    op = grads(lambda x_, w_, b_, cu_: cake_causal_conv1d_det(x_, w_, b_, cu_seqlens=cu_))
    fn = grads(_fn_model)
    compiled = grads(torch.compile(_fn_model, fullgraph=True, backend="aot_eager"))
    ref = cake_causal_conv1d_det_train_backward(dy, x, w, b, cu)
    for got in (fn, compiled):
        assert len(got) == len(op)
        for a, e in zip(got, op):
            assert torch.equal(a, e)
    assert torch.equal(op[1], ref[0]) and torch.equal(op[2], ref[1])
    if bias:
        assert torch.equal(op[3], ref[2])


def test_mixed_parameter_dtypes_round_each_gradient_once():
    """bf16 taps with an fp32 bias: dbias is the FP32 sum (not rounded through bf16 first)."""
    S = 50
    x, w, b, dy = make_inputs(S, C, dtype=torch.bfloat16, wdtype=torch.bfloat16, seed=4)
    b = b.float()
    cu = torch.tensor([0, 20, 50], dtype=torch.int32)
    wg, bg = w.clone().requires_grad_(True), b.clone().requires_grad_(True)
    cake_causal_conv1d_det(x, wg, bg, cu_seqlens=cu).backward(dy)
    _, dw32, db32 = cake_causal_conv1d_det_train_backward(dy, x, w, b, cu, dweight_dtype=torch.float32)
    assert wg.grad.dtype == torch.bfloat16 and bg.grad.dtype == torch.float32
    assert torch.equal(bg.grad, db32)
    assert torch.equal(wg.grad, dw32.to(torch.bfloat16))
    assert not torch.equal(db32, db32.to(torch.bfloat16).float())  # the case is not vacuous


def test_opcheck_forward_and_backward_ops():
    """Both ops pass torch.library.opcheck (schema, fake implementation, mutated buffers).

    The inputs carry no gradient: the ops have no autograd formula of their own (the Function
    calls them), so opcheck's autograd-registration check does not apply.
    """
    from cakeconv.cake_causal_conv1d_det_train_backend.kernels.launch import backward_workspace_floats

    S = 13
    x, w, b, dy = make_inputs(S, C, dtype=torch.float32, seed=6)
    cu = torch.tensor([0, 2, 13], dtype=torch.int64)
    for bias in (b, None):
        for cu_ in (cu, None):
            torch.library.opcheck(FWD, (x, w, bias, cu_, "reference", torch.empty_like(x)))
            db = torch.empty(C) if bias is not None else torch.empty(0)
            ws = torch.empty(backward_workspace_floats(S, C))
            torch.library.opcheck(BWD, (dy, x, w, bias, cu_, "reference", torch.empty_like(x), ws,
                                        torch.empty(C, 4), db))
    xb = x[:12].view(3, 4, C)
    torch.library.opcheck(FWD, (xb, w, b, None, "auto", torch.empty_like(xb)))
    # width 3 without activation: the activation is the ops' last (optional) argument
    w3 = make_inputs(S, C, dtype=torch.float32, seed=6, width=3)[1]
    torch.library.opcheck(FWD, (x, w3, b, cu, "reference", torch.empty_like(x), None))
    ws3 = torch.empty(backward_workspace_floats(S, C, 3))
    torch.library.opcheck(BWD, (dy, x, w3, b, cu, "reference", torch.empty_like(x), ws3, torch.empty(C, 3),
                                torch.empty(C), None))


def test_backward_op_without_bias_leaves_the_placeholder():
    x, w, _, dy = make_inputs(9, C, bias=False, seed=7)
    dx, dw, db = torch.empty_like(x), torch.full((C, 4), float("nan")), torch.empty(0)
    BWD(dy, x, w, None, None, "auto", dx, torch.empty(0), dw, db)
    want = cake_causal_conv1d_det_train_backward(dy, x, w, None, None)
    assert torch.equal(dx, want[0]) and torch.equal(dw, want[1]) and db.shape == (0,)


BAD = [
    # (description, change, exception, text)
    ("cu end", dict(cu=torch.tensor([0, 5, 31], dtype=torch.int32)), ValueError, "cu_seqlens[-1] = 31"),
    ("cu start", dict(cu=torch.tensor([1, 5, 32], dtype=torch.int32)), ValueError, "cu_seqlens[0] = 1"),
    ("C not multiple of 8", dict(x=torch.zeros(32, 12), w=torch.zeros(12, 4), b=torch.zeros(12)), ValueError, "C = 12"),
    ("weight W = 9", dict(w=torch.zeros(16, 9)), ValueError, "(16, 9)"),
    ("activation relu", dict(activation="relu"), ValueError, "'relu'"),
    ("x float64", dict(x=torch.zeros(32, 16, dtype=torch.float64)), TypeError, "float64"),
    ("backend", dict(backend="cuda"), ValueError, "'cuda'"),
]


@pytest.mark.parametrize("desc,change,exc,text", BAD, ids=[c[0] for c in BAD])
def test_bad_input_raises_under_compile(desc, change, exc, text):
    torch._dynamo.reset()
    x, w, b, _ = make_inputs(32, 16, dtype=torch.float32, seed=0)
    args = dict(x=x, w=w, b=b, cu=torch.tensor([0, 5, 32], dtype=torch.int32), backend="auto", activation="silu")
    args.update(change)
    backend, activation = args["backend"], args["activation"]

    def f(x_, w_, b_, cu_):
        return cake_causal_conv1d_det(x_, w_, b_, cu_seqlens=cu_, activation=activation, backend=backend).sum()

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    with pytest.raises(exc) as info:
        compiled(args["x"], args["w"], args["b"], args["cu"])
    assert text in str(info.value), str(info.value)
    # The next valid call works.
    ok = make_inputs(32, 16, dtype=torch.float32, seed=0)
    assert cake_causal_conv1d_det(ok[0], ok[1], ok[2], cu_seqlens=torch.tensor([0, 5, 32], dtype=torch.int32)).shape == (32, 16)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_compile_cuda_triton_bitwise(mode):
    """The Triton backend on the GPU: compiled (also CUDA-graphed) bits == eager bits, new data each step."""
    torch._dynamo.reset()
    model = _Model(torch.bfloat16, torch.float32, torch.float32).cuda()
    cu = torch.tensor([0, 1, 3, 3, 700, 1001, 4099], dtype=torch.int32, device="cuda")
    compiled = torch.compile(model, fullgraph=True, mode=mode)
    for step in range(4):
        x = torch.randn(4099, C, generator=torch.Generator().manual_seed(10 + step)).cuda()
        want = _run(model, model, x, cu)
        _assert_bitwise(_run(model, compiled, x, cu), want, f"{mode}, step {step}")


def _functions_asking_is_compiling(module) -> set:
    """The functions of ``module``'s source that call ``torch.compiler.is_compiling()``."""
    import ast
    import inspect

    found = set()
    for fn in ast.walk(ast.parse(inspect.getsource(module))):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr == "is_compiling"):
                    found.add(fn.name)
    return found


def test_one_eager_compile_wrapper_per_custom_op():
    """Eager or traced is decided in one function per custom op (the single-rank op's forward and
    backward, KCP's forward and backward), never in the entry points or the autograd Functions."""
    from cakeconv.cake_causal_conv1d_det_train_backend import conv
    from cakeconv.cake_causal_conv1d_det_train_backend.kcp import ops

    assert _functions_asking_is_compiling(conv) == {"run_forward", "run_backward"}
    assert _functions_asking_is_compiling(ops) == {"_forward_call", "_backward_call"}


def test_traced_backward_of_an_eager_forward_takes_the_custom_op(monkeypatch):
    """A backward traced after an eager forward (compiled autograd) goes through the backward op
    even though the forward left its eager plan on the node; the bits are the eager backward's."""
    from cakeconv.cake_causal_conv1d_det_train_backend import conv

    x, w, b, dy = make_inputs(40, C, dtype=torch.float32, seed=3)
    cu = torch.tensor([0, 7, 40], dtype=torch.int32)
    x.requires_grad_(True), w.requires_grad_(True), b.requires_grad_(True)
    want = torch.autograd.grad(cake_causal_conv1d_det(x, w, b, cu_seqlens=cu), (x, w, b), dy)
    y = cake_causal_conv1d_det(x, w, b, cu_seqlens=cu)  # eager forward: the node holds its plan
    calls = []
    real_op = conv.backward_into_op
    monkeypatch.setattr(conv, "backward_into_op", lambda *a: calls.append(1) or real_op(*a))
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    got = torch.autograd.grad(y, (x, w, b), dy)
    assert calls == [1]
    for g, e in zip(got, want):
        assert torch.equal(g, e)
