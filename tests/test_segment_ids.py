"""Per-token segment indices (kernels/segment_ids.py): the buffer, its cache, and the bits.

Tier 1 (CPU, no Triton kernels): the cache (one build per tensor, a rebuild after an in-place
change or on another stream, the entry gone with its tensor; under capture the warm-up's buffer
refilled and kept for the graph). Tier 2 (TRITON_INTERPRET=1): the build kernel against a loop over
the documents (empty documents and int64 boundaries included), and the main kernels with the
indices give the same bits as with the binary search they replace, for y, dx, dweight and dbias, on
document mixes whose programs touch many segments (the interpreter's forward programs hold 16 rows,
its backward leaves 64).
"""

from __future__ import annotations

import gc

import pytest
import torch

from cakeconv import cake_causal_conv1d_det_train_backward, cake_causal_conv1d_det_train_forward
from cakeconv.cake_causal_conv1d_det_train_backend.kernels import launch, segment_ids
from tests.helpers import INTERPRET, make_inputs, random_cu_seqlens


def _ids_by_loop(cu: list[int]) -> list[int]:
    ids = []
    for d in range(len(cu) - 1):
        ids += [d] * (cu[d + 1] - cu[d])
    return ids


def _fill_by_loop(cu_N1, out):
    """A stand-in for the build kernel (tier 1 has no Triton): counts its calls."""
    cu = cu_N1.tolist()
    out.copy_(torch.tensor(cu + _ids_by_loop(cu), dtype=torch.int32))
    _fill_by_loop.calls += 1


_fill_by_loop.calls = 0


def test_when_the_indices_are_used():
    assert not segment_ids.use_segment_ids(4, 1000, 512)  # at most FEW_SEGMENTS: the compare path, no loads
    assert segment_ids.use_segment_ids(5, 1000, 512)
    assert not segment_ids.use_segment_ids(5, 0, 512)
    assert not segment_ids.use_segment_ids(5, 2**31 - 6, 512)  # buffer offsets would pass int32
    # below 512 channels only for short documents (mean length at most 128 tokens)
    assert segment_ids.use_segment_ids(5, 640, 256)
    assert not segment_ids.use_segment_ids(5, 641, 256)
    assert segment_ids.use_segment_ids(5, 641, 512)


def test_cache_builds_once_per_tensor_version_and_stream():
    cache = segment_ids.SegmentIdsCache()
    cu = torch.tensor([0, 1, 2, 3, 4, 9], dtype=torch.int32)
    calls = _fill_by_loop.calls
    first = cache.get(cu, 9, 0, False, _fill_by_loop)
    assert first.tolist() == cu.tolist() + _ids_by_loop(cu.tolist())
    assert cache.get(cu, 9, 0, False, _fill_by_loop) is first
    assert _fill_by_loop.calls == calls + 1
    assert cache.get(cu.clone(), 9, 0, False, _fill_by_loop) is not first  # another tensor, another entry
    cu[1:5] = torch.tensor([2, 4, 6, 8], dtype=torch.int32)  # in place: version bump, rebuilt
    again = cache.get(cu, 9, 0, False, _fill_by_loop)
    assert again is not first and again.tolist() == [0, 2, 4, 6, 8, 9] + _ids_by_loop([0, 2, 4, 6, 8, 9])
    assert cache.get(cu, 9, 7, False, _fill_by_loop) is not again  # another stream: not shared
    unfilled = torch.tensor([0, 1, 2, 3, 4, 5], dtype=torch.int32)
    cache.get(unfilled, 5, 0, False, _fill_by_loop, cache=False)  # recorded launches: nothing kept
    assert unfilled not in cache
    assert cu in cache
    del cu
    gc.collect()
    assert len(cache) == 0


