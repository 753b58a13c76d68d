"""cakeconv.integrations.dao: causal-conv1d 1.7.0's API on cakeconv's op, and its PyTorch fallbacks.

Tiers (cheapest first):

1. CPU (CI; causal-conv1d does not build here): the cakeconv path (reference backend) against the
   float64 oracle ``cakeconv.oracle`` (seq_idx turned into document boundaries on the host), for
   W = 2, 3, 4, 5, 8, SiLU and no activation, both layouts, fp32 and bf16, with and without bias
   and seq_idx; the promises that hold bitwise (every W runs natively: cakeconv's op gets the
   real [D, W] taps and activation, dweight is its [D, W] gradient, repeatable; seq_idx gives the
   bits of the equivalent cu_seqlens); the seq_idx boundaries (values, cache, marked valid); what
   is delegated, and the PyTorch fallbacks against an explicit per-token loop of causal-conv1d's
   semantics (negative and non-contiguous ids, initial and final states, the decode update: shift
   register, circular buffer, state indices); user errors.
2. Triton kernels in the interpreter (marked ``interpret``; own process): seq_idx's padded
   boundaries on the Triton path at W = 3 without activation, bitwise the exact cu_seqlens.
3. GPU (marked ``gpu``): the Triton path against the oracle over W and the activation, bitwise
   repeatability, no host synchronisation with seq_idx after the first call, a CUDA graph of
   forward + backward with seq_idx, and, where causal-conv1d imports, its function side by side
   (W = 3 and 4, SiLU and no activation).

Shape legend: B batch rows, D channels, T tokens per row, S = B * T, W taps, H = W - 1, L state
columns.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import cakeconv.integrations.dao as cdao
from cakeconv import cake_causal_conv1d_det
from cakeconv.cake_causal_conv1d_det_train_backend import checks
from cakeconv.oracle import causal_conv1d_oracle, causal_conv1d_oracle_backward
from cakeconv.integrations.dao import (
    causal_conv1d_fn,
    causal_conv1d_update,
    check_seq_idx,
    cu_seqlens_from_seq_idx,
    delegation_reason,
    torch_causal_conv1d_fn,
    torch_causal_conv1d_update,
)
from tests.helpers import TOLERANCES, rel_err

DEVICE_GPU = "cuda"


# ------------------------------------------------------------------------------ inputs, oracles

def runs_seq_idx(B: int, T: int, gen: torch.Generator, max_run: int = 6) -> torch.Tensor:
    """int32 [B, T]: each row increasing runs of 1..max_run tokens (many of length 1)."""
    rows = []
    for _ in range(B):
        ids, doc = [], int(torch.randint(0, 3, (), generator=gen))
        while len(ids) < T:
            one = torch.rand((), generator=gen).item() < 0.4
            n = 1 if one else int(torch.randint(2, max_run + 1, (), generator=gen))
            ids += [doc] * n
            doc += int(torch.randint(1, 3, (), generator=gen))
        rows.append(ids[:T])
    return torch.tensor(rows, dtype=torch.int32)


def make_args(B, D, T, W, dtype=torch.float32, wdtype=torch.float32, bias=True, layout="channel_last", seed=0,
              device="cpu"):
    """x [B, D, T] in the given layout, weight [D, W], bias [D], dy [B, D, T] (all requiring grad)."""
    gen = torch.Generator().manual_seed(seed)
    x_BTD = torch.randn(B, T, D, generator=gen)
    if layout == "channel_last":
        x = x_BTD.to(device, dtype).transpose(1, 2)  # what transformers passes
    else:
        x = x_BTD.transpose(1, 2).contiguous().to(device, dtype)
    w = (torch.randn(D, W, generator=gen) * 0.5).to(device, wdtype)
    b = (torch.randn(D, generator=gen) * 0.5).to(device, wdtype) if bias else None
    dy = torch.randn(B, D, T, generator=gen).to(device, dtype)
    for t in (x, w, b):
        if t is not None:
            t.requires_grad_(True)
    return x, w, b, dy


def seq_idx_cu(seq_idx: torch.Tensor | None, B: int, T: int) -> torch.Tensor:
    """int32 cu_seqlens of the B * T row-major tokens, built on the host: a document starts at each
    row start and wherever seq_idx changes (causal-conv1d's rule for contiguous, non-negative ids)."""
    flat = [0] * (B * T) if seq_idx is None else seq_idx.reshape(-1).tolist()
    starts = [t for t in range(B * T) if t % T == 0 or flat[t] != flat[t - 1]]
    return torch.tensor(starts + [B * T], dtype=torch.int32)


def packed(t_BDT: torch.Tensor) -> torch.Tensor:
    """[B, D, T] as the packed [B * T, D] rows that cakeconv and its oracle read."""
    B, D, T = t_BDT.shape
    return t_BDT.transpose(1, 2).reshape(B * T, D)


def _unpacked(t_SD: torch.Tensor, B: int, T: int) -> torch.Tensor:
    return t_SD.view(B, T, -1).transpose(1, 2)


def oracle_fn(x, w, b, seq_idx=None, activation="silu"):
    """float64 y [B, D, T] of ``cakeconv.oracle`` (one ``F.conv1d`` per document) on the documents
    of ``seq_idx``; ``activation`` is causal-conv1d's (None, "silu" or "swish")."""
    B, D, T = x.shape
    y_SD = causal_conv1d_oracle(packed(x.detach().cpu()), w, b, seq_idx_cu(seq_idx, B, T),
                                activation=cdao._cake_activation(activation))
    return _unpacked(y_SD, B, T)


def loop_oracle(x, w, b, seq_idx=None, initial_states=None, silu=True):
    """float64 y [B, D, T] of causal-conv1d's rule, token by token (tiny sizes only): token t reads
    column s = t - (W - 1) + k when s >= 0 (or an initial-state column) and, with seq_idx, when
    seq_idx[s] == seq_idx[t] (the initial states count as the row's first id); y = 0 where
    seq_idx < 0."""
    B, D, T = x.shape
    W = w.shape[1]
    out = torch.zeros(B, D, T, dtype=torch.float64)
    for r in range(B):
        for t in range(T):
            if seq_idx is not None and seq_idx[r, t] < 0:
                continue
            acc = torch.zeros(D, dtype=torch.float64) if b is None else b.double().clone()
            for k in range(W):
                s = t - (W - 1) + k
                if s >= 0:
                    if seq_idx is not None and seq_idx[r, s] != seq_idx[r, t]:
                        continue
                    col = x[r, :, s].double()
                elif initial_states is not None:
                    if seq_idx is not None and seq_idx[r, 0] != seq_idx[r, t]:
                        continue
                    col = initial_states[r, :, W - 1 + s].double()
                else:
                    continue
                acc = acc + w[:, k].double() * col
            out[r, :, t] = F.silu(acc) if silu else acc
    return out


def grads(y, dy, *tensors):
    present = [t for t in tensors if t is not None]
    got = torch.autograd.grad(y, present, dy)
    it = iter(got)
    return [next(it) if t is not None else None for t in tensors]


def oracle_grads(x, w, b, dy, seq_idx=None, activation="silu"):
    """float64 (y, dx [B, D, T], dweight, dbias) of ``oracle_fn`` (the oracle's own backward)."""
    B, D, T = x.shape
    dx_SD, dw, db = causal_conv1d_oracle_backward(packed(dy.detach().cpu()), packed(x.detach().cpu()), w, b,
                                                  seq_idx_cu(seq_idx, B, T),
                                                  activation=cdao._cake_activation(activation))
    return oracle_fn(x, w, b, seq_idx, activation), _unpacked(dx_SD, B, T), dw, db


# ------------------------------------------------------------------------ the cakeconv path (CPU)

@pytest.fixture
def cake_calls(monkeypatch):
    """The calls that reach cakeconv's op through the integration: (cu_seqlens, taps shape, activation)."""
    calls = []

    def counting(x, weight, *args, **kwargs):
        calls.append((kwargs.get("cu_seqlens"), tuple(weight.shape), kwargs.get("activation", "silu")))
        return cake_causal_conv1d_det(x, weight, *args, **kwargs)

    monkeypatch.setattr(cdao, "cake_causal_conv1d_det", counting)
    return calls


# Grid: the shortest and longest widths, Dao's widths 2-4 and one past them, each with SiLU and
# without; per pair both layouts in fp32 (tight), bf16 once; seq_idx on three cases of four.
@pytest.mark.parametrize("W", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("activation", ["silu", None])
@pytest.mark.parametrize("layout,dtype,bias,with_seq_idx", [
    ("channel_last", torch.float32, True, False),
    ("channel_first", torch.float32, False, True),
    ("channel_last", torch.float32, False, True),
    ("channel_last", torch.bfloat16, True, True),
])
def test_cakeconv_path_matches_oracle(cake_calls, W, activation, layout, dtype, bias, with_seq_idx):
    B, D, T = 3, 16, 29
    x, w, b, dy = make_args(B, D, T, W, dtype=dtype, bias=bias, layout=layout, seed=W)
    seq_idx = runs_seq_idx(B, T, torch.Generator().manual_seed(W)) if with_seq_idx else None
    y = causal_conv1d_fn(x, w, b, seq_idx=seq_idx, activation=activation)
    assert [call[1:] for call in cake_calls] == [((D, W), activation)], "cakeconv ran, at the real width"
    assert y.shape == (B, D, T) and y.dtype == dtype
    if layout == "channel_last":
        assert y.stride(1) == 1, "channel-last in, channel-last out (as causal-conv1d)"
    else:
        assert y.is_contiguous()
    dx, dw, db = grads(y, dy, x, w, b)
    y64, dx64, dw64, db64 = oracle_grads(x, w, b, dy, seq_idx, activation)
    tol = TOLERANCES[dtype]
    assert rel_err(y, y64) <= tol
    assert rel_err(dx, dx64) <= tol
    assert dw.shape == (D, W) and dw.dtype == w.dtype and rel_err(dw, dw64) <= 4 * tol  # sums of S terms
    if bias:
        assert rel_err(db, db64) <= 4 * tol


@pytest.mark.parametrize("W,activation", [(2, "swish"), (3, None), (7, None), (8, "silu")])
def test_every_width_is_cakeconvs_op_at_that_width(cake_calls, W, activation):
    """Bitwise: y, dx, dweight [D, W] and dbias are cakeconv's op called directly with the real
    taps and activation ("swish" is "silu"), on every call."""
    B, D, T = 2, 24, 33
    x, w, b, dy = make_args(B, D, T, W, dtype=torch.bfloat16, bias=True)
    runs = []
    for _ in range(2):
        y = causal_conv1d_fn(x, w, b, activation=activation)
        runs.append((y, *grads(y, dy, x, w, b)))
    for got, again in zip(runs[0], runs[1]):
        assert torch.equal(got, again)
    cake_activation = None if activation is None else "silu"
    assert [call[1:] for call in cake_calls] == [((D, W), cake_activation)] * 2
    x_BTD = x.detach().transpose(1, 2).requires_grad_()
    w_direct, b_direct = w.detach().requires_grad_(), b.detach().requires_grad_()
    y_direct = cake_causal_conv1d_det(x_BTD, w_direct, b_direct, activation=cake_activation)
    want = (y_direct.transpose(1, 2), *grads(y_direct, dy.transpose(1, 2), x_BTD, w_direct, b_direct))
    want = (want[0], want[1].transpose(1, 2), *want[2:])
    for name, got, expected in zip(("y", "dx", "dweight", "dbias"), runs[0], want):
        assert torch.equal(got, expected), name


def test_seq_idx_gives_the_bits_of_its_cu_seqlens():
    """seq_idx's boundaries (B * T + 1 entries, the last ones empty) give bitwise the result of the
    exact cu_seqlens, built here on the host."""
    B, D, T = 3, 16, 40
    x, w, b, dy = make_args(B, D, T, 4, dtype=torch.bfloat16, bias=True, seed=3)
    seq_idx = runs_seq_idx(B, T, torch.Generator().manual_seed(5))
    y = causal_conv1d_fn(x, w, b, seq_idx=seq_idx, activation="silu")
    dx, dw, db = grads(y, dy, x, w, b)
    x_SD = packed(x.detach()).requires_grad_()
    w2, b2 = w.detach().requires_grad_(), b.detach().requires_grad_()
    y_SD = cake_causal_conv1d_det(x_SD, w2, b2, cu_seqlens=seq_idx_cu(seq_idx, B, T))
    dx_SD, dw2, db2 = grads(y_SD, packed(dy), x_SD, w2, b2)
    assert torch.equal(y, y_SD.view(B, T, D).transpose(1, 2))
    assert torch.equal(dx, dx_SD.view(B, T, D).transpose(1, 2))
    assert torch.equal(dw, dw2) and torch.equal(db, db2)


def test_cu_seqlens_from_seq_idx_values_cache_and_validity():
    gen = torch.Generator().manual_seed(7)
    B, T = 3, 25
    seq_idx = runs_seq_idx(B, T, gen)
    cu = cu_seqlens_from_seq_idx(seq_idx)
    starts = seq_idx_cu(seq_idx, B, T).tolist()[:-1]
    assert cu.dtype == torch.int32 and cu.shape == (B * T + 1,)
    assert cu.tolist() == starts + [B * T] * (B * T + 1 - len(starts))
    assert checks._cu_values_checked(cu, B * T), "built valid: no host copy when the op sees it"
    assert cu_seqlens_from_seq_idx(seq_idx) is cu, "one build per seq_idx tensor"
    seq_idx[0, 1:] = seq_idx[0, 0]  # in place: a new version
    cu2 = cu_seqlens_from_seq_idx(seq_idx)
    assert cu2 is not cu and cu2[1].item() == T
    assert cu_seqlens_from_seq_idx(seq_idx.clone()) is not cu2
    # rows never join: equal ids across a row boundary still start a document
    same = torch.zeros(2, 3, dtype=torch.int64)
    assert cu_seqlens_from_seq_idx(same).tolist() == [0, 3, 6, 6, 6, 6, 6]
    assert cu_seqlens_from_seq_idx(torch.zeros(2, 0, dtype=torch.int32)).tolist() == [0]


def test_layouts_and_strides():
    """Any x strides give the same bits: channel-last (in place), channel-first, a channel slice of
    a wider buffer, a non-contiguous batch stride."""
    B, D, T = 2, 16, 21
    gen = torch.Generator().manual_seed(11)
    base = torch.randn(B, T, 3 * D, generator=gen)
    w = torch.randn(D, 4, generator=gen)
    ref = causal_conv1d_fn(base[:, :, :D].contiguous().transpose(1, 2), w, activation="silu")
    views = {
        "channel slice": base[:, :, D:2 * D].transpose(1, 2),
        "channel-first": base[:, :, 2 * D:].transpose(1, 2).contiguous(),
        "every other row": torch.randn(2 * B, T, D, generator=gen)[::2].transpose(1, 2),
    }
    for name, x in views.items():
        want = causal_conv1d_fn(x.transpose(1, 2).contiguous().transpose(1, 2), w, activation="silu")
        assert torch.equal(causal_conv1d_fn(x, w, activation="silu"), want), name
    assert ref.shape == (B, D, T)


def test_fp16_taps_run_on_cakeconv(cake_calls):
    x, w, b, dy = make_args(2, 16, 19, 4, dtype=torch.float16, wdtype=torch.float16, bias=True)
    y = causal_conv1d_fn(x, w, b, activation="silu")
    assert len(cake_calls) == 1
    dx, dw, db = grads(y, dy, x, w, b)
    assert dw.dtype == torch.float16 and db.dtype == torch.float16
    y64, dx64, dw64, db64 = oracle_grads(x, w, b, dy)
    assert rel_err(y, y64) <= TOLERANCES[torch.float16]
    assert rel_err(dw, dw64) <= 4 * TOLERANCES[torch.float16]


def test_empty_rows():
    x, w, b, _ = make_args(2, 16, 0, 4)
    y = causal_conv1d_fn(x, w, b, activation="silu")
    assert y.shape == (2, 16, 0)
    y.sum().backward()
    assert torch.count_nonzero(w.grad) == 0


# ------------------------------------------------------------------------------ delegation (CPU)

@pytest.mark.parametrize("case,reason", [
    ({"W": 9, "activation": None}, "W = 9"),
    ({"W": 1}, "W = 1"),
    ({"D": 12}, "multiple of 8"),
    ({"dtype": torch.float64}, "x dtype"),
    ({"initial_states": True}, "initial_states"),
    ({"return_final_states": True}, "return_final_states"),
])
def test_delegated_calls_run_the_pytorch_implementation(cake_calls, case, reason):
    B, D, T, W = 2, case.get("D", 16), 11, case.get("W", 4)
    dtype = case.get("dtype", torch.float32)
    x, w, b, dy = make_args(B, D, T, W, dtype=dtype, wdtype=dtype if dtype == torch.float64 else torch.float32)
    init = torch.randn(B, D, W - 1, dtype=dtype) if case.get("initial_states") else None
    kwargs = {"activation": case.get("activation", "silu"), "initial_states": init,
              "return_final_states": case.get("return_final_states", False)}
    assert reason in delegation_reason(x, w, b, **kwargs)
    out = causal_conv1d_fn(x, w, b, **kwargs)
    assert not cake_calls
    y = out[0] if kwargs["return_final_states"] else out
    want = loop_oracle(x.detach(), w.detach(), b.detach(), initial_states=init, silu=kwargs["activation"] is not None)
    assert rel_err(y, want) <= 1e-6
    y.backward(dy)
    assert x.grad is not None and w.grad is not None


def test_which_delegated_calls_causal_conv1d_would_take():
    """causal-conv1d gets a delegated call only where its kernels take it; the rest (W = 5, a bias
    of another dtype, seq_idx or states in the channel-first layout, unaligned strides) runs the
    PyTorch implementation."""
    x, w, b, _ = make_args(2, 16, 9, 4)
    x_first = x.detach().contiguous()
    assert cdao._dao_takes(x, w, b, True)
    assert cdao._dao_takes(x_first, w, b) and not cdao._dao_takes(x_first, w, b, True)
    assert not cdao._dao_takes(x, torch.randn(16, 5), None)
    assert not cdao._dao_takes(x, w, b.to(torch.bfloat16))
    assert not cdao._dao_takes(x.double(), w.double(), None)
    unaligned = torch.randn(2, 9, 20)[:, :, :16].transpose(1, 2)  # token stride 20
    assert not cdao._dao_takes(unaligned, w, None)
    assert cdao._dao_takes(x[:, :, 0], w, b), "a decode step's [B, D]"


@pytest.mark.parametrize("ids", [
    [[0, 0, 1, 0, 0, 2, 2, 2, 1], [-1, -1, 3, 3, 3, -1, 4, 4, 4]],   # an id coming back; padding
    [[5, 5, 5, 5, 5, 5, 5, 5, 5], [0, 1, 0, 1, 0, 1, 0, 1, 0]],
])
@pytest.mark.parametrize("with_initial", [False, True])
def test_torch_fn_follows_causal_conv1d_seq_idx_rule(ids, with_initial):
    """The PyTorch fallback is causal-conv1d's rule exactly, also where cakeconv reads seq_idx
    otherwise (ids that come back, negative ids)."""
    seq_idx = torch.tensor(ids, dtype=torch.int32)
    B, T = seq_idx.shape
    x, w, b, _ = make_args(B, 8, T, 4, seed=2)
    init = torch.randn(B, 8, 3) if with_initial else None
    y = torch_causal_conv1d_fn(x, w, b, seq_idx=seq_idx, initial_states=init, activation="silu")
    assert rel_err(y, loop_oracle(x.detach(), w.detach(), b.detach(), seq_idx, init)) <= 1e-6
    with pytest.raises(ValueError, match="seq_idx"):
        check_seq_idx(seq_idx)


def test_final_states_and_decode_continue_a_prefill():
    """prefill (T0 tokens, return_final_states) + update per token == one call over all tokens;
    the same with a circular buffer and with state indices (a padding row among them)."""
    B, D, T0, T1, W = 2, 16, 5, 4, 4
    x, w, b, _ = make_args(B, D, T0 + T1, W, seed=4)
    x, w, b = x.detach(), w.detach(), b.detach()
    full = causal_conv1d_fn(x, w, b, activation="silu")
    head, state = causal_conv1d_fn(x[:, :, :T0], w, b, return_final_states=True, activation="silu")
    assert torch.equal(state, x[:, :, T0 - (W - 1):T0]) and state.stride(1) == 1
    steps = []
    for t in range(T0, T0 + T1):
        steps.append(causal_conv1d_update(x[:, :, t], state, w, b, activation="silu"))
    got = torch.cat([head, torch.stack(steps, dim=2)], dim=2)
    assert rel_err(got, full) <= 2e-6
    # circular buffer of L = 5 columns: the state after the prefill, token T0 at column T0 % 5
    L = 5
    ring = torch.zeros(B, D, L)
    for t in range(T0):
        ring[:, :, t % L] = x[:, :, t]
    lens = torch.full((B,), T0, dtype=torch.int32)
    y_ring = torch_causal_conv1d_update(x[:, :, T0:], ring, w, b, "silu", cache_seqlens=lens)
    assert rel_err(y_ring, full[:, :, T0:]) <= 2e-6
    for j, t in enumerate(range(T0, T0 + T1)):
        assert torch.equal(ring[:, :, t % L], x[:, :, t])
    # state indices: row 0 uses state 2, row 1 is padding (index -1)
    pool = torch.zeros(3, D, W - 1)
    pool[2] = x[0, :, T0 - (W - 1):T0]
    before = pool.clone()
    y_idx = torch_causal_conv1d_update(x[:, :, T0], pool, w, b, "silu",
                                       conv_state_indices=torch.tensor([2, -1], dtype=torch.int32))
    assert rel_err(y_idx[0], full[0, :, T0]) <= 2e-6 and torch.count_nonzero(y_idx[1]) == 0
    assert torch.equal(pool[:2], before[:2]) and torch.equal(pool[2, :, -1], x[0, :, T0])


def test_final_states_shorter_than_the_window():
    """T < W - 1: the final states are the initial states' tail, then x (zeros without them)."""
    x, w, _, _ = make_args(2, 8, 2, 4)
    init = torch.randn(2, 8, 3)
    _, fs = torch_causal_conv1d_fn(x.detach(), w.detach(), initial_states=init, return_final_states=True)
    assert torch.equal(fs, torch.cat([init[:, :, 2:], x.detach()], dim=2))
    out = torch.zeros(2, 8, 3)
    _, fs0 = torch_causal_conv1d_fn(x.detach(), w.detach(), return_final_states=True, final_states_out=out)
    assert fs0 is out and torch.equal(out, torch.cat([torch.zeros(2, 8, 1), x.detach()], dim=2))


# --------------------------------------------------------------------------------- errors (CPU)

def _bad(**over):
    x, w, b, _ = make_args(2, 16, 9, 4)
    args = {"x": x, "weight": w, "bias": b, "seq_idx": None, "initial_states": None,
            "return_final_states": False, "final_states_out": None, "activation": "silu"}
    args.update(over)
    return args


@pytest.mark.parametrize("over,error,match", [
    ({"x": torch.randn(16, 9)}, ValueError, r"x must be \[B, D, T\]"),
    ({"x": torch.ones(2, 16, 9, dtype=torch.int32)}, TypeError, "floating-point"),
    ({"weight": torch.randn(8, 4)}, ValueError, r"weight must have shape \[16, \*\]"),
    ({"weight": torch.randn(16, 0)}, ValueError, "W >= 1"),
    ({"bias": torch.randn(8)}, ValueError, r"bias must have shape \[16\]"),
    ({"activation": "relu"}, ValueError, "'relu'"),
    ({"seq_idx": torch.zeros(2, 8, dtype=torch.int32)}, ValueError, r"seq_idx must have shape \[2, 9\]"),
    ({"seq_idx": torch.zeros(2, 9)}, TypeError, "seq_idx must be int32 or int64"),
    ({"seq_idx": torch.zeros(2, 9, dtype=torch.int32), "return_final_states": True}, ValueError, "seq_idx"),
    ({"initial_states": torch.randn(2, 16, 2)}, ValueError, r"initial_states must have shape \[2, 16, 3\]"),
    ({"weight": "w"}, TypeError, "weight must be a torch.Tensor"),
])
@pytest.mark.parametrize("fn", [causal_conv1d_fn, torch_causal_conv1d_fn])
def test_bad_arguments_raise_before_computing(fn, over, error, match):
    with pytest.raises(error, match=match):
        fn(**_bad(**over))


def test_bad_backend_and_update_arguments():
    x, w, b, _ = make_args(2, 16, 9, 4)
    with pytest.raises(ValueError, match="backend"):
        causal_conv1d_fn(x, w, b, activation="silu", backend="cuda")
    state = torch.zeros(2, 16, 3)
    with pytest.raises(ValueError, match="at least W - 1 = 3"):
        causal_conv1d_update(x[:, :, 0], torch.zeros(2, 16, 2), w)
    with pytest.raises(ValueError, match=r"conv_state must have shape \[2, 16, \*\]"):
        causal_conv1d_update(x[:, :, 0], torch.zeros(3, 16, 3), w)
    with pytest.raises(TypeError, match="cache_seqlens must be int32 or int64"):
        causal_conv1d_update(x[:, :, 0], state, w, cache_seqlens=torch.zeros(2))
    with pytest.raises(ValueError, match="'gelu'"):
        causal_conv1d_update(x[:, :, 0], state, w, activation="gelu")


def test_check_seq_idx_accepts_contiguous_ids():
    check_seq_idx(torch.tensor([[0, 0, 1, 1, 2], [7, 7, 7, 9, 9]]))
    check_seq_idx(torch.tensor([[3, 2, 2, 1, 0]]))  # decreasing is contiguous too
    with pytest.raises(ValueError, match="not contiguous"):
        check_seq_idx(torch.tensor([[0, 1, 0]]))


# --------------------------------------------------------------------- Triton kernels, interpreted

@pytest.mark.interpret
def test_interpreted_triton_path_with_seq_idx():
    """Tier 2: the Triton kernels under the interpreter read seq_idx's B * T + 1 boundaries (the
    documents past the last one empty, the per-token index variant) and give bitwise the result of
    the exact cu_seqlens, at W = 3 without activation, within FP32 tolerance of the oracle."""
    B, D, T = 2, 16, 23
    x, w, b, dy = make_args(B, D, T, 3, dtype=torch.float32, bias=True, seed=9)
    seq_idx = runs_seq_idx(B, T, torch.Generator().manual_seed(9), max_run=4)
    y = causal_conv1d_fn(x, w, b, seq_idx=seq_idx, activation=None, backend="triton")
    dx, dw, db = grads(y, dy, x, w, b)
    cu = seq_idx_cu(seq_idx, B, T)
    assert cu.numel() - 1 >= 5, "enough documents for the per-token index variant"
    x_SD = packed(x.detach()).requires_grad_()
    w2, b2 = w.detach().requires_grad_(), b.detach().requires_grad_()
    y_SD = cake_causal_conv1d_det(x_SD, w2, b2, cu_seqlens=cu, activation=None, backend="triton")
    dx_SD, dw2, db2 = grads(y_SD, packed(dy), x_SD, w2, b2)
    assert torch.equal(y, y_SD.view(B, T, D).transpose(1, 2))
    assert torch.equal(dx, dx_SD.view(B, T, D).transpose(1, 2))
    assert torch.equal(dw, dw2) and torch.equal(db, db2)
    y64, dx64, dw64, _ = oracle_grads(x, w, b, dy, seq_idx, activation=None)
    assert rel_err(y, y64) <= TOLERANCES[torch.float32] and rel_err(dw, dw64) <= 4 * TOLERANCES[torch.float32]


# ---------------------------------------------------------------------------------------- GPU

def _dao_fn():
    found = cdao.dao_causal_conv1d()
    return None if found is None else found[0]


@pytest.mark.gpu
@pytest.mark.parametrize("W,activation", [(2, "silu"), (3, None), (4, "silu"), (5, None), (7, None), (8, "silu")])
def test_gpu_triton_path_matches_oracle_and_repeats(W, activation):
    B, D, T = 2, 512, 3001
    x, w, b, dy = make_args(B, D, T, W, dtype=torch.bfloat16, bias=True, seed=W, device=DEVICE_GPU)
    seq_idx = runs_seq_idx(B, T, torch.Generator().manual_seed(W), max_run=300).to(DEVICE_GPU)
    outs = []
    for _ in range(2):
        y = causal_conv1d_fn(x, w, b, seq_idx=seq_idx, activation=activation)
        outs.append((y, *grads(y, dy, x, w, b)))
    for got, again in zip(outs[0], outs[1]):
        assert torch.equal(got, again)
    y, dx, dw, db = outs[0]
    y64, dx64, dw64, db64 = oracle_grads(x.cpu(), w.cpu(), b.cpu(), dy.cpu(), seq_idx.cpu(), activation)
    tol = TOLERANCES[torch.bfloat16]
    assert rel_err(y, y64) <= tol and rel_err(dx, dx64) <= tol
    assert rel_err(dw, dw64) <= 4 * tol and rel_err(db, db64) <= 4 * tol


@pytest.mark.gpu
def test_gpu_seq_idx_needs_no_host_sync():
    """After a first call of the shapes (compiles, plans), a new seq_idx tensor: forward and
    backward issue no synchronising CUDA call."""
    B, D, T = 2, 256, 4096
    x, w, b, dy = make_args(B, D, T, 4, dtype=torch.bfloat16, device=DEVICE_GPU)
    gen = torch.Generator().manual_seed(1)
    first = runs_seq_idx(B, T, gen, max_run=200).to(DEVICE_GPU)
    causal_conv1d_fn(x, w, b, seq_idx=first, activation="silu").backward(dy)
    fresh = runs_seq_idx(B, T, gen, max_run=200).to(DEVICE_GPU)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        y = causal_conv1d_fn(x, w, b, seq_idx=fresh, activation="silu")
        y.backward(dy)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    want = oracle_fn(x.detach().cpu(), w.detach().cpu(), b.detach().cpu(), fresh.cpu())
    assert rel_err(y, want) <= TOLERANCES[torch.bfloat16]


@pytest.mark.gpu
def test_gpu_cuda_graph_with_seq_idx_sees_new_ids():
    """forward + backward captured with a static seq_idx; a replay after new ids are copied in
    gives the eager result of the new ids, bitwise."""
    B, D, T = 2, 128, 1000
    x, w, b, dy = make_args(B, D, T, 4, dtype=torch.bfloat16, device=DEVICE_GPU)
    gen = torch.Generator().manual_seed(2)
    static_ids = runs_seq_idx(B, T, gen, max_run=100).to(DEVICE_GPU)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            w.grad = None
            causal_conv1d_fn(x, w, b, seq_idx=static_ids, activation="silu").backward(dy)
    torch.cuda.current_stream().wait_stream(stream)
    w.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_static = causal_conv1d_fn(x, w, b, seq_idx=static_ids, activation="silu")
        y_static.backward(dy)
    new_ids = runs_seq_idx(B, T, gen, max_run=7).to(DEVICE_GPU)
    static_ids.copy_(new_ids)
    graph.replay()
    torch.cuda.synchronize()
    y_graph, dw_graph = y_static.detach().clone(), w.grad.detach().clone()
    x2, w2, b2 = (t.detach().clone().requires_grad_() for t in (x, w, b))
    y_eager = causal_conv1d_fn(x2, w2, b2, seq_idx=new_ids.clone(), activation="silu")
    y_eager.backward(dy)
    assert torch.equal(y_graph, y_eager) and torch.equal(dw_graph, w2.grad)


@pytest.mark.gpu
@pytest.mark.parametrize("W,activation", [(4, "silu"), (3, None)])
def test_gpu_beside_dao_causal_conv1d(W, activation):
    """Where causal-conv1d imports: the same y and gradients within bf16 tolerance of its function,
    with SiLU and without; its delegated calls (final states, the update) unchanged."""
    dao_fn = _dao_fn()
    if dao_fn is None:
        pytest.skip("causal-conv1d is not installed")
    B, D, T = 2, 512, 2048
    # bf16 x, FP32 taps: what mixed-precision training passes (and the pair the benchmarks' trimmed
    # build of causal-conv1d keeps, tools/build_dao.sh)
    x, w, b, dy = make_args(B, D, T, W, dtype=torch.bfloat16, wdtype=torch.float32, device=DEVICE_GPU)
    seq_idx = runs_seq_idx(B, T, torch.Generator().manual_seed(3), max_run=300).to(DEVICE_GPU)
    y = causal_conv1d_fn(x, w, b, seq_idx=seq_idx, activation=activation)
    got = (y, *grads(y, dy, x, w, b))
    y_dao = dao_fn(x, w, b, seq_idx, None, False, None, activation)
    want = (y_dao, *grads(y_dao, dy, x, w, b))
    for name, g, d in zip(("y", "dx", "dweight", "dbias"), got, want):
        assert rel_err(g, d) <= 4 * TOLERANCES[torch.bfloat16], name
    head, fs = causal_conv1d_fn(x, w, b, return_final_states=True, activation=activation)
    head_dao, fs_dao = dao_fn(x, w, b, None, None, True, None, activation)
    assert torch.equal(head, head_dao) and torch.equal(fs, fs_dao), "delegated to causal-conv1d unchanged"
    state = x[:, :, -3:].detach().clone()
    state_dao = state.clone()
    step = x[:, :, 0].detach()
    ours = causal_conv1d_update(step, state, w, b, activation)
    theirs = cdao.dao_causal_conv1d()[1](step, state_dao, w, b, activation)
    assert torch.equal(ours, theirs) and torch.equal(state, state_dao)
