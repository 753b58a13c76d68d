"""mamba_ssm's fused paths on cakeconv: the causal-conv1d pair and ``cakeconv.integrations.mamba_ssm``.

Tiers (cheapest first):

1. CPU, nothing installed: ``causal_conv1d_fwd_function`` / ``causal_conv1d_bwd_function`` of
   ``cakeconv.integrations.dao`` against the PyTorch implementation (float64 references), in the
   layouts mamba_ssm passes them (a channel-last [B, D, T] view of a slice of a wider projection,
   ``dx`` a view into the input gradient written in place and nothing around it), with ``seq_idx``,
   widths 2..8, SiLU or none, bitwise repeats; the delegated calls (states, widths and channel
   counts the op does not take); argument errors.
2. CPU, a stand-in mamba_ssm package written here after mamba_ssm 2.3's binding pattern (its
   ``ssd_combined`` imports the pair from ``causal_conv1d.cpp_functions`` or binds None, and runs
   the pair inside an autograd Function as ``mamba_split_conv1d_scan_combined`` does; its
   ``selective_scan_interface`` fails to import as without Mamba1's CUDA extension):
   ``swap()``'s report, training through cakeconv's entry points (calls counted), gradients
   against PyTorch, bitwise repeats, ``unswap()`` restoring the very objects, and the real
   mamba_ssm source's modules when its source package is at hand (``MAMBA_SSM_SDIST`` or
   ``../shared/peers/mamba_ssm-2.3.2.post1.tar.gz``; skipped otherwise).
3. GPU (marked ``gpu``): the real ``Mamba2`` layer (mamba_ssm source, fused path) swapped against
   Dao's conv where causal-conv1d imports: cakeconv's pair is called, gradients agree with Dao's
   to bf16 rounding, repeats are bitwise.

Shape legend: B batch rows, T tokens per row, D conv channels, Z the projection's width, W taps.
"""

from __future__ import annotations

import os
import sys
import tarfile
import textwrap
import types
import warnings

import pytest
import torch
import torch.nn.functional as F

import cakeconv.integrations.dao as cdao
from cakeconv.integrations import mamba_ssm as cake_mamba
from cakeconv.integrations.report import CakeconvSwapWarning

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SDIST = os.environ.get("MAMBA_SSM_SDIST",
                       os.path.join(REPO, "..", "shared", "peers", "mamba_ssm-2.3.2.post1.tar.gz"))


def projection(B, T, Z, lo, D, dtype=torch.float32, seed=0):
    """(zxbcdt [B, T, Z], the [B, D, T] channel-last view of its columns [lo, lo + D)) as mamba_ssm makes it."""
    gen = torch.Generator().manual_seed(seed)
    z_BTZ = torch.randn(B, T, Z, generator=gen).to(dtype)
    return z_BTZ, z_BTZ[..., lo:lo + D].transpose(1, 2)


def taps(D, W, dtype=torch.float32, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(D, W, generator=gen) / W).to(dtype), torch.randn(D, generator=gen).to(dtype)


def seq_ids(B, T, cuts):
    ids_BT = torch.zeros(B, T, dtype=torch.int32)
    for c in cuts:
        ids_BT[:, c:] += 1
    return ids_BT


# ------------------------------------------------------------------------ tier 1: the pair

