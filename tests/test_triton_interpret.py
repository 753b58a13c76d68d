"""Tier 2: the real Triton kernels, run by the CPU interpreter (TRITON_INTERPRET=1).

Run in its own pytest process: ``TRITON_INTERPRET=1 python -m pytest -m interpret tests``.
Shapes are small (the interpreter executes every program in numpy), yet long enough for several
programs, several dweight leaves (64 rows each) and programs on both the masked and the unmasked
path.
"""

import pytest
import torch

from cakeconv import cake_causal_conv1d_det, cake_causal_conv1d_det_train_backward, cake_causal_conv1d_det_train_forward
from cakeconv.cake_causal_conv1d_det_train_backend.kernels import backward as triton_backward, launch as triton_launch
from cakeconv.cake_causal_conv1d_det_train_backend.kernels.segment_ids import use_segment_ids
from cakeconv.cake_causal_conv1d_det_train_backend.kernels.tuning import BwdConfig, FwdConfig
from cakeconv.oracle import (causal_conv1d_oracle, causal_conv1d_oracle_backward, causal_conv1d_silu_oracle,
                             causal_conv1d_silu_oracle_backward)
from tests.helpers import (TOLERANCES, FakeWarmup, backward_tree_from_nodes, make_inputs, random_cu_seqlens, rel_err,
                           uniform_cuts)

pytestmark = pytest.mark.interpret


def _both(x, w, b, cu, dy, activation="silu"):
    out = {}
    for backend in ("triton", "reference"):
        y = cake_causal_conv1d_det_train_forward(x, w, b, cu, activation=activation, backend=backend)
        out[backend] = (y,) + tuple(cake_causal_conv1d_det_train_backward(dy, x, w, b, cu, activation=activation,
                                                                          backend=backend))
    return out["triton"], out["reference"]


def _ulp_close(a, b, dtype):
    """Outputs rounded once to dtype: at most one ulp apart (the FP32 values differ by FMA rounding)."""
    eps = torch.finfo(dtype).eps
    diff = (a.double() - b.double()).abs()
    scale = torch.maximum(a.double().abs(), b.double().abs()).clamp_min(1e-3)
    return bool((diff <= 1.01 * eps * scale + 1e-6).all())


# Grid rationale: S = 300 gives 5 dweight leaves, a random document mix (empty, 1-3 tokens, long);
# S = 7 is shorter than one program; dtypes cover the three x dtypes and both tap dtypes.
CASES = [
    (300, 24, torch.bfloat16, torch.float32, True),
    (300, 16, torch.float16, torch.bfloat16, False),
    (7, 8, torch.float32, torch.float32, True),
]


@pytest.mark.parametrize("S,C,dtype,wdtype,bias", CASES)
def test_triton_matches_reference_and_oracle(S, C, dtype, wdtype, bias):
    gen = torch.Generator().manual_seed(S + C)
    cu = random_cu_seqlens(S, gen)
    x, w, b, dy = make_inputs(S, C, dtype=dtype, wdtype=wdtype, bias=bias, seed=S)
    tri, ref = _both(x, w, b, cu, dy)
    assert _ulp_close(tri[0], ref[0], dtype), "y"
    assert _ulp_close(tri[1], ref[1], dtype), "dx"
    assert rel_err(tri[2], ref[2]) < 1e-5 and tri[2].dtype == torch.float32
    if bias:
        assert rel_err(tri[3], ref[3]) < 1e-5
    else:
        assert tri[3] is None
    assert rel_err(tri[0], causal_conv1d_silu_oracle(x, w, b, cu)) < TOLERANCES[dtype]
    dxo, dwo, dbo = causal_conv1d_silu_oracle_backward(dy, x, w, b, cu)
    assert rel_err(tri[1], dxo) < TOLERANCES[dtype] and rel_err(tri[2], dwo) < 2e-5


# Other widths and no activation (SPEC 1b): W and the activation are compile-time constants of the
# kernels. S = 200 at R = 2 x 8-row programs: programs with few and with many segments, halos of up
# to 7 rows across 1-3-token documents; bias on and off, both tap dtypes.
WIDTH_CASES = [(2, None, True, torch.float32), (3, "silu", False, torch.bfloat16), (5, None, False, torch.float32),
               (7, "silu", True, torch.float32), (8, None, True, torch.bfloat16), (8, "silu", False, torch.float32)]


@pytest.mark.parametrize("W,activation,bias,wdtype", WIDTH_CASES)
def test_triton_width_and_activation_match_reference_and_oracle(W, activation, bias, wdtype):
    S, C, dtype = 200, 16, torch.bfloat16
    cu = random_cu_seqlens(S, torch.Generator().manual_seed(W))
    x, w, b, dy = make_inputs(S, C, dtype=dtype, wdtype=wdtype, bias=bias, seed=W, width=W)
    tri, ref = _both(x, w, b, cu, dy, activation)
    assert tri[2].shape == (C, W)
    assert _ulp_close(tri[0], ref[0], dtype), "y"
    assert _ulp_close(tri[1], ref[1], dtype), "dx"
    assert rel_err(tri[2], ref[2]) < 1e-5
    if bias:
        assert rel_err(tri[3], ref[3]) < 1e-5
    assert rel_err(tri[0], causal_conv1d_oracle(x, w, b, cu, activation)) < TOLERANCES[dtype]
    dxo, dwo, dbo = causal_conv1d_oracle_backward(dy, x, w, b, cu, activation)
    assert rel_err(tri[1], dxo) < TOLERANCES[dtype] and rel_err(tri[2], dwo) < 2e-5
    again = _both(x, w, b, cu, dy, activation)[0]
    assert all(torch.equal(p, q) for p, q in zip(tri, again) if p is not None), "bitwise on every call"


