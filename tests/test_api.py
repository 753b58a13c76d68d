"""Tier 1: public names, layouts, buffers, determinism and the bad-input catalogue (CPU).

The [B, T, C] / [1, S, C] layouts, empty input and the workspace views are tested for every width
and both activations in tests/test_widths.py."""

import importlib
import pathlib
import re
import subprocess
import sys

import pytest
import torch

import cakeconv
from cakeconv import (
    cake_causal_conv1d_det,
    cake_causal_conv1d_det_train_backward,
    cake_causal_conv1d_det_train_backward_workspace_bytes,
    cake_causal_conv1d_det_train_forward,
    cake_causal_conv1d_det_train_forward_workspace_bytes,
    is_cake_causal_conv1d_det_train_supported,
)
from tests.helpers import make_inputs, random_cu_seqlens

SINGLE_RANK_NAMES = [
    "cake_causal_conv1d_det", "CakeCausalConv1dDetFunction", "cake_causal_conv1d_det_train_forward",
    "cake_causal_conv1d_det_train_backward", "cake_causal_conv1d_det_train_forward_workspace_bytes",
    "cake_causal_conv1d_det_train_backward_workspace_bytes", "is_cake_causal_conv1d_det_train_supported",
]
REMOVED_NAMES = [
    "cake_causal_conv1d", "CakeCausalConv1dFunction", "cake_causal_conv1d_kcp", "cake_causal_conv1d_kcp_multi",
    "KcpRecomputeHandle", "CakeCausalConv1dKcpFunction", "cake_causal_conv1d_train_forward",
    "cake_causal_conv1d_train_backward",
]
REMOVED_MODULES = ["cakeconv.cake_causal_conv1d_train", "cakeconv.cake_causal_conv1d_train_backend"]


def test_single_rank_names_exist():
    mod = importlib.import_module("cakeconv.cake_causal_conv1d_det_train")
    for name in SINGLE_RANK_NAMES:
        assert getattr(mod, name) is getattr(cakeconv, name), name
        assert name in cakeconv.__all__
    assert cakeconv.CakeCausalConv1dDetFunction is cakeconv.cake_causal_conv1d_det_train_backend.CakeCausalConv1dDetFunction


def test_removed_names_are_gone():
    pkg_dir = pathlib.Path(cakeconv.__file__).parent
    for path in pkg_dir.rglob("*.py"):
        text = path.read_text()
        for name in REMOVED_NAMES:
            assert not re.search(rf"\b{name}\b", text), f"{name} appears in {path}"
    for mod_name in ["cakeconv", "cakeconv.cake_causal_conv1d_det_train", "cakeconv.cake_causal_conv1d_det_train_backend"]:
        mod = importlib.import_module(mod_name)
        for name in REMOVED_NAMES:
            assert not hasattr(mod, name), f"{mod_name}.{name}"
    for mod_name in REMOVED_MODULES:
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(mod_name)


def test_supported(monkeypatch):
    """True on the CPU; False on every other non-CUDA device; on CUDA, capability >= 8.0 (SPEC 3).

    The CUDA rule is checked without a GPU by faking the capability query, and on a GPU against
    the real device; devices that are not CPU or CUDA (meta, and device types without a backend
    here) answer False rather than raising; arguments that are not a device raise TypeError.
    """
    f = is_cake_causal_conv1d_det_train_supported
    assert f("cpu") is True
    assert f(torch.device("cpu")) is True
    assert f(torch.zeros(1)) is True
    assert f(torch.zeros(2, 8, dtype=torch.bfloat16)) is True
    for other in ("meta", torch.device("meta"), torch.empty(3, device="meta"), "mps", "xpu"):
        assert f(other) is False, other
    for bad in (None, 3.5, object(), [0]):
        with pytest.raises(TypeError):
            f(bad)
    for bad in ("notadevice", "cuda:x", -1):  # names no device: bad input, a ValueError
        with pytest.raises(ValueError, match="not a device"):
            f(bad)
    # The CUDA rule, with a faked device query: 7.x is refused, 8.0 and newer accepted.
    if torch.cuda.is_available():
        major, _ = torch.cuda.get_device_capability()
        assert f("cuda") is (major >= 8)
        assert f(torch.empty(1, device="cuda")) is (major >= 8)
    else:
        assert f("cuda") is False and f(torch.device("cuda", 0)) is False  # no CUDA here: not supported
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for capability, want in (((7, 5), False), ((7, 0), False), ((8, 0), True), ((8, 9), True), ((9, 0), True), ((10, 0), True)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, c=capability: c)
        for dev in ("cuda", "cuda:0", torch.device("cuda", 1)):
            assert f(dev) is want, (capability, dev)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert f("cpu") is True and f("meta") is False  # the CUDA query does not leak into other devices


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_row_bits_do_not_depend_on_position(dtype):
    """The sigmoid trap: a document's rows have the same bits alone, first, or in an odd tail."""
    C = 24
    gen = torch.Generator().manual_seed(2)
    doc = torch.randn(29, C, generator=gen).to(dtype)
    other = torch.randn(18, C, generator=gen).to(dtype)
    _, w, b, _ = make_inputs(1, C, seed=4)
    alone = cake_causal_conv1d_det_train_forward(doc, w, b)
    packed = torch.cat([other, doc], 0)
    cu = torch.tensor([0, 18, 47], dtype=torch.int32)
    tail = cake_causal_conv1d_det_train_forward(packed, w, b, cu)[18:]
    assert torch.equal(alone, tail)
    cu2 = torch.tensor([0, 29, 47], dtype=torch.int32)
    head = cake_causal_conv1d_det_train_forward(torch.cat([doc, other], 0), w, b, cu2)[:29]
    assert torch.equal(alone, head)


