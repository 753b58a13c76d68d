"""Tier 4: the compiled Triton kernels on a CUDA GPU (run on the GPU machine).

Large shapes are checked against the FP32 reference backend run on the same GPU (same math,
different rounding: FMA vs separate multiply-add) and, on a subset of channels, against the
float64 oracle (the conv is depthwise, so a channel subset is the same problem).
"""

import pytest
import torch

from cakeconv import (
    cake_causal_conv1d_det,
    cake_causal_conv1d_det_train_backward,
    cake_causal_conv1d_det_train_backward_workspace_bytes,
    cake_causal_conv1d_det_train_forward,
)
from cakeconv.cake_causal_conv1d_det_train_backend.kernels import backward as triton_backward, launch as triton_launch, tuning
from cakeconv.oracle import (causal_conv1d_oracle, causal_conv1d_oracle_backward, causal_conv1d_silu_oracle,
                             causal_conv1d_silu_oracle_backward)
from tests.helpers import TOLERANCES, backward_tree_from_nodes, rel_err

pytestmark = pytest.mark.gpu
DEV = "cuda"


def _random_docs(S, gen, mean=3000):
    """Random packed document boundaries (int32 on the GPU) with some 1-3 token documents."""
    cuts = [0]
    while cuts[-1] < S:
        r = torch.rand((), generator=gen).item()
        n = int(torch.randint(0, 4, (), generator=gen)) if r < 0.2 else int(torch.randint(4, 2 * mean, (), generator=gen))
        cuts.append(min(S, cuts[-1] + n))
    return torch.tensor(cuts, dtype=torch.int32, device=DEV)


def _inputs(S, C, seed, dtype=torch.bfloat16, wdtype=torch.float32, width=4):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(S, C, generator=gen, device=DEV).to(dtype)
    dy = torch.randn(S, C, generator=gen, device=DEV).to(dtype)
    w = (torch.randn(C, width, generator=gen, device=DEV) * 0.5).to(wdtype)
    b = (torch.randn(C, generator=gen, device=DEV) * 0.5).to(wdtype)
    return x, w, b, dy


def _reference_by_channel_blocks(x, w, b, dy, cu, block=1024, activation="silu"):
    """(y, dx, dweight, dbias) of the reference backend, run on ``block`` channels at a time.

    The conv is depthwise, so each block is the same problem on its channels. Whole, the reference
    holds about 13 FP32 temporaries of x's size: 112 GiB at S = 262,144, C = 8,192, which ran the
    other test workers on the GPU out of memory; by blocks, 1/8 of that.
    """
    outs = []
    for c0 in range(0, x.shape[1], block):
        cs = slice(c0, c0 + block)
        x_b, dy_b = x[:, cs].contiguous(), dy[:, cs].contiguous()
        y_b = cake_causal_conv1d_det_train_forward(x_b, w[cs], b[cs], cu, activation=activation, backend="reference")
        outs.append((y_b, *cake_causal_conv1d_det_train_backward(dy_b, x_b, w[cs], b[cs], cu, activation=activation,
                                                                 backend="reference")))
    y, dx, dw, db = (torch.cat(parts, dim=1 if i < 2 else 0) for i, parts in enumerate(zip(*outs)))
    return y, dx, dw, db


