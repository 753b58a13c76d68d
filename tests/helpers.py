"""Helpers shared by the test modules (inputs, tolerances, error measures)."""

import os

import pytest
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


def uniform_cuts(S: int, lo: int, hi: int, seed: int) -> list[int]:
    """Document boundaries (a list, 0 .. S) of documents of lo .. hi - 1 tokens, the last one cut at S."""
    gen = torch.Generator().manual_seed(seed)
    cuts = [0]
    while cuts[-1] < S:
        cuts.append(min(S, cuts[-1] + int(torch.randint(lo, hi, (), generator=gen))))
    return cuts


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


def make_inputs(S, C, dtype=torch.bfloat16, wdtype=torch.float32, bias=True, seed=0, device="cpu", width=4):
    """Random x [S, C], weight [C, W] (W = width), bias [C], dy [S, C] (never zeros)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(S, C, generator=gen).to(dtype)
    w = (torch.randn(C, width, generator=gen) * 0.5).to(wdtype)
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


def backward_tree_from_nodes(ws_F: torch.Tensor, S: int, C: int, R: int, width: int = 4):
    """The backward's levels above its nodes, redone with torch adds in the documented order.

    ws_F: the workspace after a Triton backward with configuration R at ``width`` taps; with
    (sub, leaves) = launch.leaf_tree(width) and K = width + 1 columns, its first
    cdiv(S, sub * R) * K * C floats are the nodes [n_nodes, K, C] (each the sum of R leaves of sub
    rows). Returns (group sums [G, K, C], dw [C, width], db [C]) in FP32: groups of leaves / R
    nodes (missing nodes 0) as pairwise trees, then each block of 64 groups as a pairwise tree
    (missing groups 0) and the block sums added in block order. Every add is one IEEE FP32 add,
    so these are the bits the kernel must produce.
    """
    from cakeconv.cake_causal_conv1d_det_train_backend.kernels.launch import leaf_tree

    sub, leaves, _ = leaf_tree(width)
    K = width + 1
    n_nodes = -(-S // (sub * R))
    m = leaves // R
    n_groups = -(-S // (sub * leaves))
    nodes = ws_F[: n_nodes * K * C].view(n_nodes, K, C)
    padded = torch.zeros(n_groups * m, K, C, dtype=torch.float32, device=ws_F.device)
    padded[:n_nodes] = nodes
    gs = torch.stack([pairwise_rows(padded[g * m:(g + 1) * m]) for g in range(n_groups)])
    n_blocks = -(-n_groups // 64)
    gpad = torch.zeros(n_blocks * 64, K, C, dtype=torch.float32, device=ws_F.device)
    gpad[:n_groups] = gs
    total = torch.zeros(K, C, dtype=torch.float32, device=ws_F.device)
    for k in range(n_blocks):
        total = total + pairwise_rows(gpad[k * 64:(k + 1) * 64])
    return gs, total[:width].t().contiguous(), total[width].clone()


# ------------------------------------------------------- "rounded once": per-element ulp checks

U = 2.0 ** -24  # FP32 unit roundoff


@pytest.fixture
def one_thread():
    """One intra-op thread: the oracle's float64 grouped conv1d is ~500x slower with 2 threads on a
    busy 2-core machine (5 s instead of 0.01 s per call). Use with ``pytest.mark.usefixtures``."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def doc_bounds(cu, S):
    """(start, stop) of every row's document, int64 [S] each."""
    t = torch.arange(S)
    d = torch.searchsorted(cu.long(), t, right=True) - 1
    return cu.long()[d], cu.long()[d + 1]


def pre_and_terms(x, w, b, cu):
    """float64 pre[t] and A[t] = |b| + sum_k |w_k x[t-H+k]| (W = w.shape[1], H = W - 1; rows before
    the document read as zero)."""
    S, C = x.shape
    H = w.shape[1] - 1
    start, _ = doc_bounds(cu, S)
    x64, w64 = x.double(), w.double()
    t = torch.arange(S)
    pre = torch.zeros(S, C, dtype=torch.float64) if b is None else b.double().expand(S, C).clone()
    A = torch.zeros(S, C, dtype=torch.float64) if b is None else b.double().abs().expand(S, C).clone()
    for k in range(H + 1):
        src = t - H + k
        xk = torch.where((src >= start)[:, None], x64[src.clamp(min=0)], torch.zeros((), dtype=torch.float64))
        pre += w64[:, k] * xk
        A += (w64[:, k] * xk).abs()
    return pre, A