def test_caller_buffers_are_used():
    S, C = 64, 16
    x, w, b, dy = make_inputs(S, C, seed=9)
    cu = torch.tensor([0, 10, 64], dtype=torch.int32)
    out = torch.empty_like(x)
    assert cake_causal_conv1d_det_train_forward(x, w, b, cu, out=out) is out
    dx = torch.empty_like(x)
    ws = torch.empty(cake_causal_conv1d_det_train_backward_workspace_bytes(S, C), dtype=torch.uint8)
    dx2, dw, db = cake_causal_conv1d_det_train_backward(dy, x, w, b, cu, dx=dx, workspace=ws)
    assert dx2 is dx
    base = ws.data_ptr()
    assert base <= dw.data_ptr() < base + ws.numel() and base <= db.data_ptr() < base + ws.numel()
    ref = cake_causal_conv1d_det_train_backward(dy, x, w, b, cu)
    assert torch.equal(dx, ref[0]) and torch.equal(dw, ref[1]) and torch.equal(db, ref[2])
    assert cake_causal_conv1d_det_train_forward_workspace_bytes(S, C) == 0


def _fingerprint():
    S, C = 777, 24
    gen = torch.Generator().manual_seed(123)
    cu = random_cu_seqlens(S, gen)
    x, w, b, dy = make_inputs(S, C, seed=77)
    y = cake_causal_conv1d_det_train_forward(x, w, b, cu)
    dx, dw, db = cake_causal_conv1d_det_train_backward(dy, x, w, b, cu)
    return y, dx, dw, db


