"""Tier 1: the reference backend per element against the float64 oracle, to the last bit.

SPEC section 1: y is computed in FP32 and "rounded once to x's dtype"; dx likewise. So for bf16 and
fp16 x (FP32 taps) each element of y must be the float64 oracle's value (``cakeconv.oracle``)
rounded once to the dtype -- bitwise -- except where the oracle's value lies so close to a
rounding boundary that FP32 arithmetic may land on either side; there it must be one of the two
neighbours. "So close" is a bound on the FP32 evaluation error, per element, from the inputs
(u = 2**-24):

    y:   E = 8 u (A + |y|),               A = |b| + sum_k |w_k x[t-3+k]|  (the terms of pre)
    dx:  E = 8 u sum_k |w_{3-k}| |dy[t+k]| (A[t+k] + 1 + |pre[t+k]|)

(a bound of the reference's FP32 operation sequence: about 3 u A + 4 u |y| for y, and for dx the
error of g, 1.25 u A + 4 u (1 + |pre|) per unit of dy, carried through the taps; the largest error
seen is 2 u of these units, a quarter of E. E is far below half an ulp of bf16 / fp16 for all but
a small fraction of elements). An element is "decided" when
[oracle - E, oracle + E] rounds to a single value; at least 90% must be decided, and every decided
element must match bitwise. Every element is also within 1 ulp of the once-rounded oracle (ulps
counted on the integer representation).

Rounding twice (e.g. pre or the sigmoid rounded to the dtype before the product, or g to the
dtype before dx) moves about a quarter of the decided elements by an ulp: this test fails then,
where the relative-to-scale tolerances of tests/test_reference.py do not.

dweight / dbias are FP32 sums over all tokens: no per-element "rounded once" claim to check here
(their fixed order is tested elsewhere).

The checks live in tests/helpers.py (``error_bounds``, ``check_rounded_once``), where the bounds are
written for any width W; tests/test_widths.py runs them for W = 2..8 with and without SiLU.

Shape legend: S packed tokens, C channels, N documents.
"""

import pytest
import torch

from cakeconv import cake_causal_conv1d_det_train_backward, cake_causal_conv1d_det_train_forward
from cakeconv.oracle import causal_conv1d_silu_oracle, causal_conv1d_silu_oracle_backward
from tests.helpers import check_rounded_once, error_bounds, one_thread  # noqa: F401  (one_thread: a fixture)

C = 48

pytestmark = pytest.mark.usefixtures("one_thread")


def _cu(S: int, gen: torch.Generator) -> torch.Tensor:
    """Documents of S tokens: empty (also first and last), 1-, 2- and 3-token ones, long ones."""
    lens = [0, 1, 0, 0, 2, 3, 1, 17, 1, 1]
    while sum(lens) < S:
        r = torch.rand((), generator=gen).item()
        lens.append(int(torch.randint(1, 4, (), generator=gen)) if r < 0.4 else int(torch.randint(4, 200, (), generator=gen)))
    lens[-1] -= sum(lens) - S
    cu = [0]
    for n in lens + [0]:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32)


def _inputs(S, dtype, bias, seed):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(S, C, generator=gen) * 1.5).to(dtype)
    w = torch.randn(C, 4, generator=gen) * 0.6
    b = torch.randn(C, generator=gen) * 0.6 if bias else None
    dy = torch.randn(S, C, generator=gen).to(dtype)
    return x, w, b, dy, _cu(S, gen)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_reference_y_and_dx_are_the_oracle_rounded_once(dtype, bias):
    S = 3001
    x, w, b, dy, cu = _inputs(S, dtype, bias, seed=11 + (dtype == torch.float16) * 2 + bias)
    assert x.numel() > 100_000 and cu.numel() > 30
    err_y, err_dx = error_bounds(x, w, b, dy, cu)

    y = cake_causal_conv1d_det_train_forward(x, w, b, cu, backend="reference")
    check_rounded_once(y, causal_conv1d_silu_oracle(x, w, b, cu), err_y, dtype, f"y {dtype} bias={bias}")

    # g[t+k] of the same document feeds dx[t] through w[3 - k]
    dx, _, _ = cake_causal_conv1d_det_train_backward(dy, x, w, b, cu, backend="reference")
    dx_o, _, _ = causal_conv1d_silu_oracle_backward(dy, x, w, b, cu)
    check_rounded_once(dx, dx_o, err_dx, dtype, f"dx {dtype} bias={bias}")
