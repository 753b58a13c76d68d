"""Helpers shared by the test modules (inputs, tolerances, error measures)."""

import os

import torch

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

# Relative-to-scale tolerances against the float64 oracle: max|got - oracle| / max(1, max|oracle|).
# FP32 arithmetic is far under 1e-5; bf16/fp16 outputs are rounded once (half an ulp: 2**-9 / 2**-12).
TOLERANCES = {torch.float32: 2e-5, torch.bfloat16: 8e-3, torch.float16: 1.5e-3}


def random_cu_seqlens(S: int, gen: torch.Generator, short: bool = True) -> torch.Tensor:
    """Random document boundaries over S tokens with empty and 1-3 token documents mixed in."""
    cuts = [0]
    while cuts[-1] < S:
        r = torch.rand((), generator=gen).item()
        if short and r < 0.15:
            n = 0
        elif short and r < 0.45:
            n = int(torch.randint(1, 4, (), generator=gen))
        else:
            n = int(torch.randint(4, max(5, S // 3), (), generator=gen))
        cuts.append(min(S, cuts[-1] + n))
    if torch.rand((), generator=gen).item() < 0.5:
        cuts.append(S)  # an empty document at the end
    return torch.tensor(cuts, dtype=torch.int32)


def deal_fragments(rng, T: int, P: int, lengths=(1, 1, 2, 2, 3, 4, 5)) -> list[list[tuple[int, int]]]:
    """[0, T) cut into spans of the given lengths (``rng.choice``), dealt round-robin in a shuffled
    order to P ranks (every rank gets some when there are at least P spans), each rank's local
    order shuffled: a fragment table for ``build_kcp_context(..., fragments=...)``."""
    spans, pos = [], 0
    while pos < T:
        n = rng.choice(lengths)
        spans.append((pos, min(T, pos + n)))
        pos += n
    frags = [[] for _ in range(P)]
    owners = [i % P for i in range(len(spans))]
    rng.shuffle(owners)
    for span, r in zip(spans, owners):
        frags[r].append(span)
    for f in frags:
        rng.shuffle(f)
    return frags


def make_inputs(S, C, dtype=torch.bfloat16, wdtype=torch.float32, bias=True, seed=0, device="cpu"):
    """Random x [S, C], weight [C, 4], bias [C], dy [S, C] (never zeros)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(S, C, generator=gen).to(dtype)
    w = (torch.randn(C, 4, generator=gen) * 0.5).to(wdtype)
    b = (torch.randn(C, generator=gen) * 0.5).to(wdtype) if bias else None
    dy = torch.randn(S, C, generator=gen).to(dtype)
    out = [x, w, b, dy]
    return [t.to(device) if t is not None else None for t in out]


def rel_err(got, ref):
    got = got.double().cpu()
    ref = ref.double().cpu()
    if ref.numel() == 0:
        return 0.0
    return (got - ref).abs().max().item() / max(1.0, ref.abs().max().item())


def pairwise_rows(v: torch.Tensor) -> torch.Tensor:
    """Pairwise tree sum over the rows of v [2**k, ...]: ((r0 + r1) + (r2 + r3)) + ..."""
    while v.shape[0] > 1:
        v = v[0::2] + v[1::2]
    return v[0]


def backward_tree_from_nodes(ws_F: torch.Tensor, S: int, C: int, R: int):
    """The backward's levels above its nodes, redone with torch adds in the documented order.

    ws_F: the workspace after a Triton backward with configuration R; its first
    cdiv(S, BWD_SUB * R) * 5 * C floats are the nodes [n_nodes, 5, C] (each the sum of R leaves of
    BWD_SUB rows). Returns (group sums [G, 5, C], dw [C, 4], db [C]) in FP32: groups of
    TREE_LEAVES / R nodes (missing nodes 0) as pairwise trees, then each block of 64 groups as a
    pairwise tree (missing groups 0) and the block sums added in block order. Every add is one
    IEEE FP32 add, so these are the bits the kernel must produce.
    """
    from cakeconv.cake_causal_conv1d_det_train_backend.kernels.backward import BWD_SUB, TREE_LEAVES

    n_nodes = -(-S // (BWD_SUB * R))
    m = TREE_LEAVES // R
    n_groups = -(-S // (BWD_SUB * TREE_LEAVES))
    nodes = ws_F[: n_nodes * 5 * C].view(n_nodes, 5, C)
    padded = torch.zeros(n_groups * m, 5, C, dtype=torch.float32, device=ws_F.device)
    padded[:n_nodes] = nodes
    gs = torch.stack([pairwise_rows(padded[g * m:(g + 1) * m]) for g in range(n_groups)])
    n_blocks = -(-n_groups // 64)
    gpad = torch.zeros(n_blocks * 64, 5, C, dtype=torch.float32, device=ws_F.device)
    gpad[:n_groups] = gs
    total = torch.zeros(5, C, dtype=torch.float32, device=ws_F.device)
    for k in range(n_blocks):
        total = total + pairwise_rows(gpad[k * 64:(k + 1) * 64])
    return gs, total[:4].t().contiguous(), total[4].clone()