@pytest.mark.parametrize("W", [2, 4, 7, 8])
@pytest.mark.parametrize("silu", [True, False])
@pytest.mark.parametrize("packed", [False, True])
def test_pair_matches_pytorch_in_mamba_layouts(W, silu, packed):
    B, T, Z, lo, D = 2, 23, 56, 8, 24
    z_BTZ, x_BDT = projection(B, T, Z, lo, D)
    w_DW, b_D = taps(D, W)
    seq_idx = seq_ids(B, T, [5, 6, 17]) if packed else None
    y_BDT = cdao.causal_conv1d_fwd_function(x_BDT, w_DW, b_D, seq_idx, None, None, silu)
    assert y_BDT.shape == x_BDT.shape and y_BDT.stride(1) == 1  # channel-last, as causal-conv1d's empty_like
    act = "silu" if silu else None
    ref64 = cdao.torch_causal_conv1d_fn(x_BDT.double(), w_DW.double(), b_D.double(), seq_idx, activation=act)
    torch.testing.assert_close(y_BDT.double(), ref64, rtol=1e-5, atol=1e-5)

    gen = torch.Generator().manual_seed(2)
    dout_BDT = torch.randn(B, T, D, generator=gen).transpose(1, 2)
    dz_BTZ = torch.full((B, T, Z), 7.0)
    dx_BDT = dz_BTZ[..., lo:lo + D].transpose(1, 2)
    got = cdao.causal_conv1d_bwd_function(x_BDT, w_DW, b_D, dout_BDT, seq_idx, None, None, dx_BDT, False, silu)
    assert got[0] is dx_BDT and got[3] is None
    assert torch.all(dz_BTZ[..., :lo] == 7.0) and torch.all(dz_BTZ[..., lo + D:] == 7.0)  # nothing around dx
    ref = cdao.torch_causal_conv1d_bwd_function(x_BDT.double(), w_DW.double(), b_D.double(), dout_BDT.double(),
                                                seq_idx, None, None, None, False, silu)
    for have, want in zip(got[:3], ref[:3]):
        torch.testing.assert_close(have.double(), want, rtol=1e-5, atol=1e-5)
    assert got[1].dtype == w_DW.dtype and got[2].dtype == b_D.dtype
    again = cdao.causal_conv1d_bwd_function(x_BDT, w_DW, b_D, dout_BDT, seq_idx, None, None, None, False, silu)
    assert torch.equal(again[0], got[0]) and torch.equal(again[1], got[1]) and torch.equal(again[2], got[2])


def test_pair_low_precision_and_channel_first():
    B, T, D, W = 2, 9, 16, 4
    gen = torch.Generator().manual_seed(3)
    x_BDT = torch.randn(B, D, T, generator=gen).bfloat16()  # channel-first, contiguous
    w_DW, b_D = taps(D, W, torch.float16)  # fp16 taps are widened to fp32 (exact)
    y = cdao.causal_conv1d_fwd_function(x_BDT, w_DW, None, None, None, None, True)
    assert y.is_contiguous() and y.dtype == torch.bfloat16
    ref = cdao.torch_causal_conv1d_fn(x_BDT.double(), w_DW.double(), None, activation="silu")
    torch.testing.assert_close(y.double(), ref, rtol=1e-2, atol=1e-2)
    dout = torch.randn(B, D, T, generator=gen).bfloat16()
    dx, dw, db, dinit = cdao.causal_conv1d_bwd_function(x_BDT, w_DW, b_D, dout, None, None, None, None, False, True)
    assert dx.is_contiguous() and dx.dtype == torch.bfloat16 and dw.dtype == torch.float16 and db.dtype == torch.float16