def error_bounds(x, w, b, dy, cu, activation="silu"):
    """Bounds (float64 [S, C] each) of the FP32 evaluation error of y and dx, for W = w.shape[1]:

        y:  E = (W + 4) u (A + |y|)
        dx: E = (W + 4) u sum_k |w_{H-k}| |dy[t+k]| P[t+k],  P = A + 1 + |pre| (SiLU) or 1 (None)

    (for W = 4: 8 u, as tests/test_reference_ulp.py derives; the sum of W + 1 terms adds W u A).
    """
    S = x.shape[0]
    W = w.shape[1]
    pre, A = pre_and_terms(x, w, b, cu)
    y = pre * torch.sigmoid(pre) if activation == "silu" else pre
    per_row = dy.double().abs() * ((A + 1 + pre.abs()) if activation == "silu" else 1.0)
    _, stop = doc_bounds(cu, S)
    t = torch.arange(S)
    err = torch.zeros_like(A)
    for k in range(W):
        src = t + k
        inside = (src < stop)[:, None]
        err += w.double()[:, W - 1 - k].abs() * torch.where(inside, per_row[src.clamp(max=S - 1)],
                                                            torch.zeros((), dtype=torch.float64))
    return (W + 4) * U * (A + y.abs()), (W + 4) * U * err


def ordered_bits(v: torch.Tensor) -> torch.Tensor:
    """A 16-bit float's bits as an int64 that counts ulps monotonically (-0 and +0 both 0)."""
    i = v.view(torch.int16).long()
    return torch.where(i < 0, -(i & 0x7FFF), i)


def round_once(v64: torch.Tensor, dtype) -> torch.Tensor:
    """float64 -> dtype, monotonic (through FP32; exact on the elements the checks decide)."""
    return v64.float().to(dtype)


def check_rounded_once(got, oracle64, err64, dtype, what, min_decided=0.85):
    """got (a 16-bit dtype tensor) is the float64 oracle rounded once, given the FP32 error bound
    err64: bitwise on every "decided" element ([oracle - E, oracle + E] rounds to one value; at
    least ``min_decided`` of them), between the two roundings elsewhere, and never more than 1 ulp
    from the once-rounded oracle where the bound spans at most 1 ulp. Returns the decided fraction."""
    assert got.dtype == dtype and got.shape == oracle64.shape
    lo, hi, r = round_once(oracle64 - err64, dtype), round_once(oracle64 + err64, dtype), round_once(oracle64, dtype)
    og, olo, ohi, orr = ordered_bits(got), ordered_bits(lo), ordered_bits(hi), ordered_bits(r)
    decided = olo == ohi
    frac = decided.double().mean().item()
    assert frac >= min_decided, f"{what}: only {frac:.3f} of the elements are decided (the error bound is too loose to test)"
    bad = decided & (og != orr)
    if bad.any():
        i = torch.nonzero(bad)[0].tolist()
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {int(decided.sum())} decided elements are not the oracle rounded once "
            f"(first at {i}: got {got[tuple(i)].item()!r}, oracle {oracle64[tuple(i)].item()!r} -> "
            f"{r[tuple(i)].item()!r}, bound {err64[tuple(i)].item():.3g})")
    between = (og >= torch.minimum(olo, ohi)) & (og <= torch.maximum(olo, ohi))
    assert bool(between.all()), f"{what}: {int((~between).sum())} undecided elements outside [round(o - E), round(o + E)]"
    narrow = (ohi - olo).abs() <= 1
    far = narrow & ((og - orr).abs() > 1)
    assert not bool(far.any()), f"{what}: {int(far.sum())} elements more than 1 ulp from the once-rounded oracle"
    return frac


# A GPU script's body (tests/test_warmup.py, tests/test_compile_ahead.py): mamba_ssm's fused-path calls of
# causal-conv1d's pair on cakeconv, x and dx slices of a [B, T, 520] projection, at token and document counts
# that reach every kernel variant of the layout; the script defines ``events`` and the listener before it.
MAMBA_PAIR_STEPS = """
from cakeconv.integrations import dao
C, Z = 256, 520
for B, T, docs in ((1, 4096, 3), (1, 8320, 2080), (2, 2048, None)):
    zx = torch.randn(B, T, Z, device="cuda", dtype=torch.bfloat16)
    dz = torch.zeros_like(zx)
    x, dx = zx[..., :C].transpose(1, 2), dz[..., :C].transpose(1, 2)
    w, b = torch.randn(C, 4, device="cuda"), torch.randn(C, device="cuda")
    seq_idx = None if docs is None else (torch.arange(T, device="cuda") * docs // T).int()[None]
    y = dao.causal_conv1d_fwd_function(x, w, b, seq_idx, None, None, True)
    dao.causal_conv1d_bwd_function(x, w, b, torch.randn_like(y.transpose(1, 2).contiguous()).transpose(1, 2),
                                   seq_idx, None, None, dx, False, True)
torch.cuda.synchronize()
"""


class FakeWarmup:
    """A background warm-up process (compile_ahead.spawn_warmup) that ends when ``release`` is set (at
    once by default), with ``returncode`` and ``stderr``."""

    def __init__(self, returncode=0, stderr="", release=None):
        self.returncode, self.stderr, self.release, self.pid = returncode, stderr, release, None

    def poll(self):
        return None if self.release is not None and not self.release.is_set() else self.returncode

    def communicate(self):
        if self.release is not None:
            assert self.release.wait(60), "not released"
        return None, self.stderr
