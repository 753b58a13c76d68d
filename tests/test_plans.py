"""The per-signature plans of the single-rank op (conv.py): reused, never a way around validation.

A plan caches what validation and the launchers' set-up derive from the operands' metadata. These
tests check that a cached plan never lets a bad call through (a changed cu_seqlens, a new tensor
with bad values, a bad dy or operand after good calls), that it holds no tensor, that the cache is
bounded, and (tier 2) that the prepared fast path gives the bits of the general path.
"""

import gc
import weakref

import pytest
import torch

from cakeconv import cake_causal_conv1d_det, cake_causal_conv1d_det_train_backward, cake_causal_conv1d_det_train_forward
from cakeconv.cake_causal_conv1d_det_train_backend import conv
from tests.helpers import make_inputs


def _cu(values):
    return torch.tensor(values, dtype=torch.int32)


def test_one_plan_per_signature_and_it_holds_no_tensor():
    S, C = 40, 16
    x, w, b, _ = make_inputs(S, C, seed=1)
    cu = _cu([0, 10, S])
    cake_causal_conv1d_det_train_forward(x, w, b, cu, backend="reference")
    sig = conv.signature(x, w, b, cu, "reference")
    plan = conv._plans[sig]
    x2, w2, b2, _ = make_inputs(S, C, seed=2)  # other tensors, the same metadata
    cu2 = _cu([0, 30, S])
    cake_causal_conv1d_det_train_forward(x2, w2, b2, cu2, backend="reference")
    assert conv._plans[conv.signature(x2, w2, b2, cu2, "reference")] is plan
    held = [getattr(plan, name) for name in conv.Plan.__slots__]
    assert not any(isinstance(v, torch.Tensor) for v in held)
    ref = weakref.ref(cu2)
    del cu2
    gc.collect()
    assert ref() is None  # the plan cache does not keep a cu_seqlens alive


def test_cu_seqlens_changed_in_place_is_checked_again():
    S, C = 40, 16
    x, w, b, _ = make_inputs(S, C, seed=3)
    cu = _cu([0, 10, S])
    cake_causal_conv1d_det_train_forward(x, w, b, cu, backend="reference")
    cu[1] = 50  # now decreasing: the plan is cached, the values are not
    with pytest.raises(ValueError, match="non-decreasing"):
        cake_causal_conv1d_det_train_forward(x, w, b, cu, backend="reference")
    cu[1] = 10
    cake_causal_conv1d_det_train_forward(x, w, b, cu, backend="reference")


def test_new_cu_seqlens_of_the_same_metadata_is_checked():
    S, C = 40, 16
    x, w, b, _ = make_inputs(S, C, seed=4)
    cake_causal_conv1d_det_train_forward(x, w, b, _cu([0, 10, S]), backend="reference")
    with pytest.raises(ValueError, match="end at the number of tokens"):
        cake_causal_conv1d_det_train_forward(x, w, b, _cu([0, 10, S - 1]), backend="reference")
    with pytest.raises(ValueError, match="start at 0"):
        cake_causal_conv1d_det(x, w, b, cu_seqlens=_cu([1, 10, S]), backend="reference")


def test_bad_operands_after_good_calls_still_raise_the_same_errors():
    S, C = 40, 16
    x, w, b, dy = make_inputs(S, C, seed=5)
    cu = _cu([0, 10, S])
    for _ in range(2):  # the second call runs on the cached plan
        cake_causal_conv1d_det_train_forward(x, w, b, cu, backend="reference")
        cake_causal_conv1d_det_train_backward(dy, x, w, b, cu, backend="reference")
    with pytest.raises(TypeError, match="weight dtype"):
        cake_causal_conv1d_det_train_forward(x, w.half(), b, cu, backend="reference")
    with pytest.raises(ValueError, match="weight must be"):
        cake_causal_conv1d_det_train_forward(x, w[:8], b, cu, backend="reference")
    with pytest.raises(ValueError, match="dy must have x's shape"):
        cake_causal_conv1d_det_train_backward(dy[:-1], x, w, b, cu, backend="reference")
    with pytest.raises(TypeError, match="dy dtype"):
        cake_causal_conv1d_det_train_backward(dy.int(), x, w, b, cu, backend="reference")
    with pytest.raises(ValueError, match="backend must be one of"):
        cake_causal_conv1d_det_train_forward(x, w, b, cu, backend="cuda")
    with pytest.raises(ValueError, match="backend must be one of"):
        cake_causal_conv1d_det_train_forward(x, w, b, cu, backend=["reference"])  # unhashable


def test_the_plan_cache_is_bounded():
    C = 8
    w = torch.randn(C, 4)
    for S in range(1, conv._MAX_PLANS + 40):
        cake_causal_conv1d_det_train_forward(torch.randn(S, C), w, backend="reference")
        assert len(conv._plans) <= conv._MAX_PLANS