@pytest.mark.parametrize("case,reason", [
    ({"initial_states": True}, "initial_states"),
    ({"final_states_out": True}, "final_states_out"),
    ({"dfinal_states": True}, "dfinal_states"),
    ({"return_dinitial_states": True}, "return_dinitial_states"),
    ({"W": 9}, "W = 9"),
    ({"D": 12}, "multiple of 8"),
])
def test_pair_delegates_state_and_other_operands(monkeypatch, case, reason):
    calls = []
    for name in ("cake_causal_conv1d_det_train_forward", "cake_causal_conv1d_det_train_backward"):
        real = getattr(cdao, name)
        monkeypatch.setattr(cdao, name, lambda *a, _real=real, **k: calls.append(1) or _real(*a, **k))
    B, T, D, W = 2, 10, case.get("D", 16), case.get("W", 4)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(B, D, T, generator=gen, dtype=torch.float64)
    w, b = taps(D, W, torch.float64)
    init = torch.randn(B, D, W - 1, generator=gen, dtype=torch.float64) if case.get("initial_states") else None
    final = torch.empty(B, D, W - 1, dtype=torch.float64) if case.get("final_states_out") else None
    dfinal = torch.randn(B, D, W - 1, generator=gen, dtype=torch.float64) if case.get("dfinal_states") else None
    rdinit = bool(case.get("return_dinitial_states"))
    assert reason in cdao.pair_delegation_reason(x.float(), w.float(), b.float(), init, final, dfinal, rdinit)
    y = cdao.causal_conv1d_fwd_function(x, w, b, None, init, final, True)
    dout = torch.randn(B, D, T, generator=gen, dtype=torch.float64)
    dx, dw, db, dinit = cdao.causal_conv1d_bwd_function(x, w, b, dout, None, init, dfinal, None, rdinit, True)
    assert not calls
    # against autograd through F.conv1d (another implementation than the fallback's)
    xs = x.clone().requires_grad_(True)
    ws, bs = w.clone().requires_grad_(True), b.clone().requires_grad_(True)
    head = init.clone().requires_grad_(True) if init is not None else torch.zeros(B, D, W - 1, dtype=torch.float64,
                                                                                     requires_grad=rdinit)
    full = torch.cat([head, xs], dim=2)
    ref = F.silu(F.conv1d(full, ws.unsqueeze(1), bs, groups=D))
    torch.testing.assert_close(y, ref.detach())
    if final is not None:
        torch.testing.assert_close(final, full[:, :, -(W - 1):].detach())
    outs, grads = [ref], [dout]
    if dfinal is not None:
        outs.append(full[:, :, -(W - 1):])
        grads.append(dfinal)
    inputs = [xs, ws, bs] + ([head] if rdinit else [])
    want = torch.autograd.grad(outs, inputs, grads)
    torch.testing.assert_close(dx, want[0])
    torch.testing.assert_close(dw, want[1])
    torch.testing.assert_close(db, want[2])
    if rdinit:
        torch.testing.assert_close(dinit, want[3])


def test_pair_errors_name_the_value():
    x = torch.randn(2, 16, 8)
    w, b = taps(16, 4)
    with pytest.raises(TypeError, match="silu_activation must be a bool"):
        cdao.causal_conv1d_fwd_function(x, w, b, None, None, None, "silu")
    with pytest.raises(ValueError, match=r"dout must have shape \[2, 16, 8\]"):
        cdao.causal_conv1d_bwd_function(x, w, b, torch.randn(2, 16, 7), None, None, None, None, False, True)
    with pytest.raises(ValueError, match=r"dx must have shape"):
        cdao.causal_conv1d_bwd_function(x, w, b, x, None, None, None, torch.empty(2, 8, 16), False, True)
    with pytest.raises(TypeError, match="dx must have x's dtype"):
        cdao.causal_conv1d_bwd_function(x, w, b, x, None, None, None, x.double(), False, True)
    with pytest.raises(ValueError, match=r"weight must have shape \[16, \*\]"):
        cdao.causal_conv1d_fwd_function(x, w[:8], b, None, None, None, True)
    with pytest.raises(ValueError, match="backend"):
        cdao.causal_conv1d_fwd_function(x, w, b, None, None, None, True, backend="cuda")


