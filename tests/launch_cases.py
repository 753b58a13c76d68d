"""Problem cases that put every integer argument of every Triton kernel at 1, at multiples of 16
and at ordinary values (the values Triton specializes at launch, and the rest).

Used twice: on the CPU, recorded without launching (tests/test_specialization.py: every launch
compiles for sm_90 with Triton's own specialization, and equal launch keys mean equal
specializations); on the GPU, launched and compared (tests/test_gpu_specialization.py).

Each case is a function ``case(device, backend) -> dict`` that runs the public API forward and
backward and returns its results by name. Shape legend: S tokens, C channels, B batch rows,
T row length, P ranks.

Cases ending in ``_W<k>`` run width k, ``_none`` without the activation (SPEC 1b): each (W, activation)
compiles its own kernels. Which case reaches which value (kernel argument: values):
    forward, one-group main kernel    S: 1..4, 16, 17, 32, 100, 1000, 4096; C8: 1 (C = 8), 2, 3,
                                      16 (C = 128), 17 (C = 136); n_seg: 1, 3, 16, 17;
                                      seq_len: 1 ([B, 1, C]), 16, 17
    main kernel, 2+ groups            S: 8208, 16385, 131072; C8: 1, 2, 16; n_seg: 1, 8208; seq_len: 1
    group kernel (2+ groups)          n_nodes: 33, 256, ...; n_leaves: 257, 2048, ...; n_groups: 16 (S = 16 * 8192
                                      at C = 8), 3; C: 8, 16, 24, 128
    KCP row kernels (1-rank context)  n_rows: 1, 3, 7, 10, 16, 17, 48; S: 17, 32, 34, 40, 320; n_seg: 2, 7, 32, 34
    halo gather                       n_rows (D * H rows): 6, 21, 96, 102; C: 8, 16, 24, 128, 136
    segment-index build (5+ segments) n1: 6, 16, 17, 18, ...; S: 1, 16, 17, 100, ...
    a KCP rank of several (S_local: 1, 16; n_seg: 1; 1 row packed): RANK_CASES, recorded on the
    CPU with a stand-in process group (launched for real by the multi-GPU tier, tests/multigpu/)
"""

from __future__ import annotations

import torch

from cakeconv import build_kcp_context, cake_causal_conv1d_det, cake_causal_conv1d_det_kcp


# Integer arguments that never take the value 1 (by name, or (kernel, name)): 5 * C (C >= 8), C
# itself, row strides (>= 8 elements), n1 (the segment-index build runs for 5+ segments), and what
# only two or more groups of the dweight tree launch (S > 8192; one group is the one-group kernel's):
# the main kernel's S (and its quick twin's), the group kernel's node, leaf and group counts.
CANNOT_BE_ONE = {"C5", "C", "so", "sl", "sr", "n1", ("cake_conv_bwd_kernel", "S"), ("cake_conv_bwd_quick_kernel", "S"),
                 ("cake_conv_bwd_group_kernel", "n_nodes"), ("cake_conv_bwd_group_kernel", "n_leaves"),
                 ("cake_conv_bwd_group_kernel", "n_groups")}


def cannot_be_one(kernel: str, arg: str) -> bool:
    return arg in CANNOT_BE_ONE or (kernel, arg) in CANNOT_BE_ONE


def _inputs(S, C, seed, device, dtype=torch.bfloat16, wdtype=torch.float32, bias=True, width=4):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(S, C, generator=g).to(dtype)
    dy = torch.randn(S, C, generator=g).to(dtype)
    w = (torch.randn(C, width, generator=g) * 0.5).to(wdtype)
    b = (torch.randn(C, generator=g) * 0.5).to(wdtype) if bias else None
    return [t.to(device) if t is not None else None for t in (x, dy, w, b)]


