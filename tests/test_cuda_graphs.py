"""Tier 4 (GPU): the single-rank forward + backward captured once in a CUDA graph and replayed.

Written against SPEC section 6 with the workspace entry points (no allocation inside the graph).
The caller owns the static buffers: ``y``, ``dx`` and the workspace (which holds dweight and
dbias) are overwritten by every replay, so a caller that keeps a replay's gradients clones them
before the next replay -- the test does exactly that and checks the clones survive. A new
document layout with the same number of cu_seqlens entries is copied into the captured cu_seqlens
tensor and replayed without re-capture (the kernels read the boundaries from the device; the
host-side checks of the values ran at capture time, on the first layout).
"""

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


def test_single_rank_graph_replay_matches_eager():
    S, C = 65536, 1024
    w = torch.randn(C, 4, device="cuda")
    b = torch.randn(C, device="cuda")
    cu = torch.tensor([0, 3, 20000, 20001, S], dtype=torch.int32, device="cuda")
    x_s, dy_s = (t.clone() for t in _batch(S, C, 0))  # static inputs
    y_s = torch.empty_like(x_s)
    dx_s = torch.empty_like(x_s)
    ws = torch.empty(cake_causal_conv1d_det_train_backward_workspace_bytes(S, C), dtype=torch.uint8, device="cuda")

    def step():
        cake_causal_conv1d_det_train_forward(x_s, w, b, cu, out=y_s)
        return cake_causal_conv1d_det_train_backward(dy_s, x_s, w, b, cu, dx=dx_s, workspace=ws)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # warm-up on the capture stream: compile, validate cu once
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _, dw_s, db_s = step()

    kept = []
    for seed in (1, 2, 3):
        if seed == 3:  # a new document layout (same number of entries) copied into the captured cu
            cu.copy_(torch.tensor([0, 999, 1000, 50000, S], dtype=torch.int32, device="cuda"))
        x, dy = _batch(S, C, seed)
        x_s.copy_(x)
        dy_s.copy_(dy)
        graph.replay()
        torch.cuda.synchronize()
        y_e = cake_causal_conv1d_det_train_forward(x, w, b, cu)
        dx_e, dw_e, db_e = cake_causal_conv1d_det_train_backward(dy, x, w, b, cu)
        assert torch.equal(y_s, y_e) and torch.equal(dx_s, dx_e)
        assert torch.equal(dw_s, dw_e) and torch.equal(db_s, db_e)
        kept.append((dx_s.clone(), dw_s.clone(), db_s.clone(), dx_e, dw_e, db_e))
    # The clones of the first replay's gradients survived the later replays.
    first = kept[0]
    assert torch.equal(first[0], first[3]) and torch.equal(first[1], first[4]) and torch.equal(first[2], first[5])