# Grid rationale: the seed's largest S at the smallest, a middle and the largest C; C = 1160 is
# not a multiple of the channel block (masked channels); S = 4099 is short and odd.
@pytest.mark.parametrize("S,C", [(262144, 128), (250340, 1160), (262144, 8192), (4099, 24)])
def test_gpu_matches_reference_and_oracle(S, C):
    gen = torch.Generator().manual_seed(S + C)
    cu = _random_docs(S, gen)
    x, w, b, dy = _inputs(S, C, seed=C)
    y = cake_causal_conv1d_det_train_forward(x, w, b, cu)
    y_ref, dx_r, dw_r, db_r = _reference_by_channel_blocks(x, w, b, dy, cu)
    assert rel_err(y, y_ref) < TOLERANCES[torch.bfloat16]
    dx, dw, db = cake_causal_conv1d_det_train_backward(dy, x, w, b, cu)
    assert rel_err(dx, dx_r) < TOLERANCES[torch.bfloat16]
    assert rel_err(dw, dw_r) < 1e-5 and rel_err(db, db_r) < 1e-5
    # float64 oracle on 16 channels (a depthwise conv: the same problem restricted to them).
    cols = torch.arange(0, C, max(1, C // 16), device=DEV)[:16]
    xs, dys, ws_, bs = x[:, cols].cpu(), dy[:, cols].cpu(), w[cols].cpu(), b[cols].cpu()
    cu_c = cu.cpu()
    assert rel_err(y[:, cols], causal_conv1d_silu_oracle(xs, ws_, bs, cu_c)) < TOLERANCES[torch.bfloat16]
    dxo, dwo, dbo = causal_conv1d_silu_oracle_backward(dys, xs, ws_, bs, cu_c)
    assert rel_err(dx[:, cols], dxo) < TOLERANCES[torch.bfloat16]
    assert rel_err(dw[cols], dwo) < 1e-5 and rel_err(db[cols], dbo) < 1e-5
    # bitwise determinism across calls
    y2 = cake_causal_conv1d_det_train_forward(x, w, b, cu)
    dx2, dw2, db2 = cake_causal_conv1d_det_train_backward(dy, x, w, b, cu)
    assert torch.equal(y, y2) and torch.equal(dx, dx2) and torch.equal(dw, dw2) and torch.equal(db, db2)


EVERY_CONFIG_S = 100003  # rows of test_gpu_every_config_gives_the_same_bits (odd: a partial last program)

# Other widths and no activation (SPEC 1b): the seed mix and 1-8-token documents (the per-token
# segment-index path), C = 512 (the fast masked-loop branch) and 1160 (masked channels).
@pytest.mark.parametrize("W,activation", [(2, "silu"), (3, None), (5, "silu"), (7, None), (8, "silu"), (8, None),
                                          (4, None)])
@pytest.mark.parametrize("S,C,mean", [(250340, 512, 3000), (100003, 1160, 4)])
def test_gpu_widths_match_reference_and_oracle_and_repeat_bitwise(S, C, mean, W, activation):
    gen = torch.Generator().manual_seed(S + W)
    cu = _random_docs(S, gen, mean=mean)
    x, w, b, dy = _inputs(S, C, seed=W, width=W)
    y = cake_causal_conv1d_det_train_forward(x, w, b, cu, activation=activation)
    dx, dw, db = cake_causal_conv1d_det_train_backward(dy, x, w, b, cu, activation=activation)
    assert dw.shape == (C, W)
    y_ref, dx_r, dw_r, db_r = _reference_by_channel_blocks(x, w, b, dy, cu, activation=activation)
    assert rel_err(y, y_ref) < TOLERANCES[torch.bfloat16] and rel_err(dx, dx_r) < TOLERANCES[torch.bfloat16]
    assert rel_err(dw, dw_r) < 1e-5 and rel_err(db, db_r) < 1e-5
    cols = torch.arange(0, C, C // 16, device=DEV)[:16]
    xs, dys, ws_, bs, cu_c = x[:, cols].cpu(), dy[:, cols].cpu(), w[cols].cpu(), b[cols].cpu(), cu.cpu()
    assert rel_err(y[:, cols], causal_conv1d_oracle(xs, ws_, bs, cu_c, activation)) < TOLERANCES[torch.bfloat16]
    dxo, dwo, dbo = causal_conv1d_oracle_backward(dys, xs, ws_, bs, cu_c, activation)
    assert rel_err(dx[:, cols], dxo) < TOLERANCES[torch.bfloat16] and rel_err(dw[cols], dwo) < 1e-4
    y2 = cake_causal_conv1d_det_train_forward(x, w, b, cu, activation=activation)
    dx2, dw2, db2 = cake_causal_conv1d_det_train_backward(dy, x, w, b, cu, activation=activation)
    assert torch.equal(y, y2) and torch.equal(dx, dx2) and torch.equal(dw, dw2) and torch.equal(db, db2)
    # every configuration the tuner may pick at this width gives the same bits (fixed summation order;
    # W = 4 + SiLU's every listed configuration: test_gpu_every_config_gives_the_same_bits)
    fwd_configs, bwd_configs = tuning.configs_at_width(W)
    for cfg in fwd_configs:
        y_cfg = torch.full_like(x, float("nan"))
        triton_launch.triton_forward(x, w, b, cu, None, y_cfg, config=cfg, activation=activation)
        assert torch.equal(y_cfg, y), cfg
    for cfg in bwd_configs:
        for a, c in zip(_backward_with(dy, x, w, b, cu, cfg, activation), (dx, dw, db)):
            assert torch.equal(a, c), cfg


# One test item per (C, configuration): each item compiles one configuration's kernels, so xdist
# spreads the compiles over its workers (one item per C compiled 14 in one worker, minutes cold).
_CONFIGS = [("fwd", cfg) for cfg in tuning.FWD_CONFIGS] + [("bwd", cfg) for cfg in tuning.BWD_CONFIGS]
_CONFIG_IDS = [f"fwd{i}" for i in range(len(tuning.FWD_CONFIGS))] + [f"bwd{i}" for i in range(len(tuning.BWD_CONFIGS))]


def _backward_with(dy, x, w, b, cu, cfg, activation="silu"):
    """(dx, dw, db) of the Triton backward under configuration cfg (None: the tuner's pick),
    every output and the workspace filled with NaN first."""
    S, C = x.shape
    W = w.shape[1]
    dx = torch.full_like(x, float("nan"))
    dw = torch.full((C, W), float("nan"), device=DEV)
    db = torch.full((C,), float("nan"), device=DEV)
    ws = torch.full((triton_launch.backward_workspace_floats(S, C, W),), float("nan"), device=DEV)
    triton_launch.triton_backward(dy, x, w, b, cu, None, dx, ws, dw, db, config=cfg, activation=activation)
    return dx, dw, db


@pytest.mark.parametrize("pass_,cfg", _CONFIGS, ids=_CONFIG_IDS)
@pytest.mark.parametrize("C", [128, 1160, 4096])
def test_gpu_every_config_gives_the_same_bits(C, pass_, cfg):
    """Forward or backward under one configuration the tuner may choose: the bits of the tuner's
    pick (every configuration against the pick: all of them give the same bits)."""
    S = EVERY_CONFIG_S
    cu = _random_docs(S, torch.Generator().manual_seed(C), mean=700)
    x, w, b, dy = _inputs(S, C, seed=3)
    if pass_ == "fwd":
        y_pick, y = torch.full_like(x, float("nan")), torch.full_like(x, float("nan"))
        triton_launch.triton_forward(x, w, b, cu, None, y_pick)
        triton_launch.triton_forward(x, w, b, cu, None, y, config=cfg)
        assert torch.equal(y, y_pick), cfg
    else:
        for a, c in zip(_backward_with(dy, x, w, b, cu, cfg), _backward_with(dy, x, w, b, cu, None)):
            assert torch.equal(a, c), cfg


@pytest.mark.parametrize("cfg", tuning.BWD_CONFIGS, ids=[f"bwd{i}" for i in range(len(tuning.BWD_CONFIGS))])
@pytest.mark.parametrize("C", [256, 1160])
def test_gpu_document_bits_do_not_depend_on_where_it_sits(C, cfg):
    """A document's dx rows are the same bits at every offset around the leaf (64 rows) and
    program (128-512 rows) edges, under each backward configuration (one test item each, so the
    compiles spread over the workers): the masked programs' row steps away from a boundary take
    the unmasked body, the ones next to it the masked body. The forward's rows too."""
    L = 1000
    x_d, w, b, dy_d = _inputs(L, C, seed=21)
    cu_alone = torch.tensor([0, L], dtype=torch.int32, device=DEV)
    y_alone = cake_causal_conv1d_det_train_forward(x_d, w, b, cu_alone)
    dx_alone = cake_causal_conv1d_det_train_backward(dy_d, x_d, w, b, cu_alone)[0]
    for off in (1, 3, 5, 58, 61, 62, 63, 64, 65, 67, 125, 127, 128, 131, 253, 255, 256, 259, 509, 512, 515):
        tail = 300 + off % 7
        x_f, _, _, dy_f = _inputs(off + tail, C, seed=22 + off)
        x = torch.cat([x_f[:off], x_d, x_f[off:]])
        dy = torch.cat([dy_f[:off], dy_d, dy_f[off:]])
        cu = torch.tensor([0, off, off + L, off + L + tail], dtype=torch.int32, device=DEV)
        y = cake_causal_conv1d_det_train_forward(x, w, b, cu)
        assert torch.equal(y[off:off + L], y_alone), off
        dx = _backward_with(dy, x, w, b, cu, cfg)[0]
        assert torch.equal(dx[off:off + L], dx_alone), (off, cfg)


@pytest.mark.parametrize("cfg", tuning.BWD_CONFIGS, ids=[f"bwd{i}" for i in range(len(tuning.BWD_CONFIGS))])
def test_gpu_dweight_tree_is_the_documented_order_every_time(cfg):
    """S = 600,000: 74 groups of 8192 rows (the last partial) in two blocks of 64 groups. Under one
    backward configuration (a test item each, so that pytest-xdist spreads their compiles), and for
    4 repeated calls of the pick, the group sums, dweight and dbias are the bits of the documented
    order redone on the host with torch adds from the nodes the backward kernel wrote (a wrong node
    range, group size or block order changes them), and dx, dweight and dbias are the pick's bits."""
    S, C = 600000, 256
    cu = _random_docs(S, torch.Generator().manual_seed(17))
    x, w, b, dy = _inputs(S, C, seed=17)
    n_ws = triton_launch.backward_workspace_floats(S, C)
    n_leaves, n_groups = -(-S // triton_backward.BWD_SUB), -(-S // 8192)
    pick = tuning.pick_bwd_config(C, 2, False)
    results = []
    for cfg in [cfg] + [pick] * 4:
        dx = torch.full_like(x, float("nan"))
        dw = torch.full((C, 4), float("nan"), device=DEV)
        db = torch.full((C,), float("nan"), device=DEV)
        ws = torch.full((n_ws,), float("nan"), device=DEV)
        triton_launch.triton_backward(dy, x, w, b, cu, None, dx, ws, dw, db, config=cfg)
        gs, dw_host, db_host = backward_tree_from_nodes(ws, S, C, cfg.R)
        assert torch.equal(ws[n_leaves * 5 * C:(n_leaves + n_groups) * 5 * C].view(n_groups, 5, C), gs), cfg
        assert torch.equal(dw, dw_host) and torch.equal(db, db_host), cfg
        results.append((dx, dw, db))
    assert all(torch.equal(a, c) for r in results[1:] for a, c in zip(results[0], r))


@pytest.mark.parametrize("S", [700, 8192])
def test_gpu_one_group_dweight_is_the_documented_order(S):
    """S <= 8192 (one group): one launch, the one-group kernel, whose last program of each channel
    block (by ticket) writes dweight/dbias. Under two backward configurations and the pick, in FP32
    and bf16, with and without bias, they are the bits of the documented order redone on the host
    from the nodes the backward wrote, and the ticket counters are back at 0 after each launch."""
    C = 256
    cu = _random_docs(S, torch.Generator().manual_seed(S))
    x, w, b, dy = _inputs(S, C, seed=S)
    n_ws = triton_launch.backward_workspace_floats(S, C)
    pick = tuning.pick_bwd_config(C, 2, False)
    cases = [(pick, True, torch.float32), (pick, False, torch.bfloat16)]
    cases += [(cfg, True, torch.float32) for cfg in list(tuning.BWD_CONFIGS)[:2]]
    for cfg, bias, dw_dtype in cases:
        bb = b if bias else None
        dx = torch.full_like(x, float("nan"))
        dw = torch.full((C, 4), float("nan"), device=DEV, dtype=dw_dtype)
        db = torch.full((C,), float("nan"), device=DEV, dtype=dw_dtype) if bias else None
        ws = torch.full((n_ws,), float("nan"), device=DEV)
        with triton_launch.record_launches(launch=True) as launches:
            triton_launch.triton_backward(dy, x, w, bb, cu, None, dx, ws, dw, db, config=cfg)
        assert [r.kernel.name for r in launches] == ["cake_conv_bwd_one_group_kernel"], cfg
        assert not launches[0].args[11].any(), cfg  # every ticket counter reset
        _, dw_host, db_host = backward_tree_from_nodes(ws, S, C, cfg.R)
        assert torch.equal(dw, dw_host.to(dw_dtype)), (cfg, dw_dtype)
        if bias:
            assert torch.equal(db, db_host.to(dw_dtype)), (cfg, dw_dtype)


def test_gpu_one_group_tickets_under_load_and_on_two_streams():
    """The one-group kernel's tickets under load: S = 8192 at C = 4096 (32 channel blocks of 32
    programs each), 20 calls back to back on each of two streams at once (each stream its own
    counters), every call's dweight/dbias the bits of the documented order from its own nodes (a
    program that added before every node was written, or two launches sharing counters, would
    change them)."""
    S, C = 8192, 4096
    cu = _random_docs(S, torch.Generator().manual_seed(21))
    n_ws = triton_launch.backward_workspace_floats(S, C)
    cfg = tuning.pick_bwd_config(C, 2, False)
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    inputs = [_inputs(S, C, seed=21 + i) for i in range(2)]
    torch.cuda.synchronize()
    runs = []
    for _ in range(20):
        for st, (x, w, b, dy) in zip(streams, inputs):
            with torch.cuda.stream(st):
                dx, dw, db = torch.empty_like(x), torch.empty((C, 4), device=DEV), torch.empty((C,), device=DEV)
                ws = torch.empty((n_ws,), device=DEV)
                triton_launch.triton_backward(dy, x, w, b, cu, None, dx, ws, dw, db, config=cfg)
                runs.append((st, ws, dw, db))
    torch.cuda.synchronize()
    first = {}
    for st, ws, dw, db in runs:
        _, dw_host, db_host = backward_tree_from_nodes(ws, S, C, cfg.R)
        assert torch.equal(dw, dw_host) and torch.equal(db, db_host)
        ref = first.setdefault(id(st), (dw, db))
        assert torch.equal(dw, ref[0]) and torch.equal(db, ref[1])


def test_gpu_uniform_batch_and_dtypes():
    B, T, C = 4, 5003, 256
    for dtype, wdtype in [(torch.bfloat16, torch.float32), (torch.float16, torch.bfloat16), (torch.float32, torch.float32)]:
        x, w, b, dy = _inputs(B * T, C, seed=5, dtype=dtype, wdtype=wdtype)
        cu = torch.arange(0, B * T + 1, T, dtype=torch.int32, device=DEV)
        y_p = cake_causal_conv1d_det_train_forward(x, w, b, cu)
        y_u = cake_causal_conv1d_det_train_forward(x.view(B, T, C), w, b)
        assert torch.equal(y_u.view(B * T, C), y_p)
        y_r = cake_causal_conv1d_det_train_forward(x, w, b, cu, backend="reference")
        assert rel_err(y_p, y_r) < TOLERANCES[dtype]
        g_p = cake_causal_conv1d_det_train_backward(dy, x, w, b, cu)
        g_u = cake_causal_conv1d_det_train_backward(dy.view(B, T, C), x.view(B, T, C), w, b)
        assert all(torch.equal(a.reshape(-1), c.reshape(-1)) for a, c in zip(g_p, g_u))


def test_gpu_workspace_path_allocates_nothing():
    S, C = 65536, 1024
    cu = _random_docs(S, torch.Generator().manual_seed(1))
    x, w, b, dy = _inputs(S, C, seed=2)
    out = torch.empty_like(x)
    dx = torch.empty_like(x)
    ws = torch.empty(cake_causal_conv1d_det_train_backward_workspace_bytes(S, C), dtype=torch.uint8, device=DEV)
    cake_causal_conv1d_det_train_forward(x, w, b, cu, out=out)  # warm-up: compile, validate cu
    cake_causal_conv1d_det_train_backward(dy, x, w, b, cu, dx=dx, workspace=ws)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    cake_causal_conv1d_det_train_forward(x, w, b, cu, out=out)
    _, dw, db = cake_causal_conv1d_det_train_backward(dy, x, w, b, cu, dx=dx, workspace=ws)
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() == before
    ref = cake_causal_conv1d_det_train_backward(dy, x, w, b, cu)
    assert torch.equal(dx, ref[0]) and torch.equal(dw, ref[1]) and torch.equal(db, ref[2])


def test_gpu_autograd_saves_only_inputs_and_small_backward_peak():
    S, C = 250340, 2048
    cu = _random_docs(S, torch.Generator().manual_seed(3))
    x, w, b, dy = _inputs(S, C, seed=4)
    x.requires_grad_(True)
    w.requires_grad_(True)
    b.requires_grad_(True)
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = cake_causal_conv1d_det(x, w, b, cu_seqlens=cu)
    assert {t.data_ptr() for t in saved} == {x.data_ptr(), w.data_ptr(), b.data_ptr(), cu.data_ptr()}
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    y.backward(dy)
    torch.cuda.synchronize()
    dx_bytes = x.numel() * x.element_size()
    n_blocks = triton_launch.backward_workspace_floats(S, C) // (5 * C)
    extra = torch.cuda.max_memory_allocated() - base - dx_bytes - 2 * (w.numel() + b.numel()) * 4
    # Beyond dx (and the tiny dweight/dbias), only the FP32 partials: 5 * C floats per token block.
    assert extra <= 4 * 5 * C * n_blocks + (1 << 20), (extra, n_blocks)


@pytest.mark.parametrize("max_len", [1, 8, 64])
@pytest.mark.parametrize("C", [128, 512, 1160])
def test_gpu_segment_indices_give_the_search_bits(max_len, C):
    """Short documents: the kernels place rows by per-token segment indices (kernels/segment_ids.py);
    with them switched off, by a binary search over cu. Every output is the same bits either way,
    at the GPU's configurations (the interpreter tier checks its own small ones)."""
    S = 50021
    g = torch.Generator().manual_seed(max_len + C)
    lens = torch.randint(0 if max_len > 1 else 1, max_len + 1, (S,), generator=g)
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)]).clamp_max(S)
    cu = cu[: int((cu == S).nonzero()[0]) + 1].to(torch.int32).to(DEV)
    x, w, b, dy = _inputs(S, C, seed=max_len)
    outs = []
    for use in (True, False):
        triton_launch.use_ids = use
        try:
            y = cake_causal_conv1d_det_train_forward(x, w, b, cu)
            outs.append((y,) + tuple(cake_causal_conv1d_det_train_backward(dy, x, w, b, cu)))
        finally:
            triton_launch.use_ids = True
    for name, a, c in zip(("y", "dx", "dweight", "dbias"), *outs):
        assert torch.equal(a, c), name
    assert rel_err(outs[0][0], causal_conv1d_silu_oracle(x, w, b, cu)) < TOLERANCES[x.dtype]