def _single(S, C, cu, device, backend, seed=0, shape=None, bias=True, dtype=torch.bfloat16, wdtype=torch.float32,
            cu_dtype=torch.int32, width=4, activation="silu"):
    """Forward + backward of the single-rank op; x viewed as ``shape`` if given ([B, T, C])."""
    x, dy, w, b = _inputs(S, C, seed, device, dtype, wdtype, bias, width)
    if shape is not None:
        x, dy = x.view(shape), dy.view(shape)
    cu_t = None if cu is None else torch.tensor(cu, dtype=cu_dtype, device=device)
    leaves = [t.clone().requires_grad_(True) for t in (x, w) + ((b,) if b is not None else ())]
    y = cake_causal_conv1d_det(leaves[0], leaves[1], leaves[2] if b is not None else None, cu_seqlens=cu_t,
                               activation=activation, backend=backend)
    y.backward(dy)
    out = {"y": y.detach(), "dx": leaves[0].grad, "dw": leaves[1].grad}
    if b is not None:
        out["db"] = leaves[2].grad
    return out


def _kcp(cu, fragments, C, device, backend, seed=0, width=4, activation="silu"):
    """Forward + backward of the KCP op on a 1-rank context with an explicit fragment table
    (the fragments' halos come from the same rank: the row kernels and the halo gather run)."""
    T = cu[-1]
    x, dy, w, b = _inputs(T, C, seed, device, width=width)
    ctx = build_kcp_context(torch.tensor(cu, dtype=torch.int32, device=device), fragments=[fragments])
    xl = ctx.shard(x).requires_grad_(True)
    wl, bl = w.clone().requires_grad_(True), b.clone().requires_grad_(True)
    y = cake_causal_conv1d_det_kcp(xl, wl, ctx, bias=bl, activation=activation, backend=backend)
    y.backward(ctx.shard(dy))
    return {"y": y.detach(), "dx": xl.grad, "dw": wl.grad, "db": bl.grad, "index": ctx.local_token_indices,
            "fix_fwd": ctx.fix_fwd_rows.numel(), "fix_bwd": ctx.fix_bwd_rows.numel(), "segments": ctx.num_segments}


def _cu_every(S, n):
    """n documents of near-equal length over S tokens."""
    return [round(i * S / n) for i in range(n + 1)]


SINGLE_CASES = {
    # name: (S, C, cu, shape, bias, dtype, wdtype)
    "S1_C8_one_doc": (1, 8, [0, 1], None, True, torch.bfloat16, torch.float32),
    "S2_C16": (2, 16, None, None, False, torch.bfloat16, torch.float32),
    "S3_C24_two_docs": (3, 24, [0, 1, 3], None, True, torch.float32, torch.float32),
    "S4_C8_B4_T1": (4, 8, None, (4, 1, 8), True, torch.bfloat16, torch.bfloat16),
    "S16_C128_16_docs": (16, 128, list(range(17)), None, True, torch.bfloat16, torch.float32),
    # 5+ documents take per-token segment indices (kernels/segment_ids.py): their build at S = 1
    # (four empty documents) and with 16 boundaries (n1 = 16)
    "S1_C8_5_docs_4_empty": (1, 8, [0, 0, 0, 0, 0, 1], None, True, torch.bfloat16, torch.float32),
    "S100_C16_15_docs": (100, 16, _cu_every(100, 15), None, False, torch.bfloat16, torch.float32),
    "S17_C136_17_docs": (17, 136, list(range(18)), None, False, torch.float16, torch.float32),
    "S32_C16_B2_T16": (32, 16, None, (2, 16, 16), True, torch.bfloat16, torch.float32),
    "S34_C8_B2_T17": (34, 8, None, (2, 17, 8), True, torch.float32, torch.float32),
    "S100_C128_3_docs": (100, 128, [0, 1, 50, 100], None, True, torch.bfloat16, torch.float32),
    "S100_C128_3_docs_int64_cu": (100, 128, [0, 1, 50, 100], None, True, torch.bfloat16, torch.float32),
    "S1000_C16_1x3_S": (1000, 16, [0, 1000], (1, 1000, 16), True, torch.bfloat16, torch.float32),
    "S4096_C128_16_docs": (4096, 128, _cu_every(4096, 16), None, True, torch.bfloat16, torch.float32),
    "S800_C24_3_docs": (800, 24, [0, 300, 301, 800], None, True, torch.bfloat16, torch.float32),
    "S131072_C8_16_groups": (16 * 8192, 8, [0, 5, 16 * 8192], None, True, torch.bfloat16, torch.float32),
    "S16385_C16_2_groups": (16385, 16, [0, 16385], None, True, torch.bfloat16, torch.float32),
    # two groups with C8 = 16, 8208 one-token rows (n_seg = 8208, seq_len = 1): the main kernel's
    # values that the cases above reach only with one group (the one-group kernel)
    "S8208_C128_B8208_T1": (8208, 128, None, (8208, 1, 128), False, torch.bfloat16, torch.float32),
    # other widths and no activation (SPEC 1b): W and the activation are compile-time constants of the
    # kernels, so each (W, activation) is its own set of compiled kernels; (..., width, activation)
    "S1_C8_one_doc_W2": (1, 8, [0, 1], None, True, torch.bfloat16, torch.float32, 2, "silu"),
    "S100_C16_15_docs_W2_none": (100, 16, _cu_every(100, 15), None, False, torch.bfloat16, torch.float32, 2, None),
    "S4_C8_B4_T1_W3_none": (4, 8, None, (4, 1, 8), True, torch.bfloat16, torch.bfloat16, 3, None),
    "S16385_C16_2_groups_W3_none": (16385, 16, [0, 16385], None, True, torch.bfloat16, torch.float32, 3, None),
    "S800_C24_3_docs_W5": (800, 24, [0, 300, 301, 800], None, True, torch.bfloat16, torch.float32, 5, "silu"),
    # C = 512 without bias: the backward's step-branch pick; 64 documents: per-token indices, and at W = 5 +
    # SiLU the many-segment walk's step branch (the two middle programs of four, 512 rows each)
    "S2048_C512_64_docs_W5": (2048, 512, _cu_every(2048, 64), None, False, torch.bfloat16, torch.float32, 5, "silu"),
    "S17_C136_17_docs_W7_none": (17, 136, list(range(18)), None, False, torch.float16, torch.float32, 7, None),
    "S4096_C128_16_docs_W8": (4096, 128, _cu_every(4096, 16), None, True, torch.bfloat16, torch.float32, 8, "silu"),
    "S131072_C8_16_groups_W8_none": (16 * 8192, 8, [0, 5, 16 * 8192], None, True, torch.bfloat16, torch.float32, 8,
                                     None),
}

