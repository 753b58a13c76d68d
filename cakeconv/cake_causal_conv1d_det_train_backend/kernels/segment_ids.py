"""Per-token segment indices for the kernels' many-segment programs (packed short documents).

Shape legend: S packed tokens, N segments, N1 = N + 1 boundaries.

Without them, a program of the forward or backward kernel that touches more than FEW_SEGMENTS
segments places each of its rows by a binary search over ``cu`` (about log2 of its segment count in
dependent loads, for every row of every loop step). With thousands of short documents most programs
are such. Once per ``cu_seqlens``, ``cake_segment_ids_kernel`` writes the int32 buffer

    [cu[0], ..., cu[N], ids[0], ..., ids[S - 1]]      ids[t] = max{d : cu[d] <= t}

(the segment of token t; empty segments never hold a token), and the main kernels, launched with
``HAS_CU == SEGMENT_IDS``, load each row's index once and compare neighbouring rows' indices
(kernels/common.py, history_flags). They compute the same masks for every row either way, so no
bit of any result changes. The buffer costs 4 bytes
per token (0.2% of the forward's traffic at C = 512 in bf16).

``SegmentIdsCache`` keeps one buffer per ``cu_seqlens`` tensor, checked by identity, version, S and
stream, like the validation of ``cu_seqlens``: a training loop that passes one ``cu_seqlens`` to
many layers builds it once, and the entry goes with its tensor. Under CUDA-graph capture the build
is captured too: each replay rebuilds the indices from the ``cu`` it reads then (a new layout
copied into the captured ``cu`` is seen), into the buffer the warm-up call built (no allocation
inside the graph, the workspace entry points' promise), and the captured kernels are the warm-up's
(a kernel compiled inside a capture would fail to load).
"""

from __future__ import annotations

import weakref

import torch
import triton
import triton.language as tl

from .common import search_iters

# Segments at or below this count never need the indices: a program then touches at most all
# of them, FEW_SEGMENTS (kernels/common.py), and places its rows with no loads at all.
MIN_SEGMENTS = 5
# Below this many channels the indices are taken only for documents of at most this mean length.
# Launched with HAS_CU == SEGMENT_IDS, the backward kernel at C = 128 ran 10% slower on programs
# that never read them (H200, S = 250,340, seed mix: forward+backward 0.60 against 0.66 of the
# copy bandwidth; documents of 1-1,024 tokens: 0.55 against 0.63), while with documents of 1-64
# tokens the indices win at every C (0.42 against 0.37 at C = 128). At C >= 512 they never lost.
SMALL_C = 512
SMALL_C_MAX_MEAN_LENGTH = 128


def use_segment_ids(n_seg: int, S: int, C: int) -> bool:
    """True when the main kernels read per-token segment indices: n_seg segments of S tokens, C channels.

    A speed choice only (the kernels compute the same bits either way): many segments, and at
    small C short documents too (see SMALL_C).
    """
    if n_seg < MIN_SEGMENTS or S <= 0 or n_seg + 1 + S >= 2**31:
        return False
    return C >= SMALL_C or S <= SMALL_C_MAX_MEAN_LENGTH * n_seg


@triton.jit(do_not_specialize=["n1", "S"])
def cake_segment_ids_kernel(cu_ptr, out_ptr, n1, S, BLOCK: tl.constexpr):
    """out[i] = cu[i] for i < n1; out[n1 + t] = max{d : cu[d] <= t} for t < S.

    Grid: (cdiv(max(n1, S), BLOCK),). cu (int32 or int64, sorted, cu[0] = 0, cu[n1 - 1] = S) is
    searched per lane, ceil(log2(n1)) rounds; the answer lies in [0, n1 - 2] since cu[n1 - 1] = S > t.
    """
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    bmask = i < n1
    tl.store(out_ptr + i, tl.load(cu_ptr + i, mask=bmask, other=0).to(tl.int32), mask=bmask)
    tmask = i < S
    lo = tl.zeros_like(i)  # invariant: cu[lo] <= t (cu[0] = 0); the answer lies in [lo, hi]
    hi = tl.zeros_like(i) + (n1 - 1)
    n_iter = search_iters(n1 - 1)
    it = 0 * n_iter
    while it < n_iter:  # a while loop: the CPU interpreter cannot range() over a tensor
        mid = (lo + hi + 1) // 2
        ok = tl.load(cu_ptr + mid, mask=tmask, other=0) <= i
        lo = tl.where(ok, mid, lo)
        hi = tl.where(ok, hi, mid - 1)
        it += 1
    tl.store(out_ptr + n1 + i, lo, mask=tmask)


class SegmentIdsCache:
    """One [cu | ids] buffer per ``cu_seqlens`` tensor (module docstring).

    ``get(cu_N1, S, stream, capturing, fill)``: the buffer for S tokens on the raw CUDA stream
    ``stream`` (0 on the CPU; a buffer built on one stream is not handed to another, which could
    read it before it is written). ``fill(cu_N1, out)`` launches the build. Eager: a valid entry is
    reused, else a buffer is allocated and built. Capturing: the build is captured into the entry's
    buffer, whatever stream built it (allocated only if no call before built one for this tensor
    and S); the entry is then stale for eager calls (replays rewrite it) and its buffer is kept
    alive with ``cu_seqlens``, for the graph.
    """

    MAX_ENTRIES = 64  # entries of live tensors; the oldest not used by a graph goes first

    def __init__(self):
        self._entries: dict = {}

    def get(self, cu_N1, S, stream, capturing, fill, cache=True):
        n1 = cu_N1.shape[0]
        key = id(cu_N1)
        entry = self._entries.get(key)
        if entry is not None and entry["ref"]() is not cu_N1:
            entry = None
        if capturing:
            # Any stream's buffer will do: capture begins after a device synchronize, and the replays
            # write it in stream order before the captured kernels read it.
            if entry is None or entry["buf"].shape[0] != n1 + S:
                entry = self._store(key, cu_N1, S, stream, self._new(n1, S, cu_N1.device), entry)
            fill(cu_N1, entry["buf"])
            entry["version"] = -1  # eager calls build their own: every replay rewrites this one
            if not any(b is entry["buf"] for b in entry["graph_bufs"]):
                entry["graph_bufs"].append(entry["buf"])
            return entry["buf"]
        if entry is not None and entry["version"] == cu_N1._version and entry["S"] == S and entry["stream"] == stream:
            return entry["buf"]
        buf = self._new(n1, S, cu_N1.device)
        fill(cu_N1, buf)
        if cache:
            self._store(key, cu_N1, S, stream, buf, entry)
        return buf

    @staticmethod
    def _new(n1, S, device):
        return torch.empty(n1 + S, dtype=torch.int32, device=device)

    def _store(self, key, cu_N1, S, stream, buf, previous):
        graph_bufs = previous["graph_bufs"] if previous is not None else []
        if previous is None and len(self._entries) >= self.MAX_ENTRIES:
            for k, e in list(self._entries.items()):
                if not e["graph_bufs"]:
                    del self._entries[k]
                    break
        entries = self._entries
        # The entry leaves with its tensor (a later tensor may get the same id).
        ref = weakref.ref(cu_N1, lambda _ref, key=key: entries.pop(key, None))
        entry = {"ref": ref, "version": cu_N1._version, "S": S, "stream": stream, "buf": buf, "graph_bufs": graph_bufs}
        self._entries[key] = entry
        return entry

    def __len__(self):
        return len(self._entries)

    def __contains__(self, cu_N1):
        entry = self._entries.get(id(cu_N1))
        return entry is not None and entry["ref"]() is cu_N1