def test_triton_uniform_batch_equals_packed_bitwise():
    B, T, C = 2, 150, 16
    x, w, b, dy = make_inputs(B * T, C, seed=4)
    cu = torch.tensor([0, T, 2 * T], dtype=torch.int32)
    y_p = cake_causal_conv1d_det_train_forward(x, w, b, cu, backend="triton")
    y_u = cake_causal_conv1d_det_train_forward(x.view(B, T, C), w, b, backend="triton")
    assert torch.equal(y_u.view(B * T, C), y_p)
    g_p = cake_causal_conv1d_det_train_backward(dy, x, w, b, cu, backend="triton")
    g_u = cake_causal_conv1d_det_train_backward(dy.view(B, T, C), x.view(B, T, C), w, b, backend="triton")
    assert torch.equal(g_u[0].view(B * T, C), g_p[0])
    assert torch.equal(g_u[1], g_p[1]) and torch.equal(g_u[2], g_p[2])


@pytest.mark.parametrize("W,activation,n_cfgs,C", [(4, "silu", 6, 32), (8, None, 2, 16)])
def test_triton_tuning_never_changes_bits(W, activation, n_cfgs, C):
    """Every tile shape gives the same y, dx, dweight and dbias bits (fixed summation order), at
    the seed's width (all tile shapes) and at W = 8 without activation (two of each pass, 16
    channels: CI time, 116 s with three at 32 channels).

    S = 330: six 64-row leaves, two programs of the 4-leaf configurations (CI time: 520 took 133 s)."""
    S = 330
    gen = torch.Generator().manual_seed(5)
    cu = random_cu_seqlens(S, gen, short=False)
    x, w, b, dy = make_inputs(S, C, seed=6, width=W)
    fwd_cfgs = [FwdConfig(1, 8, 32, 1), FwdConfig(2, 16, 16, 1, stages=4), FwdConfig(4, 4, 8, 1), FwdConfig(2, 8, 16, 1, stages=3)]
    ys = []
    for cfg in fwd_cfgs[:n_cfgs]:
        y = torch.empty_like(x)
        triton_launch.triton_forward(x, w, b, cu, None, y, config=cfg, activation=activation)
        ys.append(y)
    assert all(torch.equal(ys[0], y) for y in ys[1:])
    bwd_cfgs = [BwdConfig(1, 32, 1), BwdConfig(2, 16, 1, stages=3), BwdConfig(4, 8, 1), BwdConfig(2, 16, 1, stages=4),
                BwdConfig(2, 16, 1, step_branch=True), BwdConfig(4, 8, 1, stages=3, step_branch=True)]
    outs = []
    n_ws = triton_launch.backward_workspace_floats(S, C, W)
    for cfg in bwd_cfgs[-n_cfgs:]:
        dx = torch.empty_like(x)
        dw = torch.empty(C, W)
        db = torch.empty(C)
        ws = torch.full((n_ws,), float("nan"))
        triton_launch.triton_backward(dy, x, w, b, cu, None, dx, ws, dw, db, config=cfg, activation=activation)
        outs.append((dx, dw, db))
    for o in outs[1:]:
        for a, c in zip(outs[0], o):
            assert torch.equal(a, c)
    dxr, dwr, dbr = cake_causal_conv1d_det_train_backward(dy, x, w, b, cu, activation=activation, backend="reference")
    assert rel_err(outs[0][1], dwr) < 1e-5