def _two_token_docs(n):
    """n documents of 2 tokens; each document's second token comes first in the local order, so
    every document has a 1-row segment with a history row and a 1-row segment with a future row."""
    cu = list(range(0, 2 * n + 1, 2))
    return cu, [(s + 1, s + 2) for s in range(0, 2 * n, 2)] + [(s, s + 1) for s in range(0, 2 * n, 2)]


KCP_CASES = {
    # name: (cu, fragments of the one rank, C)
    # one row to rewrite forward (a 1-token segment with history), three backward; then reversed
    "one_row_fwd": ([0, 40], [(0, 39), (39, 40)], 8),
    "one_row_bwd": ([0, 40], [(1, 40), (0, 1)], 8),
    # 16 and 17 two-token documents: 16 / 17 rows to rewrite each way, 32 / 34 segments
    "sixteen": (*_two_token_docs(16), 16),
    "seventeen": (*_two_token_docs(17), 136),
    # 1- and 2-token fragments in shuffled order: multi-hop halos within the rank
    "multi_hop": ([0, 9, 17], [(4, 5), (0, 2), (9, 10), (5, 6), (2, 4), (10, 17), (6, 9)], 24),
    # 16 documents of 20 tokens, cut in halves placed far apart: 48 rows each way, 32 segments
    "halves": (_cu_every(320, 16), [(a, a + 10) for a in range(0, 320, 20)] + [(a + 10, a + 20) for a in range(0, 320, 20)], 128),
    # other widths: halos of W - 1 rows over several 1- and 2-token fragments; (..., width, activation)
    "multi_hop_W8_none": ([0, 9, 17], [(4, 5), (0, 2), (9, 10), (5, 6), (2, 4), (10, 17), (6, 9)], 24, 8, None),
    "one_row_bwd_W3": ([0, 40], [(1, 40), (0, 1)], 8, 3, "silu"),
    "sixteen_W2_none": (*_two_token_docs(16), 16, 2, None),
}