@pytest.mark.interpret
def test_triton_fast_path_and_general_path_give_the_same_bits():
    """The autograd op on the prepared fast path (the plan built on the first call, reused on the
    second) for three dy layouts (contiguous; expanded from one row, row stride 0; transposed,
    which the op copies first: the general path) against the entry points on contiguous dy,
    and the general path of non-contiguous out / dx buffers: equal outputs and gradients."""
    S, C = 150, 16
    x, w, b, dy = make_inputs(S, C, seed=6)
    cu = _cu([0, 3, 70, 71, S])
    dys = {"contiguous": dy, "expanded": dy[:1].expand(S, C), "transposed": dy.t().contiguous().t()}
    results = {}
    for name, g in dys.items():
        for call in range(2):
            xr, wr, br = (t.detach().clone().requires_grad_(True) for t in (x, w, b))
            y = cake_causal_conv1d_det(xr, wr, br, cu_seqlens=cu, backend="triton")
            y.backward(g)
            results[(name, call)] = (y, xr.grad, wr.grad, br.grad)
    plan = conv._plans[conv.signature(x, w, b, cu, "triton")]
    assert plan.fwd is not None  # the fast path ran, and the general one for the transposed dy
    assert [bool(launches) for launches, _ in plan._bwd.values()] == [True, True, False]
    for name, g in dys.items():
        gc_ = g.contiguous()
        y = cake_causal_conv1d_det_train_forward(x, w, b, cu, backend="triton")
        dx, dw, db = cake_causal_conv1d_det_train_backward(gc_, x, w, b, cu, backend="triton")
        for call in range(2):
            for got, want in zip(results[(name, call)], (y, dx, dw, db)):
                assert torch.equal(got, want), (name, call)
    # the general path (non-contiguous out / dx buffers: the op computes into [S, C] rows, then copies)
    y_out = torch.empty(C, S, dtype=x.dtype).t()
    dx_out = torch.empty(C, S, dtype=x.dtype).t()
    cake_causal_conv1d_det_train_forward(x.view(1, S, C).view(S, C), w, b, cu, out=y_out, backend="triton")
    got = cake_causal_conv1d_det_train_backward(dy, x, w, b, cu, dx=dx_out, backend="triton")
    want = results[("contiguous", 0)]
    assert torch.equal(y_out, want[0]) and torch.equal(dx_out, want[1])
    assert torch.equal(got[1], want[2]) and torch.equal(got[2], want[3])


def test_direct_launch_takes_the_c_function_only_for_kernels_without_scratch():
    """``launch.direct_launch`` (how a prepared launch calls a compiled kernel): Triton's C launch
    function with the arguments its launcher object would add, for a kernel with no global or
    profile scratch; the launcher object itself otherwise (it allocates the scratch)."""
    from types import SimpleNamespace

    from cakeconv.cake_causal_conv1d_det_train_backend.kernels.launch import direct_launch

    def c_launch(*args):
        return args

    def compiled(global_scratch, profile_scratch):
        launcher = SimpleNamespace(launch=c_launch, global_scratch_size=global_scratch,
                                   profile_scratch_size=profile_scratch, launch_cooperative_grid=0, launch_pdl=1)
        return SimpleNamespace(run=launcher, function=7, packed_metadata=(4, 1, 0))

    fn, head = direct_launch(compiled(0, 0))
    assert fn is c_launch
    # grid, stream, then: function, cooperative, pdl, global scratch, profile scratch, metadata,
    # launch metadata, enter hook, exit hook; then the kernel's arguments
    assert fn(1, 2, 3, 99, *head, 1000) == (1, 2, 3, 99, 7, 0, 1, None, None, (4, 1, 0), None, None, None, 1000)
    for scratch in ((256, 0), (0, 64)):
        k = compiled(*scratch)
        fn, head = direct_launch(k)
        assert fn is k.run and head == (7, (4, 1, 0), None, None, None)


def test_the_c_launch_function_parses_the_arguments_in_direct_launchs_order():
    """The installed Triton's C launcher (generated source, no GPU needed) parses its arguments in
    the order ``direct_launch`` passes them: a Triton upgrade that reorders them fails here, not
    silently on a GPU."""
    import re

    from triton.backends.nvidia.driver import make_launcher

    src = make_launcher({}, {0: "*fp32"}, None)
    parsed = re.search(r"PyArg_ParseTuple\(args, [^,]*, (.*?)\)\) \{", src, re.S).group(1)
    names = [n.strip().lstrip("&") for n in parsed.split(",")]
    assert names == ["gridX", "gridY", "gridZ", "_stream", "_function", "launch_cooperative_grid", "launch_pdl",
                     "global_scratch_obj", "profile_scratch_obj", "kernel_metadata", "launch_metadata",
                     "launch_enter_hook", "launch_exit_hook", "_arg0"]
