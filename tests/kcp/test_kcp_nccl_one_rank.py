"""KCP on a 1-rank NCCL group (tier 4, the GPU machine): every layout, the compiled Triton kernels.

With one rank, zigzag's back part follows its own front part (the self-halo) and every explicit
fragment table of several fragments exercises the local copies of the exchange; what only a
machine with several GPUs can show (point-to-point over NCCL between GPUs) is the multi-GPU tier's
(tests/multigpu/).
"""

import random

import pytest
import torch

from cakeconv import build_kcp_context, cake_causal_conv1d_det, cake_causal_conv1d_det_kcp, cake_causal_conv1d_det_multi_kcp

from ._dist import nccl_one_rank_group
from .test_kcp_plan import random_cu_seqlens, random_fragments

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def nccl_group():
    yield from nccl_one_rank_group()


def _check(cu_list, C, seed, layout=None, fragments=None):
    cu = torch.tensor(cu_list, dtype=torch.int32, device="cuda")
    T = cu_list[-1]
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(T, C, device="cuda", generator=g).bfloat16()
    dy = torch.randn(T, C, device="cuda", generator=g).bfloat16()
    w = torch.randn(C, 4, device="cuda", generator=g) * 0.5
    b = torch.randn(C, device="cuda", generator=g) * 0.5
    xs = x.clone().requires_grad_(True)
    y_s = cake_causal_conv1d_det(xs, w, b, cu_seqlens=cu)
    y_s.backward(dy)
    ctx = build_kcp_context(cu, layout=layout, fragments=fragments)
    xl = ctx.shard(x).requires_grad_(True)
    wl = w.clone().requires_grad_(True)
    y = cake_causal_conv1d_det_kcp(xl, wl, ctx, bias=b)
    y.backward(ctx.shard(dy))
    idx = ctx.local_token_indices
    assert torch.equal(y, y_s[idx])
    assert torch.equal(xl.grad, xs.grad[idx])
    return ctx


@pytest.mark.parametrize("layout", ["contiguous", "zigzag", "zigzag_per_document"])
def test_nccl_one_rank_layouts(nccl_group, layout):
    cu = [0, 2, 4, 4, 40000, 40002, 65536]  # every document length even: valid for all layouts at P = 1
    ctx = _check(cu, 512, 1, layout=layout)
    assert ctx.world_size == 1
    if layout == "zigzag":
        assert ctx.num_segments >= 2  # the back part reads its own front part


def test_nccl_one_rank_random_fragments_and_multi(nccl_group):
    rng = random.Random(3)
    for rep in range(3):
        cu = random_cu_seqlens(rng, 30, 400)
        if cu[-1] == 0:
            cu.append(16)
        _check(cu, 128, 10 + rep, fragments=random_fragments(rng, cu[-1], 1))
    cu = torch.tensor([0, 3, 1000, 4096], dtype=torch.int32, device="cuda")
    ctx = build_kcp_context(cu, layout="zigzag")
    xs = [torch.randn(4096, C, device="cuda").bfloat16() for C in (128, 256, 64)]
    ws = [torch.randn(C, 4, device="cuda") for C in (128, 256, 64)]
    ys = cake_causal_conv1d_det_multi_kcp([ctx.shard(x) for x in xs], ws, ctx)
    for x, w, y in zip(xs, ws, ys):
        assert torch.equal(y, cake_causal_conv1d_det_kcp(ctx.shard(x), w, ctx))