def run_single(name, device, backend):
    S, C, cu, shape, bias, dtype, wdtype, *width_act = SINGLE_CASES[name]
    width, activation = width_act or (4, "silu")
    cu_dtype = torch.int64 if name.endswith("int64_cu") else torch.int32
    return _single(S, C, cu, device, backend, seed=S + C, shape=shape, bias=bias, dtype=dtype, wdtype=wdtype,
                   cu_dtype=cu_dtype, width=width, activation=activation)


def kcp_case(name):
    """(cu, fragments, C, width, activation) of a KCP case."""
    cu, fragments, C, *width_act = KCP_CASES[name]
    return (cu, fragments, C, *(width_act or (4, "silu")))


def run_kcp(name, device, backend):
    cu, fragments, C, width, activation = kcp_case(name)
    return _kcp(cu, fragments, C, device, backend, seed=len(fragments), width=width, activation=activation)


def run_kcp_single_rank(name, device, backend):
    """The single-rank op (forward + backward) on the whole batch and inputs of a KCP case:
    {"y", "dx", "dw", "db"} in global token order, what every KCP rank must match."""
    cu, fragments, C, width, activation = kcp_case(name)
    x, dy, w, b = _inputs(cu[-1], C, len(fragments), device, width=width)
    leaves = [t.clone().requires_grad_(True) for t in (x, w, b)]
    y = cake_causal_conv1d_det(*leaves, cu_seqlens=torch.tensor(cu, dtype=torch.int32, device=device),
                               activation=activation, backend=backend)
    y.backward(dy)
    return {"y": y.detach(), "dx": leaves[0].grad, "dw": leaves[1].grad, "db": leaves[2].grad}


class DroppedMessagesGroup:
    """A stand-in process group: messages go nowhere (recorded launches do not read the data; the
    warm-up of tests/multigpu/warm_kernels.py runs kernels on receive buffers left as allocated)."""

    class _Work:
        def wait(self):
            return True

    def send(self, tensors, peer, tag):
        return self._Work()

    recv = send


def _rank_context(cu, world_size, layout, rank):
    from cakeconv import KcpContext
    from cakeconv.cake_causal_conv1d_det_train_backend.kcp.plan import build_rank_plans, layout_fragments

    fragments = layout_fragments(cu, world_size, layout)
    plan = build_rank_plans(cu, fragments)[rank]
    return KcpContext(group=DroppedMessagesGroup(), layout=layout, fragments=fragments, global_cu_seqlens=cu,
                      device=torch.device("cpu"), plan=plan)


RANK_CASES = {
    # name: (cu, P, layout, rank, C): ranks inside one document (ONE local segment)
    "one_doc_2_ranks_rank1_S16": ([0, 32], 2, "contiguous", 1, 8),
    "one_doc_2_ranks_rank0_S16": ([0, 32], 2, "contiguous", 0, 16),
    "two_tokens_2_ranks_rank1_S1": ([0, 2], 2, "contiguous", 1, 8),
    "two_tokens_2_ranks_rank0_S1": ([0, 2], 2, "contiguous", 0, 24),
    # the multi form packs its tensors side by side: 1 row packed
    "two_tokens_2_ranks_rank0_S1_multi": ([0, 2], 2, "contiguous", 0, 16),
}


def record_kcp_rank(name):
    """Forward + backward of one rank of a several-rank context (recorded launches only)."""
    cu, world_size, layout, rank, C = RANK_CASES[name]
    ctx = _rank_context(cu, world_size, layout, rank)
    x, dy, w, b = _inputs(ctx.num_local_tokens, C, 0, "cpu")
    xl = x.requires_grad_(True)
    if name.endswith("multi"):
        from cakeconv import cake_causal_conv1d_det_multi_kcp

        x2, dy2, w2, _ = _inputs(ctx.num_local_tokens, 8, 1, "cpu")
        ys = cake_causal_conv1d_det_multi_kcp([xl, x2.requires_grad_(True)], [w, w2], ctx, biases=[b, None],
                                              backend="triton")
        torch.autograd.backward(ys, [dy, dy2])
        return ctx
    y = cake_causal_conv1d_det_kcp(xl, w, ctx, bias=b, backend="triton")
    y.backward(dy)
    return ctx
