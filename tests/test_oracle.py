"""The oracle's two forms of the definition agree: one conv1d per document, and the one-pass masked
taps it uses for many documents (cakeconv/oracle.py), for widths W from 2 to 8 with and without SiLU."""

import pytest
import torch

import cakeconv.oracle as oracle
from tests.helpers import one_thread  # noqa: F401  (a fixture)

pytestmark = pytest.mark.usefixtures("one_thread")


def _documents(S, max_len, seed):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(0 if max_len > 1 else 1, max_len + 1, (S,), generator=g)
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)]).clamp_max(S)
    return cu[: int((cu == S).nonzero()[0]) + 1].to(torch.int32)


@pytest.mark.parametrize("W,activation", [(4, "silu"), (2, None), (7, "silu")], ids=["W4_silu", "W2_none", "W7_silu"])
@pytest.mark.parametrize("max_len", [1, 5, 40])
@pytest.mark.parametrize("bias", [True, False])
def test_one_pass_form_equals_per_document_form(monkeypatch, max_len, bias, W, activation):
    S, C = 300, 6
    cu = _documents(S, max_len, seed=max_len)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(S, C, generator=g, dtype=torch.float64)
    w = torch.randn(C, W, generator=g, dtype=torch.float64)
    b = torch.randn(C, generator=g, dtype=torch.float64) if bias else None
    dy = torch.randn(S, C, generator=g, dtype=torch.float64)
    results = {}
    for limit, form in ((10**9, "per_document"), (0, "one_pass")):
        monkeypatch.setattr(oracle, "PER_DOCUMENT_LIMIT", limit)
        y = oracle.causal_conv1d_oracle(x, w, b, cu, activation=activation)
        grads = oracle.causal_conv1d_oracle_backward(dy, x, w, b, cu, activation=activation)
        results[form] = (y,) + tuple(grads)
    for name, a, c in zip(("y", "dx", "dweight", "dbias"), results["per_document"], results["one_pass"]):
        if a is None:
            assert c is None, name
            continue
        assert a.abs().max() > 0, name
        torch.testing.assert_close(c, a, rtol=1e-12, atol=1e-12, msg=name)


def test_many_documents_take_the_one_pass_form(monkeypatch):
    """A mix of 2,000 one-token documents stays cheap: the per-document form is never called."""
    S, C = 2000, 4
    cu = torch.arange(S + 1, dtype=torch.int32)

    def refuse(*args):
        raise AssertionError("the per-document form ran for 2,000 documents")

    monkeypatch.setattr(oracle, "_oracle_graph_per_document", refuse)
    x = torch.randn(S, C, dtype=torch.float64)
    w = torch.randn(C, 4, dtype=torch.float64)
    y = oracle.causal_conv1d_silu_oracle(x, w, None, cu)
    # One-token documents see only their own row: y = silu(w3 * x).
    torch.testing.assert_close(y, torch.nn.functional.silu(w[:, 3] * x), rtol=1e-15, atol=0)
    w7 = torch.randn(C, 7, dtype=torch.float64)
    y7 = oracle.causal_conv1d_oracle(x, w7, None, cu, activation=None)
    torch.testing.assert_close(y7, w7[:, 6] * x, rtol=1e-15, atol=0)  # W = 7, no activation: w6 * x