def test_triton_dweight_tree_over_several_groups():
    """S of one full group (8192 rows) and a partial second: two launches, the main kernel and the
    group kernel. The group sums and the dweight/dbias that the group kernel's last program of
    each column block (by ticket) writes are the bits of the documented order redone on the host
    from the nodes the main kernel wrote, for two node sizes (R = 4 and 8), and match float64; the
    ticket counters are 0 again after each launch. The second launch takes its counters from the
    workspace (as the custom ops and CUDA graphs do: after the nodes, zeroed first)."""
    S, C = 8192 + 700, 8
    cu = torch.tensor([0, 3, 5000, 8190, 8195, 8300, S], dtype=torch.int32)
    x, w, b, dy = make_inputs(S, C, seed=12)
    n_ws = triton_launch.backward_workspace_floats(S, C)
    n_leaves, n_groups = -(-S // triton_backward.BWD_SUB), 2
    outs = []
    for R in (4, 8):
        dx = torch.empty_like(x)
        dw = torch.full((C, 4), float("nan"))
        db = torch.full((C,), float("nan"))
        ws = torch.full((n_ws,), float("nan"))
        with triton_launch.record_launches(launch=True) as launches:
            triton_launch.triton_backward(dy, x, w, b, cu, None, dx, ws, dw, db, config=BwdConfig(R, 8, 1),
                                          tickets_in_workspace=R == 8)
        assert [rec.kernel.name for rec in launches] == ["cake_conv_bwd_kernel", "cake_conv_bwd_group_kernel"]
        tickets = launches[1].args[3]
        assert tickets.dtype == torch.int32 and tickets.shape[0] >= launches[1].grid[1] and not tickets.any()
        in_ws = ws.data_ptr() <= tickets.data_ptr() < ws.data_ptr() + n_ws * 4
        assert in_ws == (R == 8)
        gs, dw_host, db_host = backward_tree_from_nodes(ws, S, C, R)
        assert torch.equal(ws[n_leaves * 5 * C:(n_leaves + n_groups) * 5 * C].view(n_groups, 5, C), gs)
        assert torch.equal(dw, dw_host) and torch.equal(db, db_host)
        outs.append((dx, dw, db))
    assert all(torch.equal(a, c) for a, c in zip(*outs))
    _, dwo, dbo = causal_conv1d_silu_oracle_backward(dy, x, w, b, cu)
    assert rel_err(outs[0][1], dwo) < 1e-5 and rel_err(outs[0][2], dbo) < 1e-5


def test_triton_wide_dweight_tree_has_128_row_leaves_and_8192_row_groups():
    """W = 8 (leaf_tree: 128-row leaves, 64 to a group): S of one full group (8,192 rows) and a
    partial second take the main and the group kernel, whose dweight/dbias and group sums are the
    bits of that order redone on the host from the nodes (R = 2, the wide picks' node size), and
    match float64, as dx does."""
    W, S, C, R = 8, 8192 + 300, 8, 2
    assert triton_launch.leaf_tree(W)[:2] == (128, 64) and triton_launch.leaf_tree(4)[:2] == (64, 128)
    cu = torch.tensor([0, 3, 5000, 8190, 8195, 8300, S], dtype=torch.int32)
    x, w, b, dy = make_inputs(S, C, seed=14, width=W)
    n_ws = triton_launch.backward_workspace_floats(S, C, W)
    assert n_ws == (W + 1) * C * (-(-S // 128) + 2)
    dx, dw, db = torch.empty_like(x), torch.full((C, W), float("nan")), torch.full((C,), float("nan"))
    ws = torch.full((n_ws,), float("nan"))
    with triton_launch.record_launches(launch=True) as launches:
        triton_launch.triton_backward(dy, x, w, b, cu, None, dx, ws, dw, db, config=BwdConfig(R, 8, 1))
    assert [rec.kernel.name for rec in launches] == ["cake_conv_bwd_kernel", "cake_conv_bwd_group_kernel"]
    gs, dw_host, db_host = backward_tree_from_nodes(ws, S, C, R, width=W)
    n_leaves = -(-S // 128)
    assert torch.equal(ws[n_leaves * (W + 1) * C:(n_leaves + 2) * (W + 1) * C].view(2, W + 1, C), gs)
    assert torch.equal(dw, dw_host) and torch.equal(db, db_host)
    dxo, dwo, dbo = causal_conv1d_oracle_backward(dy, x, w, b, cu, "silu")
    assert rel_err(dx, dxo) < TOLERANCES[torch.bfloat16] and rel_err(dw, dwo) < 1e-5 and rel_err(db, dbo) < 1e-5


@pytest.mark.parametrize("S, R, C, bias, calls", [(700, 4, 16, True, 2), (8192, 8, 8, False, 1)])
def test_triton_one_group_is_added_by_the_last_program(S, R, C, bias, calls):
    """S <= 8192 rows (one group): ONE launch, the one-group kernel, whose last program of each
    channel block (by ticket) writes dweight/dbias; they are the bits of the documented order redone
    on the host from the nodes it wrote (its finalize over one group), for two node sizes, two and
    one channel blocks, with and without bias (a part of a group and a whole one). The first case
    runs twice: the ticket counters are back at 0 after each launch, so the second call finds them
    ready. (FP32
    only: the interpreter casts FP32 to bf16 by truncation; the GPU rounds to nearest, and the GPU
    tests compare bf16 dweight with the reference.)"""
    cu = torch.tensor([0, 3, 300, 301, S], dtype=torch.int32)
    x, w, b, dy = make_inputs(S, C, seed=13)
    n_ws = triton_launch.backward_workspace_floats(S, C)
    bb = b if bias else None
    for _ in range(calls):
        dx = torch.empty_like(x)
        dw = torch.full((C, 4), float("nan"))
        db = torch.full((C,), float("nan")) if bias else None
        ws = torch.full((n_ws,), float("nan"))
        with triton_launch.record_launches(launch=True) as launches:
            triton_launch.triton_backward(dy, x, w, bb, cu, None, dx, ws, dw, db, config=BwdConfig(R, 8, 1))
        assert [rec.kernel.name for rec in launches] == ["cake_conv_bwd_one_group_kernel"]
        tickets = launches[0].args[11]
        assert tickets.dtype == torch.int32 and tickets.shape[0] >= C // 8 and not tickets.any()
        _, dw_host, db_host = backward_tree_from_nodes(ws, S, C, R)
        assert torch.equal(dw, dw_host)
        if bias:
            assert torch.equal(db, db_host)
    dxr, dwr, dbr = cake_causal_conv1d_det_train_backward(dy, x, w, bb, cu, backend="reference")
    assert rel_err(dw, dwr) < 1e-5 and rel_err(dx, dxr) < 1e-2


def test_triton_custom_op_takes_the_tickets_from_its_workspace():
    """The backward custom op (what torch.compile calls) takes the one-group kernel's ticket
    counters from its workspace, zeroed first (nothing kept across calls can land in a CUDA-graph
    memory pool), and gives the eager entry point's bits; the counters are 0 again afterwards.
    (The group kernel's counters: test_triton_dweight_tree_over_several_groups.)"""
    S, C = 700, 16
    cu = torch.tensor([0, 3, 300, 301, S], dtype=torch.int32)
    x, w, b, dy = make_inputs(S, C, seed=14)
    n_ws = triton_launch.backward_workspace_floats(S, C)
    ws = torch.full((n_ws,), float("nan"))
    dx, dw, db = torch.empty_like(x), torch.empty((C, 4)), torch.empty((C,))
    with triton_launch.record_launches(launch=True) as launches:
        torch.ops.cakeconv.cake_causal_conv1d_det_backward_into(dy, x, w, b, cu, "triton", dx, ws, dw, db)
    assert [rec.kernel.name for rec in launches] == ["cake_conv_bwd_one_group_kernel"]
    tickets = launches[0].args[11]
    start, end = ws.data_ptr(), ws.data_ptr() + n_ws * 4
    assert start <= tickets.data_ptr() and tickets.data_ptr() + tickets.numel() * 4 <= end
    assert not tickets.any()
    want = cake_causal_conv1d_det_train_backward(dy, x, w, b, cu, backend="triton")
    assert all(torch.equal(a, c) for a, c in zip((dx, dw, db), want))


def test_triton_deterministic_and_autograd():
    S, C = 200, 16
    cu = torch.tensor([0, 1, 2, 5, 5, 130, 200], dtype=torch.int32)
    x, w, b, dy = make_inputs(S, C, seed=8)
    runs = []
    for _ in range(2):
        xg, wg, bg = (t.clone().requires_grad_(True) for t in (x, w, b))
        y = cake_causal_conv1d_det(xg, wg, bg, cu_seqlens=cu, backend="triton")
        y.backward(dy)
        runs.append((y, xg.grad, wg.grad, bg.grad))
    for a, c in zip(*runs):
        assert torch.equal(a, c)
    dx, dw, db = cake_causal_conv1d_det_train_backward(dy, x, w, b, cu, backend="triton")
    assert torch.equal(runs[0][1], dx) and torch.equal(runs[0][2], dw) and torch.equal(runs[0][3], db)


def test_triton_empty_and_tiny_documents():
    C = 8
    x = torch.zeros(0, C, dtype=torch.bfloat16)
    w = torch.randn(C, 4)
    assert cake_causal_conv1d_det_train_forward(x, w, None, torch.tensor([0, 0], dtype=torch.int32), backend="triton").shape == (0, C)
    x, w, b, dy = make_inputs(6, C, seed=1)
    cu = torch.tensor([0, 1, 1, 3, 6], dtype=torch.int32)
    tri, ref = _both(x, w, b, cu, dy)
    assert _ulp_close(tri[0], ref[0], torch.bfloat16) and _ulp_close(tri[1], ref[1], torch.bfloat16)


def test_triton_row_bits_do_not_depend_on_the_segment_lookup_path():
    """A masked program touching at most 4 segments compares rows with boundaries it loaded once;
    one touching more runs a binary search per row. The same document rows must get the same bits
    either way: the first 10 tokens are cut into documents in several ways (the first program then
    touches 2, 4 (the most for the compare path), 5, 11 segments), and the long document after them
    is the same in every layout.
    """
    S, C, head = 200, 16, 10
    x, w, b, dy = make_inputs(S, C, seed=11)
    heads = ([10], [1, 1, 8], [3, 3, 4], [1, 1, 1, 7], [1] * 10)
    outs = []
    for lens in heads:
        cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist() + [S], dtype=torch.int32)
        assert cu[-2] == head
        y = cake_causal_conv1d_det_train_forward(x, w, b, cu, backend="triton")
        dx = cake_causal_conv1d_det_train_backward(dy, x, w, b, cu, backend="triton")[0]
        assert rel_err(y, causal_conv1d_silu_oracle(x, w, b, cu)) < TOLERANCES[x.dtype]
        assert rel_err(dx, causal_conv1d_silu_oracle_backward(dy, x, w, b, cu)[0]) < TOLERANCES[x.dtype]
        outs.append((y[head:], dx[head:]))
    for lens, (y, dx) in zip(heads[1:], outs[1:]):
        assert torch.equal(y, outs[0][0]), lens
        assert torch.equal(dx, outs[0][1]), lens


def _assert_both_lookups_give_the_same_bits(S, C, W, activation, cuts, seed, monkeypatch):
    """The backward with per-token segment indices and with the binary search over cu (use_ids on and
    off, which walk some programs differently): dx, dweight and dbias within tolerance of float64, and
    the same bits in both (compared as integers: torch.equal takes -0 for +0)."""
    cu = torch.tensor(cuts, dtype=torch.int32)
    assert use_segment_ids(len(cuts) - 1, S, C)  # with use_ids on, the launches read per-token indices
    x, w, b, dy = make_inputs(S, C, seed=seed, width=W)
    outs = []
    for ids in (True, False):
        monkeypatch.setattr(triton_launch, "use_ids", ids)
        outs.append(cake_causal_conv1d_det_train_backward(dy, x, w, b, cu, activation=activation, backend="triton"))
    dxo, dwo, dbo = causal_conv1d_oracle_backward(dy, x, w, b, cu, activation)
    assert rel_err(outs[0][0], dxo) < TOLERANCES[x.dtype] and rel_err(outs[0][1], dwo) < 2e-5
    assert rel_err(outs[0][2], dbo) < 2e-5
    for got, want in zip(outs[1], outs[0]):
        as_int = torch.int16 if got.dtype == torch.bfloat16 else torch.int32
        assert torch.equal(got.view(as_int), want.view(as_int))


@pytest.mark.parametrize("W,activation", [(8, "silu"), (6, None)])
def test_wide_taps_backward_bits_do_not_depend_on_the_walk(W, activation, monkeypatch):
    """From W = 6 on, a masked backward program with per-token indices takes the few-segment walk only
    below 3 segments (below 5 with the binary search): the same rows then go through different walks
    on the two lookup paths, and dx, dweight and dbias must be the same bits. Documents of 35-69
    tokens put 3 or 4 segments in many programs (128 rows and 2 (W - 1) halo rows, in the interpreter).
    """
    S, C, H, rows = 384, 16, W - 1, 128
    cuts = uniform_cuts(S, 35, 70, seed=31)
    spans = [sum(1 for a, z in zip(cuts, cuts[1:]) if a <= min(S - 1, p + rows - 1 + H) and z > max(0, p - H))
             for p in range(0, S, rows)]
    assert {3, 4} & set(spans), spans  # programs that the two paths walk differently
    _assert_both_lookups_give_the_same_bits(S, C, W, activation, cuts, 32, monkeypatch)


def test_many_segment_step_branch_gives_the_masked_walks_bits(monkeypatch):
    """At W = 5 + SiLU a many-segment program with per-token indices away from both ends runs a row
    step whose rows t .. t + H + STEP - 1 lie in one document (in each of its leaves) through the
    unmasked body. Documents of 1-40 tokens give the middle program (rows 256-511: two 128-row
    leaves) both kinds of steps; dx, dweight and dbias must be the bits of the binary-search path,
    which walks every step masked, and match float64."""
    W, activation = 5, "silu"
    S, C, H, leaf, R, step = 768, 16, W - 1, 128, 2, 4
    cuts = uniform_cuts(S, 1, 41, seed=37 + W)
    doc = torch.bucketize(torch.arange(S), torch.tensor(cuts[1:]), right=True)  # document of each row
    p0 = R * leaf
    assert p0 - H >= 0 and p0 + R * leaf - 1 + H < S  # the middle program: no row bounds
    clean = [all(doc[p0 + r * leaf + i] == doc[min(S - 1, p0 + r * leaf + i + H + step - 1)] for r in range(R))
             for i in range(0, leaf, step)]
    assert any(clean) and not all(clean), clean  # both step bodies run
    _assert_both_lookups_give_the_same_bits(S, C, W, activation, cuts, 38, monkeypatch)


@pytest.mark.parametrize("W,activation", [(8, "silu"), (5, None), (3, "silu"), (4, "silu")])
def test_zero_halo_rows_give_the_single_rank_bits_signs_of_zero_included(W, activation):
    """KCP's forward row kernel adds w * 0 for a halo row of zero (a document that starts on the rank),
    as the main kernel's walks add w * 0 for a row of another document. The two must give the same
    bits, signs of zero included (a forward that skipped those taps and kept a bias of -0 would not:
    fma(w0, 0, -0) is -0 for w0 < 0, and w * 0 added to it is +0 for w > 0; benchmarks/NOTES.md,
    section 4, has that forward, measured and dropped). Here the bias is -0 in half the channels,
    with w[0] < 0 there, x is -0 in whole documents (positive taps: every product -0), and 1-5-token
    documents put most rows next to a boundary. Every row rewritten through the row kernel with a
    zero halo equals the main kernel's (compared as integers: torch.equal takes -0 for +0)."""
    S, C, H = 160, 16, W - 1
    gen = torch.Generator().manual_seed(41 + W)
    cuts = [0]
    while cuts[-1] < S:
        cuts.append(min(S, cuts[-1] + int(torch.randint(1, 6, (), generator=gen))))
    cu = torch.tensor(cuts, dtype=torch.int32)
    x = torch.randn(S, C, generator=gen).to(torch.bfloat16)
    for a, z in zip(cuts[::3], cuts[1::3]):
        x[a:z] = -0.0
    w = torch.rand(C, W, generator=gen) + 0.1
    w[::2, 0] *= -1
    b = torch.randn(C, generator=gen)
    b[::2] = -0.0
    y = torch.empty_like(x)
    triton_launch.triton_forward(x, w, b, cu, None, y, activation=activation)
    hist = torch.zeros(len(cuts) - 1, H, C, dtype=x.dtype)
    y_rows = torch.full_like(x, float("nan"))
    triton_launch.triton_forward_rows(x, w, b, cu, hist, torch.arange(S), y_rows, activation=activation)
    assert torch.equal(y_rows.view(torch.int16), y.view(torch.int16))
    y_ref = causal_conv1d_oracle(x, w, b, cu, activation)
    assert rel_err(y, y_ref) < TOLERANCES[x.dtype]


def test_triton_document_bits_do_not_depend_on_where_it_sits():
    """A document's y and dx rows are the same bits wherever it is packed. A masked backward
    program runs its row steps next to a boundary with the masked body and the others with the
    unmasked one; placing the document at offsets around the leaf (64 rows) and step (4 rows)
    edges moves its boundaries over every step position, so a step misjudged clean (or a row
    misplaced) changes bits here.
    """
    L, C = 140, 16
    x_d, w, b, dy_d = make_inputs(L, C, seed=12)
    alone_y = cake_causal_conv1d_det_train_forward(x_d, w, b, torch.tensor([0, L], dtype=torch.int32), backend="triton")
    alone_dx = cake_causal_conv1d_det_train_backward(dy_d, x_d, w, b, torch.tensor([0, L], dtype=torch.int32),
                                                     backend="triton")[0]
    assert rel_err(alone_dx, causal_conv1d_silu_oracle_backward(dy_d, x_d, w, b, torch.tensor([0, L]))[0]) < \
        TOLERANCES[x_d.dtype]
    for off in (1, 2, 3, 5, 58, 59, 61, 62, 63, 64, 65, 67, 124, 126):
        tail = 9 + off % 5  # a second document after it, so its end is a boundary inside the tensor
        x_f, _, _, dy_f = make_inputs(off + tail, C, seed=13 + off)
        x = torch.cat([x_f[:off], x_d, x_f[off:]])
        dy = torch.cat([dy_f[:off], dy_d, dy_f[off:]])
        cu = torch.tensor([0, off, off + L, off + L + tail], dtype=torch.int32)
        y = cake_causal_conv1d_det_train_forward(x, w, b, cu, backend="triton")
        dx = cake_causal_conv1d_det_train_backward(dy, x, w, b, cu, backend="triton")[0]
        assert torch.equal(y[off:off + L], alone_y), off
        assert torch.equal(dx[off:off + L], alone_dx), off
        assert rel_err(dx, causal_conv1d_silu_oracle_backward(dy, x, w, b, cu)[0]) < TOLERANCES[x.dtype], off


@pytest.mark.parametrize("width", [48, 44])
def test_triton_row_strided_inputs_give_the_contiguous_bits(width):
    """x and dy as column slices of wider tensors (a fused projection's output: row stride = width,
    a compile-time constant of the kernels; 44 is not a multiple of 8, so the op copies first):
    the same bits as contiguous inputs."""
    S, C = 150, 16
    x, w, b, dy = make_inputs(S, C, seed=12)
    cu = torch.tensor([0, 40, 41, S], dtype=torch.int32)
    x_wide = torch.zeros(S, width, dtype=x.dtype)
    dy_wide = torch.zeros(S, width, dtype=dy.dtype)
    x_wide[:, 8:8 + C] = x
    dy_wide[:, 8:8 + C] = dy
    x_s, dy_s = x_wide[:, 8:8 + C], dy_wide[:, 8:8 + C]
    assert x_s.stride(0) == width
    y = cake_causal_conv1d_det_train_forward(x, w, b, cu, backend="triton")
    assert torch.equal(cake_causal_conv1d_det_train_forward(x_s, w, b, cu, backend="triton"), y)
    ref = cake_causal_conv1d_det_train_backward(dy, x, w, b, cu, backend="triton")
    got = cake_causal_conv1d_det_train_backward(dy_s, x_s, w, b, cu, backend="triton")
    for r, g in zip(ref, got):
        assert torch.equal(r, g)


@pytest.mark.parametrize("use_ids,leads", [(True, (0, 37, 129)), (False, (0, 129))], ids=["segment_ids", "search"])
def test_short_documents_give_the_same_bits_in_middle_and_end_programs(use_ids, leads, monkeypatch):
    """Forward programs of many segments away from both ends of the rows (short documents in the
    middle of a long batch) skip every row-bounds check; those at either end keep them (so does
    every masked backward program today). A document's y and dx rows must not depend on which kind
    of program computes them: the same short documents are packed after lead-ins of 0, 37 and 129
    one-token documents (0 and 129 for the binary-search lookup), which moves each of them across
    forward programs (16 rows in the interpreter), backward programs (two leaves, 128 rows) and
    both ends. Backward programs [128, 256) and [256, 384) of S >= 387 are middle ones.
    """
    C = 8
    gen = torch.Generator().manual_seed(21)
    lens = torch.randint(1, 9, (100,), generator=gen).tolist()  # uniform 1-8: about 450 tokens
    L = sum(lens)
    x_d, w, b, dy_d = make_inputs(L, C, seed=22)
    monkeypatch.setattr(triton_launch, "use_ids", use_ids)
    ref = None
    for lead in leads:
        x_l, _, _, dy_l = make_inputs(lead + 5, C, seed=23 + lead)
        x = torch.cat([x_l[:lead], x_d, x_l[lead:]])
        dy = torch.cat([dy_l[:lead], dy_d, dy_l[lead:]])
        cu = torch.tensor([0] + list(range(1, lead + 1)) + [lead + v for v in torch.tensor(lens).cumsum(0).tolist()]
                          + [lead + L + 5], dtype=torch.int32)
        assert x.shape[0] >= 387
        y = cake_causal_conv1d_det_train_forward(x, w, b, cu, backend="triton")
        dx, dw, db = cake_causal_conv1d_det_train_backward(dy, x, w, b, cu, backend="triton")
        dx_o, dw_o, db_o = causal_conv1d_silu_oracle_backward(dy, x, w, b, cu)
        assert rel_err(y, causal_conv1d_silu_oracle(x, w, b, cu)) < TOLERANCES[x.dtype], lead
        assert rel_err(dx, dx_o) < TOLERANCES[x.dtype], lead
        assert rel_err(dw, dw_o) < 1e-5 and rel_err(db, db_o) < 1e-5, lead
        rows = (y[lead:lead + L], dx[lead:lead + L])
        if ref is None:
            ref = rows
        else:
            assert torch.equal(rows[0], ref[0]), f"y, lead-in {lead}"
            assert torch.equal(rows[1], ref[1]), f"dx, lead-in {lead}"


def _twin_flags(launches) -> list:
    """1 for each launch of a quick twin, 0 for each of a kernel that has one, in order."""
    return [int(r.kernel in triton_launch.QUICK_KERNELS) for r in launches
            if r.kernel in triton_launch.QUICK_KERNELS + triton_launch.WITH_TWINS]


def _fwd_bwd_launched(S, C, x, w, b, cu, seq_len, dy, width, activation, quick, configs=(None, None), pad=0):
    """(y, dx, dw, db) from the prepared forward and backward launches (``quick``: their quick twins;
    ``configs``: the full kernels' (forward, backward) configurations; ``pad``: x, y, dy and dx are
    column slices of rows C + pad wide)."""
    b_dt, cu_dt, n_cu = triton_launch.optional_meta(b, cu)
    rows = lambda t: torch.zeros(S, C + pad, dtype=t.dtype)[:, :C].copy_(t)  # noqa: E731
    x, dy = rows(x), rows(dy)
    st = C + pad
    fwd = triton_launch.prepare_forward(S, C, st, st, x.dtype, w.dtype, b_dt, cu_dt, n_cu, seq_len, config=configs[0],
                                        width=width, activation=activation, quick=quick)
    y = rows(x)
    with triton_launch.record_launches(launch=True) as launches:
        fwd.run(x, w, b, cu, y)
    bwd = triton_launch.prepare_backward(S, C, st, st, st, x.dtype, dy.dtype, w.dtype, b_dt, cu_dt, n_cu, seq_len,
                                         torch.float32, config=configs[1], width=width, activation=activation,
                                         quick=quick)
    dx, dw = rows(x), torch.full((C, width), float("nan"))
    db = torch.full((C,), float("nan")) if b is not None else None
    ws = torch.full((triton_launch.backward_workspace_floats(S, C, width),), float("nan"))
    with triton_launch.record_launches(launch=True) as bwd_launches:
        bwd.run(dy, x, w, b, cu, dx, ws, dw, db)
    assert set(_twin_flags(launches + bwd_launches)) == {int(quick)}
    return y.contiguous(), dx.contiguous(), dw, db


# (S, C, W, activation, bias, documents, per-token indices, padding of the twins' rows): packed short and
# long documents (the paths of few and of many segments, with and without per-token indices) and
# [B, T, C] rows of T = 50 (no cu_seqlens). The main kernel of several groups runs the one-group
# kernel's body (it calls it). The full kernels run another configuration than the twins' (fewer rows
# and channels per program), and the twins read rows further apart than C in two cases (their strides
# are arguments).
QUICK_CASES = [(200, 16, 4, "silu", True, "mixed", True, 0), (200, 16, 4, "silu", True, "mixed", False, 24),
               (150, 8, 8, None, False, "mixed", True, 8), (200, 8, 3, "silu", False, "rows of 50", False, 0)]
_OTHER_CONFIGS = (FwdConfig(R=1, SUB=8, BC=8, num_warps=1), BwdConfig(R=1, BC=8, num_warps=1))


@pytest.mark.parametrize("S,C,W,activation,bias,docs,use_ids,pad", QUICK_CASES)
def test_triton_quick_twins_give_the_full_kernels_bits(S, C, W, activation, bias, docs, use_ids, pad, monkeypatch):
    """The quick twins a first training step runs while the full kernels compile (compile_ahead.py:
    one path for every program, the masked walk of many segments with row bounds, one stage; the row
    strides as arguments, one configuration for every C) compute the full kernels' bits, y, dx,
    dweight and dbias, whichever paths the full kernels' programs take, at another configuration and
    row stride than the full kernels'."""
    monkeypatch.setattr(triton_launch, "use_ids", use_ids)
    x, w, b, dy = make_inputs(S, C, seed=S + W, width=W, bias=bias)
    if docs == "mixed":
        cu, seq_len = random_cu_seqlens(S, torch.Generator().manual_seed(S + W)), None
    else:
        cu, seq_len = None, 50
    full = _fwd_bwd_launched(S, C, x, w, b, cu, seq_len, dy, W, activation, quick=False, configs=_OTHER_CONFIGS)
    quick = _fwd_bwd_launched(S, C, x, w, b, cu, seq_len, dy, W, activation, quick=True, pad=pad)
    for name, f, q in zip(("y", "dx", "dw", "db"), full, quick):
        assert (f is None and q is None) or torch.equal(f, q), name


def _training_step_quick_flags(x, w, b, dy, cu):
    """One autograd fwd+bwd on the Triton backend: (``_twin_flags`` of its forward and backward
    launches, and its (y, dx, dw, db))."""
    xr, wr, br = (t.detach().clone().requires_grad_(True) for t in (x, w, b))
    with triton_launch.record_launches(launch=True) as launches:
        y = cake_causal_conv1d_det(xr, wr, br, cu_seqlens=cu, backend="triton")
        y.backward(dy)
    return _twin_flags(launches), (y.detach(), xr.grad, wr.grad, br.grad)


def test_triton_plan_runs_the_quick_twins_until_the_full_kernels_are_ready():
    """A plan told to run early (compile_ahead.py, while the full variants compile) launches the quick
    twins of its forward and of its backward (prepared before and after it was told), then, once the
    event is set, its own kernels; the bits of every step are the same."""
    import threading

    from cakeconv.cake_causal_conv1d_det_train_backend import conv

    S, C = 150, 16
    x, w, b, dy = make_inputs(S, C, seed=31)
    cu = torch.tensor([0, 40, 41, S], dtype=torch.int32)
    conv._plans.clear()

    def step():
        return _training_step_quick_flags(x, w, b, dy, cu)

    flags, want = step()  # (no compile ahead on the CPU: the plan's own kernels)
    assert flags == [0, 0]
    plan = conv._plans[conv.signature(x, w, b, cu, "triton")]
    ready = threading.Event()
    plan.run_early_until(ready)  # the backward launches were prepared already, the forward's too
    for _ in range(2):
        flags, got = step()
        assert flags == [1, 1] and all(torch.equal(a, c) for a, c in zip(want, got))
    ready.set()
    flags, got = step()
    assert flags == [0, 0] and all(torch.equal(a, c) for a, c in zip(want, got))
    assert plan.fwd.early is None
    conv._plans.clear()


def test_triton_first_steps_run_the_twins_until_the_background_compile_ends(monkeypatch, tmp_path):
    """The whole quick tier on the interpreted kernels (compile_ahead.py, with the problem, the compile
    and the background warm-up stood in: the CPU has no CUDA device and the interpreter compiles
    nothing): the first training steps of a problem launch the quick twins while the full variants'
    warm-up runs; once it ends, the same plan and a new one launch the full kernels; every step's
    bits are the same."""
    import threading

    from cakeconv.cake_causal_conv1d_det_train_backend import compile_ahead, conv
    from cakeconv.warmup import WarmupProblem, wait_for_kernels

    release, compiles, spawned = threading.Event(), [], []

    def compile_items(items, target, n_threads):
        compiles.append(threading.current_thread() is threading.main_thread())

    def spawn_warmup(problem, target, n, tokens=None):
        spawned.append((problem, tokens))
        return FakeWarmup(release=release)  # the background process, until released

    monkeypatch.setattr(compile_ahead, "_states", {})
    monkeypatch.setattr(compile_ahead, "_twins_compiled", set())
    monkeypatch.setattr(compile_ahead, "problem_of", lambda plan: WarmupProblem(16, bias=True))
    monkeypatch.setattr(compile_ahead, "training_step_items", lambda problem, target, tokens=None: ([], []))
    monkeypatch.setattr(compile_ahead, "marker_path", lambda *args: str(tmp_path / "no_marker"))
    monkeypatch.setattr(compile_ahead, "write_marker", lambda *args: None)
    monkeypatch.setattr(compile_ahead, "compile_items", compile_items)
    monkeypatch.setattr(compile_ahead, "spawn_warmup", spawn_warmup)
    monkeypatch.setattr(compile_ahead, "_children", [])
    monkeypatch.setattr(compile_ahead, "_twin_threads", [])
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    monkeypatch.setenv(compile_ahead.ENV_THREADS, "2")
    monkeypatch.delenv(compile_ahead.ENV_QUICK, raising=False)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    conv._plans.clear()
    S, C = 150, 16
    x, w, b, dy = make_inputs(S, C, seed=32)

    def step(cu):
        return _training_step_quick_flags(x, w, b, dy, cu)

    cu = torch.tensor([0, 40, 41, S], dtype=torch.int32)
    flags, want = step(cu)
    # the forward's twins compiled in the launching thread, the backward's in a thread of their own
    assert flags == [1, 1] and sorted(compiles) == [False, True] and len(spawned) == 1 and not wait_for_kernels(0)
    flags, got = step(cu)
    assert flags == [1, 1] and all(torch.equal(a, c) for a, c in zip(want, got))
    release.set()
    assert wait_for_kernels(10)
    flags, got = step(cu)
    assert flags == [0, 0] and all(torch.equal(a, c) for a, c in zip(want, got))
    other = torch.tensor([0, 60, S], dtype=torch.int32)  # a new plan of the same problem, after the switch
    flags, _ = step(other)
    assert flags == [0, 0] and len(compiles) == 2 and len(spawned) == 1  # nothing compiled again
    conv._plans.clear()


def test_the_interpreter_patches_the_language_once_per_launch(monkeypatch):
    """tests/interpreter_patch_once.py (installed by conftest): a forward launch, whose kernel calls
    @triton.jit helpers per row and per tap, patches triton.language once for the launch and once more
    for the first of Triton's own helpers (which see triton.language.core), instead of once per helper
    call, and computes what it computed before (the oracle's y)."""
    from triton.runtime import interpreter

    from tests import interpreter_patch_once

    assert interpreter._patch_lang._patches_once
    triton_patch_lang = interpreter._patch_lang.original
    calls = []

    def counting(fn):
        calls.append(fn.__name__)
        return triton_patch_lang(fn)

    S, C = 40, 16
    x, w, b, _ = make_inputs(S, C, seed=31)
    cu = torch.tensor([0, 3, 17, S], dtype=torch.int32)
    monkeypatch.setattr(interpreter, "_patch_lang", counting)
    interpreter_patch_once.install()  # wraps the counting function: the count is what reaches Triton's own
    y = torch.empty_like(x)
    triton_launch.triton_forward(x, w, b, cu, None, y)
    assert calls[0] == "cake_conv_fwd_kernel" and len(calls) == 2, calls[:5]
    assert not interpreter_patch_once._active
    assert rel_err(y, causal_conv1d_silu_oracle(x, w, b, cu)) < TOLERANCES[x.dtype]