def _graph_inputs(T, C, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(T, C, device="cuda", generator=g).bfloat16(), torch.randn(T, C, device="cuda", generator=g).bfloat16()


def test_nccl_one_rank_cuda_graph_replay_and_new_layout(nccl_group):
    """The KCP forward + backward (autograd, Triton) captured once in a CUDA graph, then replayed on
    new data and, after ``ctx.load_layout_``, on a new document layout: bitwise eager each time.

    The caller owns the static tensors: y and the gradients (x.grad, w.grad, b.grad) are
    overwritten by every replay, so a replay's gradients that are kept are cloned first (checked:
    the clones of the first replay survive the later ones).
    """
    T, C = 65536, 512
    cu_a = torch.tensor([0, 5, 30000, T], dtype=torch.int32, device="cuda")
    cu_b = torch.tensor([0, 17, 41000, T], dtype=torch.int32, device="cuda")  # zigzag split at T/2 stays clear
    ctx = build_kcp_context(cu_a, layout="zigzag")
    assert ctx.num_segments == 4 and ctx.fix_fwd_rows.numel() == 3
    w = (torch.randn(C, 4, device="cuda") * 0.5).requires_grad_(True)
    b = (torch.randn(C, device="cuda") * 0.5).requires_grad_(True)
    x0, dy0 = _graph_inputs(T, C, 0)
    x_s = ctx.shard(x0).requires_grad_(True)  # static inputs (local rows)
    dy_s = ctx.shard(dy0)

    def step():
        y = cake_causal_conv1d_det_kcp(x_s, w, ctx, bias=b)
        y.backward(dy_s)
        return y

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # warm-up: compile the kernels, set up the group's connections
            x_s.grad = w.grad = b.grad = None
            step()
    torch.cuda.current_stream().wait_stream(side)
    x_s.grad = w.grad = b.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_s = step()

    def eager(x, dy, cu):
        xe = x.clone().requires_grad_(True)
        we, be = w.detach().clone().requires_grad_(True), b.detach().clone().requires_grad_(True)
        ye = cake_causal_conv1d_det(xe, we, be, cu_seqlens=cu)
        ye.backward(dy)
        return ye, xe.grad, we.grad, be.grad

    kept = []
    for seed, cu in ((1, cu_a), (2, cu_a), (3, cu_b), (4, cu_b)):
        if cu is cu_b and ctx.global_cu_seqlens[1] != 17:
            ctx.load_layout_(build_kcp_context(cu_b, layout="zigzag"))
        x, dy = _graph_inputs(T, C, seed)
        with torch.no_grad():
            x_s.copy_(ctx.shard(x))
            dy_s.copy_(ctx.shard(dy))
        graph.replay()
        torch.cuda.synchronize()
        ye, dxe, dwe, dbe = eager(x, dy, cu)
        idx = ctx.local_token_indices
        assert torch.equal(y_s, ye[idx]) and torch.equal(x_s.grad, dxe[idx])
        # One rank holds every token: its partial dweight/dbias is the whole sum, in its own
        # fixed order (the local rows are in zigzag order): within FP32 tolerance of eager's.
        torch.testing.assert_close(w.grad, dwe, rtol=1e-4, atol=1e-3)
        torch.testing.assert_close(b.grad, dbe, rtol=1e-4, atol=1e-3)
        kept.append((x_s.grad.clone(), w.grad.clone(), dxe[idx]))
    first = kept[0]
    assert torch.equal(first[0], first[2]) and not torch.equal(first[0], kept[1][0])


def test_nccl_one_rank_compiled_kcp_op_matches_eager(nccl_group):
    """torch.compile(fullgraph=True) (Inductor, CUDA) of Linear -> KCP conv on a 1-rank NCCL group:
    y and every gradient bitwise eager's."""
    T, C = 8192, 256
    cu = torch.tensor([0, 3, 5000, T], dtype=torch.int32, device="cuda")
    ctx = build_kcp_context(cu, layout="zigzag")
    torch.manual_seed(0)
    lin = torch.nn.Linear(C, C, bias=False, device="cuda")
    w = (torch.randn(C, 4, device="cuda") * 0.5).requires_grad_(True)
    b = (torch.randn(C, device="cuda") * 0.5).requires_grad_(True)

    def model(x):
        return cake_causal_conv1d_det_kcp(lin(x).bfloat16(), w, ctx, bias=b)

    x = ctx.shard(torch.randn(T, C, device="cuda"))
    dy = torch.randn(T, C, device="cuda").bfloat16()
    results = []
    for fn in (model, torch.compile(model, fullgraph=True)):
        for p in (lin.weight, w, b):
            p.grad = None
        y = fn(x)
        y.backward(dy)
        results.append((y, lin.weight.grad.clone(), w.grad.clone(), b.grad.clone()))
    for a, c in zip(*results):
        assert torch.equal(a, c)