def test_deterministic_across_calls_and_processes():
    first = _fingerprint()
    second = _fingerprint()
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    code = (
        "import torch, hashlib, tests.test_api as t\n"
        "outs = t._fingerprint()\n"
        "print(','.join(hashlib.sha256(o.float().numpy().tobytes()).hexdigest() for o in outs))\n"
    )
    import hashlib
    here = ",".join(hashlib.sha256(o.float().numpy().tobytes()).hexdigest() for o in first)
    root = pathlib.Path(__file__).resolve().parent.parent
    for threads in ("1", "2"):
        res = subprocess.run([sys.executable, "-c", f"import torch; torch.set_num_threads({threads})\n" + code],
                             cwd=root, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip() == here


# ----------------------------------------------------------------------------- bad input catalogue

def _ok():
    x, w, b, dy = make_inputs(32, 16, seed=0)
    return x, w, b, torch.tensor([0, 5, 32], dtype=torch.int32)


BAD_CASES = [
    # (description, kwargs override, exception, text expected in the message)
    ("x not a tensor", dict(x=[[1.0]]), TypeError, "list"),
    ("x float64", dict(x=torch.zeros(32, 16, dtype=torch.float64)), TypeError, "float64"),
    ("x int", dict(x=torch.zeros(32, 16, dtype=torch.int32)), TypeError, "int32"),
    ("x 1-D", dict(x=torch.zeros(32, dtype=torch.bfloat16)), ValueError, "(32,)"),
    ("x 4-D", dict(x=torch.zeros(1, 1, 32, 16, dtype=torch.bfloat16)), ValueError, "(1, 1, 32, 16)"),
    ("C not multiple of 8", dict(x=torch.zeros(32, 12, dtype=torch.bfloat16), w=torch.zeros(12, 4), b=torch.zeros(12)), ValueError, "C = 12"),
    ("BTC with cu", dict(x=torch.zeros(2, 16, 16, dtype=torch.bfloat16)), ValueError, "B = 2"),
    ("weight shape", dict(w=torch.zeros(15, 4)), ValueError, "(15, 4)"),
    ("weight W = 9", dict(w=torch.zeros(16, 9)), ValueError, "W = 9"),
    ("weight dtype", dict(w=torch.zeros(16, 4, dtype=torch.float64)), TypeError, "float64"),
    ("bias shape", dict(b=torch.zeros(15)), ValueError, "(15,)"),
    ("bias dtype", dict(b=torch.zeros(16, dtype=torch.int64)), TypeError, "int64"),
    ("cu not tensor", dict(cu=[0, 5, 32]), TypeError, "list"),
    ("cu float", dict(cu=torch.tensor([0.0, 5.0, 32.0])), TypeError, "float32"),
    ("cu 2-D", dict(cu=torch.tensor([[0, 5, 32]], dtype=torch.int32)), ValueError, "(1, 3)"),
    # a strided view: the Triton kernels read cu[d] at offset d, so it would place boundaries wrongly
    ("cu strided", dict(cu=torch.tensor([0, 99, 5, 99, 32, 99], dtype=torch.int32)[::2]), ValueError, "contiguous"),
    ("cu start", dict(cu=torch.tensor([1, 5, 32], dtype=torch.int32)), ValueError, "cu_seqlens[0] = 1"),
    ("cu decreasing", dict(cu=torch.tensor([0, 9, 5, 32], dtype=torch.int32)), ValueError, "cu_seqlens[1] = 9"),
    ("cu end", dict(cu=torch.tensor([0, 5, 31], dtype=torch.int32)), ValueError, "cu_seqlens[-1] = 31"),
    ("backend", dict(backend="cuda"), ValueError, "'cuda'"),
    ("triton on cpu", dict(backend="triton"), ValueError, "TRITON_INTERPRET"),
]


@pytest.mark.parametrize("desc,override,exc,text", BAD_CASES, ids=[c[0] for c in BAD_CASES])
@pytest.mark.parametrize("entry", ["forward", "backward", "autograd"])
def test_bad_input_raises(desc, override, exc, text, entry, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    x, w, b, cu = _ok()
    args = dict(x=x, w=w, b=b, cu=cu, backend="auto")
    args.update(override)
    with pytest.raises(exc) as info:
        if entry == "forward":
            cake_causal_conv1d_det_train_forward(args["x"], args["w"], args["b"], args["cu"], backend=args["backend"])
        elif entry == "backward":
            dy = args["x"] if isinstance(args["x"], torch.Tensor) else x
            cake_causal_conv1d_det_train_backward(dy, args["x"], args["w"], args["b"], args["cu"], backend=args["backend"])
        else:
            cake_causal_conv1d_det(args["x"], args["w"], args["b"], cu_seqlens=args["cu"], backend=args["backend"])
    assert text in str(info.value), str(info.value)
    # A failure leaves nothing half-built: the next valid call works.
    assert cake_causal_conv1d_det_train_forward(x, w, b, cu).shape == x.shape


def test_bad_buffers_raise():
    x, w, b, cu = _ok()
    with pytest.raises(ValueError, match=r"\(32, 8\)"):
        cake_causal_conv1d_det_train_forward(x, w, b, cu, out=torch.empty(32, 8, dtype=x.dtype))
    with pytest.raises(TypeError, match="float32"):
        cake_causal_conv1d_det_train_forward(x, w, b, cu, out=torch.empty(32, 16, dtype=torch.float32))
    with pytest.raises(ValueError, match="dy must have"):
        cake_causal_conv1d_det_train_backward(x[:4], x, w, b, cu)
    with pytest.raises(ValueError, match="workspace has 8 bytes"):
        cake_causal_conv1d_det_train_backward(x, x, w, b, cu, workspace=torch.empty(8, dtype=torch.uint8))
    with pytest.raises(TypeError, match="dweight_dtype"):
        cake_causal_conv1d_det_train_backward(x, x, w, b, cu, dweight_dtype=torch.int32)
    with pytest.raises(ValueError, match="S and C"):
        cake_causal_conv1d_det_train_backward_workspace_bytes(-1, 8)


def test_api_reference_is_up_to_date():
    """docs/api.md is what docs/gen_api.py generates from the docstrings (run it after an API change)."""
    import os
    import pathlib
    import subprocess
    import sys

    repo = pathlib.Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, str(repo / "docs" / "gen_api.py"), "--check"], capture_output=True, text=True,
                          cwd=repo, env={**os.environ, "PYTHONPATH": str(repo)})
    assert done.returncode == 0, done.stdout + done.stderr