@pytest.mark.interpret
@pytest.mark.parametrize("packed", [False, True])
def test_pair_on_the_triton_kernels_writes_dx_in_place(monkeypatch, packed):
    """Tier 2: the Triton kernels (CPU interpreter) read x and write dx as rows of the wider
    projection, in place: the backward's fast path prepared for dx's own row stride, no copy."""
    from cakeconv.cake_causal_conv1d_det_train_backend import conv

    def no_copy(*args, **kwargs):
        raise AssertionError("dx went through a temporary copy")
    monkeypatch.setattr(conv, "_rows_out", no_copy)
    B, T, Z, lo, D, W = (1, 40, 72, 16, 32, 4) if packed else (2, 17, 72, 16, 32, 4)
    z_BTZ, x_BDT = projection(B, T, Z, lo, D, torch.bfloat16, seed=11)
    w_DW, b_D = taps(D, W)
    seq_idx = seq_ids(B, T, [3, 4, 25]) if packed else None
    y_BDT = cdao.causal_conv1d_fwd_function(x_BDT, w_DW, b_D, seq_idx, None, None, True, backend="triton")
    gen = torch.Generator().manual_seed(12)
    dout_BDT = torch.randn(B, T, D, generator=gen).bfloat16().transpose(1, 2)
    dz_BTZ = torch.full((B, T, Z), 5.0, dtype=torch.bfloat16)
    dx_BDT = dz_BTZ[..., lo:lo + D].transpose(1, 2)
    got = cdao.causal_conv1d_bwd_function(x_BDT, w_DW, b_D, dout_BDT, seq_idx, None, None, dx_BDT, False, True,
                                          backend="triton")
    assert got[0] is dx_BDT
    assert torch.all(dz_BTZ[..., :lo] == 5.0) and torch.all(dz_BTZ[..., lo + D:] == 5.0)
    ref_y = cdao.torch_causal_conv1d_fn(x_BDT.double(), w_DW.double(), b_D.double(), seq_idx, activation="silu")
    ref = cdao.torch_causal_conv1d_bwd_function(x_BDT.double(), w_DW.double(), b_D.double(), dout_BDT.double(),
                                                seq_idx, None, None, None, False, True)
    torch.testing.assert_close(y_BDT.double(), ref_y, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(dx_BDT.double(), ref[0], rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(got[1].double(), ref[1], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got[2].double(), ref[2], rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------ tier 2: the module swap

STAND_IN = {
    "__init__.py": "raise ImportError('stand-in: the package __init__ imports a CUDA extension')\n",
    "ops/__init__.py": "",
    "ops/triton/__init__.py": "",
    "ops/selective_scan_interface.py": "import selective_scan_cuda  # not built here\n",
    "ops/triton/ssd_combined.py": '''
        import torch
        try:
            from causal_conv1d import causal_conv1d_fn
            from causal_conv1d.cpp_functions import causal_conv1d_fwd_function, causal_conv1d_bwd_function
        except ImportError:
            causal_conv1d_fn = causal_conv1d_fwd_function = causal_conv1d_bwd_function = None

        def ensure_stride(t):
            return t if t.stride(1) % 8 == 0 else t.contiguous()

        class SplitConv(torch.autograd.Function):
            """What mamba_split_conv1d_scan_combined does with the conv: xBC, a slice of zxbcdt."""

            @staticmethod
            def forward(ctx, zxbcdt, weight, bias, lo, D, seq_idx, silu):
                xBC = zxbcdt[..., lo:lo + D]
                y = causal_conv1d_fwd_function(ensure_stride(xBC).transpose(1, 2), weight, bias, seq_idx,
                                               None, None, silu).transpose(1, 2)
                ctx.save_for_backward(zxbcdt, weight, bias, seq_idx)
                ctx.lo, ctx.D, ctx.silu = lo, D, silu
                return y * 2.0

            @staticmethod
            def backward(ctx, dout):
                zxbcdt, weight, bias, seq_idx = ctx.saved_tensors
                lo, D = ctx.lo, ctx.D
                dz = torch.zeros_like(zxbcdt)
                dxBC_given = dz[..., lo:lo + D]
                dxBC = (dout * 2.0).contiguous()
                got, dweight, dbias, *_ = causal_conv1d_bwd_function(
                    ensure_stride(zxbcdt[..., lo:lo + D]).transpose(1, 2), weight, bias,
                    ensure_stride(dxBC).transpose(1, 2), seq_idx, None, None,
                    ensure_stride(dxBC_given).transpose(1, 2), False, ctx.silu)
                got = got.transpose(1, 2)
                if got.stride() != dxBC_given.stride():
                    dxBC_given.copy_(got)
                return dz, dweight, dbias, None, None, None, None
        ''',
    "modules/__init__.py": "",
    "modules/mamba2.py": '''
        try:
            from causal_conv1d import causal_conv1d_fn
        except ImportError:
            causal_conv1d_fn = None
        ''',
}


def _namespace(monkeypatch, root):
    """Register ``mamba_ssm`` as a namespace over ``root`` (its __init__ not run), as the peers README
    says for a Mamba2-only use; every mamba_ssm module is dropped from sys.modules afterwards."""
    for name in [n for n in sys.modules if n == "mamba_ssm" or n.startswith("mamba_ssm.")]:
        monkeypatch.delitem(sys.modules, name)
    package = types.ModuleType("mamba_ssm")
    package.__path__ = [root]
    monkeypatch.setitem(sys.modules, "mamba_ssm", package)


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    root = tmp_path / "mamba_ssm"
    for rel, text in STAND_IN.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text))
    _namespace(monkeypatch, str(root))
    yield
    cake_mamba.unswap()
    for name in [n for n in sys.modules if n.startswith("mamba_ssm.")]:
        sys.modules.pop(name, None)


@pytest.fixture
def entry_calls(monkeypatch):
    calls = []
    for name in ("cake_causal_conv1d_det_train_forward", "cake_causal_conv1d_det_train_backward"):
        real = getattr(cdao, name)
        monkeypatch.setattr(cdao, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
    return calls


def _split_conv_step(zxbcdt, weight, bias, lo, D, seq_idx, silu=True):
    from mamba_ssm.ops.triton.ssd_combined import SplitConv
    z = zxbcdt.clone().requires_grad_(True)
    w, b = weight.clone().requires_grad_(True), bias.clone().requires_grad_(True)
    y = SplitConv.apply(z, w, b, lo, D, seq_idx, silu)
    (y.float() * torch.linspace(-1, 1, y.shape[-1])).sum().backward()
    return y.detach(), z.grad, w.grad, b.grad


def test_swap_reports_and_trains_through_cakeconv(stand_in, entry_calls):
    with warnings.catch_warnings():
        warnings.simplefilter("error", CakeconvSwapWarning)  # reaching some modules is no cause to warn
        report = cake_mamba.swap(cake_backend="reference")
    rows = {e.where: e for e in report.entries}
    ssd = "mamba_ssm.ops.triton.ssd_combined."
    for name in ("causal_conv1d_fwd_function", "causal_conv1d_bwd_function", "causal_conv1d_fn"):
        assert rows[ssd + name].on_cakeconv and rows[ssd + name].newly_swapped
        assert "was None (causal-conv1d not installed)" in rows[ssd + name].why
    assert rows["mamba_ssm.modules.mamba2.causal_conv1d_fn"].on_cakeconv
    sel = rows["mamba_ssm.ops.selective_scan_interface.causal_conv1d_fwd_function"]
    assert not sel.on_cakeconv and "selective_scan_cuda" in sel.why
    assert not rows["mamba_ssm.modules.mha.causal_conv1d_fn"].on_cakeconv
    assert report.swapped == 4 and cake_mamba.is_swapped() and "4 changed by this call" in str(report)
    assert cake_mamba.swap().swapped == 0  # a second swap keeps the first's bindings

    B, T, Z, lo, D, W = 2, 19, 48, 16, 24, 4
    z_BTZ, _ = projection(B, T, Z, lo, D, seed=7)
    w_DW, b_D = taps(D, W)
    seq_idx = seq_ids(B, T, [4, 11])
    y, dz, dw, db = _split_conv_step(z_BTZ, w_DW, b_D, lo, D, seq_idx)
    assert entry_calls == ["cake_causal_conv1d_det_train_forward", "cake_causal_conv1d_det_train_backward"]
    # against PyTorch on the same computation, float64
    z64 = z_BTZ.double().requires_grad_(True)
    w64, b64 = w_DW.double().requires_grad_(True), b_D.double().requires_grad_(True)
    ref = 2.0 * cdao.torch_causal_conv1d_fn(z64[..., lo:lo + D].transpose(1, 2), w64, b64, seq_idx,
                                            activation="silu").transpose(1, 2)
    (ref * torch.linspace(-1, 1, D, dtype=torch.float64)).sum().backward()
    torch.testing.assert_close(y.double(), ref.detach(), rtol=1e-5, atol=1e-5)
    for have, want in ((dz, z64.grad), (dw, w64.grad), (db, b64.grad)):
        torch.testing.assert_close(have.double(), want, rtol=1e-5, atol=1e-5)
    assert torch.all(dz[..., :lo] == 0) and torch.all(dz[..., lo + D:] == 0)
    again = _split_conv_step(z_BTZ, w_DW, b_D, lo, D, seq_idx)
    assert all(torch.equal(a, b) for a, b in zip(again, (y, dz, dw, db)))  # bitwise repeats


def test_unswap_restores_the_very_objects(stand_in):
    import mamba_ssm.ops.triton.ssd_combined as ssd
    sentinel = object()
    ssd.causal_conv1d_fwd_function = sentinel
    cake_mamba.swap()
    assert ssd.causal_conv1d_fwd_function is cdao.causal_conv1d_fwd_function
    import mamba_ssm.modules.mamba2 as mamba2
    mamba2.causal_conv1d_fn = len  # someone else rebinds one name after the swap
    report = cake_mamba.unswap()
    assert ssd.causal_conv1d_fwd_function is sentinel and ssd.causal_conv1d_bwd_function is None
    assert mamba2.causal_conv1d_fn is len
    rows = {e.where: e for e in report.entries}
    assert rows["mamba_ssm.modules.mamba2.causal_conv1d_fn"].why.startswith("rebound by someone else")
    assert rows["mamba_ssm.ops.triton.ssd_combined.causal_conv1d_bwd_function"].newly_swapped
    assert str(report).startswith("mamba_ssm unswap: 3 of 4 places restored, 0 still run cakeconv")
    assert not cake_mamba.is_swapped() and cake_mamba.unswap().entries == ()


def test_swap_without_mamba_ssm_warns_and_reaches_nothing(monkeypatch):
    for name in [n for n in sys.modules if n == "mamba_ssm" or n.startswith("mamba_ssm.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "mamba_ssm", None)  # import mamba_ssm raises ImportError
    with pytest.warns(CakeconvSwapWarning, match="mamba_ssm is not installed"):
        report = cake_mamba.swap()
    assert report.swapped == 0 and not report.on_cakeconv and len(report.entries) == 1
    assert not cake_mamba.is_swapped()
    with pytest.raises(ValueError, match="cake_backend must be one of"):
        cake_mamba.swap(cake_backend="cuda")


@pytest.fixture
def real_mamba_source(tmp_path, monkeypatch):
    if not os.path.exists(SDIST):
        pytest.skip(f"mamba_ssm's source package not found at {SDIST} (set MAMBA_SSM_SDIST)")
    pytest.importorskip("einops")
    with tarfile.open(SDIST) as tar:
        tar.extractall(tmp_path, filter="data")
    roots = [p for p in tmp_path.glob("mamba_ssm-*/mamba_ssm")]
    _namespace(monkeypatch, str(roots[0]))
    yield
    cake_mamba.unswap()
    for name in [n for n in sys.modules if n.startswith("mamba_ssm.")]:
        sys.modules.pop(name, None)


def test_swap_reaches_the_real_mamba_ssm_modules(real_mamba_source):
    report = cake_mamba.swap(cake_backend="reference")
    reached = {e.where for e in report.on_cakeconv}
    for name in ("causal_conv1d_fwd_function", "causal_conv1d_bwd_function", "causal_conv1d_fn"):
        assert f"mamba_ssm.ops.triton.ssd_combined.{name}" in reached
    assert {"mamba_ssm.modules.mamba2.causal_conv1d_fn", "mamba_ssm.modules.mamba2_simple.causal_conv1d_fn",
            "mamba_ssm.modules.mha.causal_conv1d_fn"} <= reached
    import mamba_ssm.ops.triton.ssd_combined as ssd
    assert ssd.causal_conv1d_bwd_function.func is cdao.causal_conv1d_bwd_function  # a partial: backend bound
    assert ssd.causal_conv1d_bwd_function.keywords == {"backend": "reference"}
    selective = [e for e in report.entries if "selective_scan_interface" in e.where]
    assert selective and not any(e.on_cakeconv for e in selective)  # Mamba1's extension is not built here
    assert all("selective_scan_cuda" in e.why for e in selective)
    cake_mamba.unswap()
    assert ssd.causal_conv1d_bwd_function is None  # causal-conv1d is not installed here


# ------------------------------------------------------------------------ tier 3: GPU, real Mamba2

def _mamba2_step(layer, u_BTD, seq_idx):
    layer.zero_grad(set_to_none=True)
    u = u_BTD.clone().requires_grad_(True)
    y = layer(u, seq_idx=seq_idx)
    (y.float() * torch.linspace(-1, 1, y.shape[-1], device=y.device)).sum().backward()
    return {"y": y.detach(), "du": u.grad, **{n: p.grad.clone() for n, p in layer.named_parameters()}}


@pytest.mark.gpu
def test_gpu_mamba2_fused_layer_runs_cakeconv_and_repeats_bitwise(real_mamba_source, entry_calls):
    """The real Mamba2 layer (fused path, bf16, packed documents) on cakeconv after ``swap()``:
    the pair is called, the conv's weight and bias gradients repeat bitwise, and where causal-conv1d imports, every gradient agrees
    with the layer on Dao's conv to bf16 rounding."""
    from mamba_ssm.modules.mamba2 import Mamba2
    import mamba_ssm.ops.triton.ssd_combined as ssd
    torch.manual_seed(0)
    layer = Mamba2(d_model=256, d_state=64, headdim=64, expand=2, use_mem_eff_path=True, device="cuda",
                   dtype=torch.bfloat16)
    u_BTD = torch.randn(1, 2048, 256, device="cuda", dtype=torch.bfloat16)
    seq_idx = seq_ids(1, 2048, [300, 301, 1000]).cuda()
    dao_pair = (ssd.causal_conv1d_fwd_function, ssd.causal_conv1d_bwd_function)
    dao = _mamba2_step(layer, u_BTD, seq_idx) if dao_pair[0] is not None else None
    report = cake_mamba.swap()
    assert "mamba_ssm.ops.triton.ssd_combined.causal_conv1d_bwd_function" in {e.where for e in report.on_cakeconv}
    first = _mamba2_step(layer, u_BTD, seq_idx)
    assert "cake_causal_conv1d_det_train_forward" in entry_calls
    assert "cake_causal_conv1d_det_train_backward" in entry_calls
    second = _mamba2_step(layer, u_BTD, seq_idx)
    for name in ("conv1d.weight", "conv1d.bias"):  # cakeconv's sums (mamba_ssm's own kernels have their modes)
        assert torch.equal(first[name], second[name]), name
    if dao is not None:
        for name, have in first.items():
            torch.testing.assert_close(have.float(), dao[name].float(), rtol=2e-2, atol=2e-2, msg=name)