def test_capture_rebuilds_into_the_warm_up_buffer_and_keeps_it():
    """A captured call refills the buffer the warm-up built (no allocation inside the graph); eager
    calls after it get a buffer of their own, and the captured one lives as long as cu_seqlens."""
    cache = segment_ids.SegmentIdsCache()
    cu = torch.tensor([0, 1, 2, 3, 4, 9], dtype=torch.int32)
    warm = cache.get(cu, 9, 0, False, _fill_by_loop)
    calls = _fill_by_loop.calls
    assert cache.get(cu, 9, 0, True, _fill_by_loop) is warm  # captured: refilled in place
    assert cache.get(cu, 9, 5, True, _fill_by_loop) is warm  # the backward, on the capture stream
    assert _fill_by_loop.calls == calls + 2
    eager = cache.get(cu, 9, 0, False, _fill_by_loop)
    assert eager is not warm
    assert cache._entries[id(cu)]["graph_bufs"] == [warm]
    for i in range(segment_ids.SegmentIdsCache.MAX_ENTRIES + 3):  # eviction never drops a graph's buffer
        cache.get(torch.tensor([0, 1, 2, 3, 4, 5 + i], dtype=torch.int32), 5 + i, 0, False, _fill_by_loop)
    assert cu in cache


# ------------------------------------------------------------------- tier 2: the same bits

def _run(x, w, b, cu, dy, use_ids):
    previous = launch.use_ids
    launch.use_ids = use_ids
    try:
        y = cake_causal_conv1d_det_train_forward(x, w, b, cu, backend="triton")
        dx, dw, db = cake_causal_conv1d_det_train_backward(dy, x, w, b, cu, backend="triton")
    finally:
        launch.use_ids = previous
    return y, dx, dw, db


def _mix(name, S, gen):
    """int32 boundaries over S tokens: every document of length 1, uniform 1-8 (0-8: empty ones
    too), short documents around a long one that spans programs, or the tier's random mix."""
    if name == "random":
        return random_cu_seqlens(S, gen)
    if name == "ones":
        lens = [1] * S
    elif name == "uniform_1_8":
        lens = torch.randint(1, 9, (S,), generator=gen).tolist()
    elif name == "uniform_1_8_empty":
        lens = torch.randint(0, 9, (S,), generator=gen).tolist()
    else:
        lens = torch.randint(1, 4, (20,), generator=gen).tolist() + [90] + torch.randint(1, 6, (S,), generator=gen).tolist()
    cu = [0]
    for n in lens:
        if cu[-1] == S:
            break
        cu.append(min(S, cu[-1] + n))
    if name == "uniform_1_8_empty":
        cu.append(S)  # an empty document at the end
    return torch.tensor(cu, dtype=torch.int32)


@pytest.mark.interpret
@pytest.mark.parametrize("cu", [[0, 0, 1, 1, 4, 4], [0, 1, 2, 3, 4, 5, 6], [0, 3, 3, 3, 9, 10, 10], list(range(0, 41, 2))])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
def test_build_kernel_writes_cu_then_the_segment_of_every_token(cu, dtype):
    out = torch.full((len(cu) + cu[-1],), -7, dtype=torch.int32)
    launch.triton_segment_ids(torch.tensor(cu, dtype=dtype), out)
    assert out.tolist() == cu + _ids_by_loop(cu)


@pytest.mark.interpret
@pytest.mark.parametrize("mix,dtype,bias", [
    ("ones", torch.bfloat16, True),
    ("uniform_1_8_empty", torch.float32, False),
    ("short_long_short", torch.float16, True),
], ids=lambda v: v if isinstance(v, str) else None)
def test_kernels_with_indices_give_the_search_bits(mix, dtype, bias):
    S, C = 130, 16  # 9 forward programs of 16 rows, 3 backward leaves of 64 (interpreter configurations)
    gen = torch.Generator().manual_seed(len(mix) + S)
    cu = _mix(mix, S, gen)
    assert int(cu[0]) == 0 and int(cu[-1]) == S and bool((cu[1:] >= cu[:-1]).all())
    assert segment_ids.use_segment_ids(cu.shape[0] - 1, S, C), "the mix must take the indices"
    x, w, b, dy = make_inputs(S, C, dtype=dtype, bias=bias, seed=S + len(mix))
    with_ids = _run(x, w, b, cu, dy, True)
    searched = _run(x, w, b, cu, dy, False)
    for name, got, want in zip(("y", "dx", "dweight", "dbias"), with_ids, searched):
        if want is None:
            assert got is None
        else:
            assert torch.equal(got, want), f"{name} differs ({mix})"
