"""Tier 4 (GPU): the single-rank forward + backward captured once in a CUDA graph and replayed.

Written against SPEC section 6 with the workspace entry points (no allocation inside the graph).
The caller owns the static buffers: ``y``, ``dx`` and the workspace (which holds dweight and
dbias) are overwritten by every replay, so a caller that keeps a replay's gradients clones them
before the next replay. The test checks that the four outputs occupy disjoint memory, that every
later replay really rewrites each static buffer (new data: the values differ from the first
replay's eager results), and that the first replay's clones still equal the first replay's eager
results after those rewrites. A new
document layout with the same number of cu_seqlens entries is copied into the captured cu_seqlens
tensor and replayed without re-capture (the kernels read the boundaries from the device; the
host-side checks of the values ran at capture time, on the first layout). Run for the seed's width 4 +
SiLU and for width 7 without activation (SPEC 1b: graphs hold for every width and activation).
"""

import warnings

import pytest
import torch

from cakeconv import (
    cake_causal_conv1d_det_train_backward,
    cake_causal_conv1d_det_train_backward_workspace_bytes,
    cake_causal_conv1d_det_train_forward,
)

pytestmark = pytest.mark.gpu


def _batch(S, C, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(S, C, device="cuda", generator=g).bfloat16()
    dy = torch.randn(S, C, device="cuda", generator=g).bfloat16()
    return x, dy


def _allocations():
    """Allocations the CUDA caching allocator has made so far (a counter that only grows)."""
    return torch.cuda.memory_stats()["allocation.all.allocated"]


def _short_documents(S, n, seed):
    """n + 1 sorted boundaries over S tokens: n documents of random lengths (empty ones too)."""
    g = torch.Generator().manual_seed(seed)
    cuts = torch.sort(torch.randint(0, S + 1, (n - 1,), generator=g)).values
    return [0] + cuts.tolist() + [S]


LAYOUTS = {
    # name: (S, cu at capture, cu copied in before the third replay); the same number of entries
    "four_documents": (65536, [0, 3, 20000, 20001, 65536], [0, 999, 1000, 50000, 65536]),
    # 5+ documents: the kernels read per-token segment indices, whose build is captured too
    "short_documents": (65536, _short_documents(65536, 4000, 1), _short_documents(65536, 4000, 2)),
    # one group of the dweight tree: the one-group kernel, whose ticket counters the graph takes
    # from its workspace and zeroes with a captured memset
    "one_group": (8192, [0, 3, 4000, 8192], [0, 100, 101, 8192]),
}


@pytest.mark.parametrize("W,activation", [(4, "silu"), (7, None)], ids=["W4_silu", "W7_None"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_single_rank_graph_replay_matches_eager(layout, W, activation):
    S, cu_capture, cu_later = LAYOUTS[layout]
    C = 1024
    w = torch.randn(C, W, device="cuda")
    b = torch.randn(C, device="cuda")
    cu = torch.tensor(cu_capture, dtype=torch.int32, device="cuda")
    x_s, dy_s = (t.clone() for t in _batch(S, C, 0))  # static inputs
    y_s = torch.empty_like(x_s)
    dx_s = torch.empty_like(x_s)
    ws = torch.empty(cake_causal_conv1d_det_train_backward_workspace_bytes(S, C, width=W), dtype=torch.uint8,
                     device="cuda")

    def step():
        cake_causal_conv1d_det_train_forward(x_s, w, b, cu, out=y_s, activation=activation)
        return cake_causal_conv1d_det_train_backward(dy_s, x_s, w, b, cu, dx=dx_s, workspace=ws, activation=activation)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # warm-up on the capture stream: compile, validate cu once
            step()
    torch.cuda.current_stream().wait_stream(stream)
    # What a capture allocates by itself, measured with an empty capture: on the H200s (torch 2.11)
    # every capture made 2 allocations of its own, empty or not, with or without another graph alive.
    empty = torch.cuda.CUDAGraph()
    before = _allocations()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns that the graph is empty: it is meant to be
        with torch.cuda.graph(empty):
            pass
    by_capture = _allocations() - before
    del empty
    graph = torch.cuda.CUDAGraph()
    before = _allocations()
    with torch.cuda.graph(graph):
        _, dw_s, db_s = step()
    # the workspace entry points allocate nothing inside the graph (SPEC 6), segment indices included
    by_step = _allocations() - before - by_capture
    assert by_step == 0, f"the step allocated {by_step} times inside the capture (an empty capture: {by_capture})"

    # The static buffers the graph writes: y, dx, and dweight/dbias (views into the workspace).
    static = {"y": y_s, "dx": dx_s, "dweight": dw_s, "dbias": db_s}
    spans = {k: (t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for k, t in static.items()}
    for a in spans:  # no two outputs share memory: one replay's dweight cannot overwrite its dbias, dx or y
        for c in spans:
            if a < c:
                assert spans[a][1] <= spans[c][0] or spans[c][1] <= spans[a][0], f"{a} and {c} overlap"

    first_kept = first_eager = None
    for seed in (1, 2, 3):
        if seed == 3:  # a new document layout (same number of entries) copied into the captured cu
            cu.copy_(torch.tensor(cu_later, dtype=torch.int32, device="cuda"))
        x, dy = _batch(S, C, seed)
        x_s.copy_(x)
        dy_s.copy_(dy)
        graph.replay()
        torch.cuda.synchronize()
        y_e = cake_causal_conv1d_det_train_forward(x, w, b, cu, activation=activation)
        dx_e, dw_e, db_e = cake_causal_conv1d_det_train_backward(dy, x, w, b, cu, activation=activation)
        eager = {"y": y_e, "dx": dx_e, "dweight": dw_e, "dbias": db_e}
        for k in static:
            assert torch.equal(static[k], eager[k]), f"replay {seed}: {k} differs from eager"
        if seed == 1:
            # What a caller keeps of this replay (SPEC 6: "replays must not corrupt gradients of an
            # earlier replay still in use"): clones, made before the next replay.
            first_kept = {k: t.clone() for k, t in static.items()}
            first_eager = eager
        else:
            # This replay rewrote every static buffer (new data) ...
            for k in static:
                assert not torch.equal(static[k], first_eager[k]), f"replay {seed} did not rewrite {k}"
            # ... and the first replay's kept results are still the first replay's (a keep that
            # aliased a static buffer would now hold this replay's values).
            for k in static:
                assert torch.equal(first_kept[k], first_eager[k]), f"replay {seed} changed the first replay's kept {k}"
                assert first_kept[k].data_ptr() != static[k].data_ptr()
