"""Multi-GPU KCP tier (tier 5): every rank checks its own rows, over NCCL on N GPUs.

Run it with ``bash tests/multigpu/run.sh N`` (N = 2, 4 or 8; the script starts
``torchrun --standalone --nproc-per-node N tests/multigpu/kcp_nccl.py``). On a machine without CUDA
the same file runs over gloo on the CPU with the reference backend and smaller shapes (development:
``bash tests/multigpu/run.sh 2`` here); the CUDA-graph check then reports SKIP.

Every rank draws the same global batch from the same seed, computes the single-rank op
``cake_causal_conv1d_det`` of the WHOLE batch (same backend: Triton on CUDA) and checks its OWN
rows of the KCP op (``ctx.local_token_indices``):

    y_kcp == y_single[local tokens]  and  dx_kcp == dx_single[local tokens]     (bitwise)
    all_reduce(dweight_kcp), all_reduce(dbias_kcp) ~ dweight/dbias_single       (FP32 reordering)

Checks (``--list`` prints them; ``--only`` / ``--skip`` take comma-separated names):
  layouts        contiguous, zigzag, zigzag_per_document x {bf16, fp32} x {bias, no bias}
  fragments      explicit tables: random 1-5-token fragments (multi-hop halos), round-robin
                 1-token and 2-token fragments, a rank that holds no token, large permuted spans
  short_docs     thousands of short documents (lengths 0-8, and 2P or 4P per document)
  empty_docs     runs of empty documents at the start, the end and on fragment edges
  multi          the multi form (three tensors, C = 256, 128, 64, own taps, one without bias)
  widths         conv widths W = 2, 3, 5, 7, 8 with SiLU and without activation (SPEC 1b): every
                 layout, round-robin 1-token fragments at W = 8 (7-row halos over up to 7 ranks),
                 the multi form at W = 3 without activation, and (CUDA) a captured graph at W = 3
                 after one eager call of that width
  recompute      RecomputeHandleDetKcp under torch.utils.checkpoint (use_reentrant True and False)
  compile        torch.compile(fullgraph=True) of Linear -> KCP conv (single and multi form)
  cuda_graph     KCP forward + backward captured in a CUDA graph on every rank, replayed on new
                 data and, after ctx.load_layout_, on a new layout (CUDA only)
  subgroup       KCP on process sub-groups whose group ranks differ from the global ranks: the
                 last rank alone, the world in reversed order (new_group(sort_ranks=False)), and
                 with N >= 4 the two halves and the even / odd ranks (run side by side)
  fla_context    FLA's context parallelism: one FLACPContext (fla.ops.cp.build_cp_context where fla
                 imports, else the stand-in fields of tests/kcp/test_kcp_fla_context.py) through
                 cakeconv.integrations.fla.causal_conv1d, both FLA layouts, FP32 and BF16 taps
  one_document   one document over all ranks (each rank ONE segment, which once crashed), zigzag of
                 one document, one / sixteen tokens per rank, C = 8 (last: a crash ends
                 the run, so the checks before it report first)

Output: one ``PASS`` / ``FAIL`` / ``SKIP`` line per check per rank; at the end rank 0 prints every
rank's verdicts (all_gather_object) and every rank exits 1 if any check failed on any rank. A
check that RAISES on a rank (a crash, not a mismatch) may leave the other ranks inside a halo
exchange, so that rank prints the traceback and ends at once (exit 1): torchrun then ends the
others and the run fails. Mismatches never raise before the check's collectives are done.

Sizes: on CUDA, C = 256 for most cases (512 for one document) and T up to 65,536 tokens, so the
Triton kernels compile for few (dtype, bias, C) combinations; on the CPU, C = 16 and T / 16.
"""

from __future__ import annotations

import argparse
import datetime
import inspect
import os
import random
import sys
import time
import traceback

for _var, _val in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_var, _val)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # tests.helpers
from tests.helpers import deal_fragments  # noqa: E402

from tests.kcp.test_kcp_fla_context import fla_context_fields, make_context  # noqa: E402

from cakeconv import (  # noqa: E402
    RecomputeHandleDetKcp,
    build_kcp_context,
    cake_causal_conv1d_det,
    cake_causal_conv1d_det_kcp,
    cake_causal_conv1d_det_multi_kcp,
)
from cakeconv.integrations.fla import causal_conv1d, kcp_context_from_fla  # noqa: E402

BF16, FP32 = torch.bfloat16, torch.float32


# ------------------------------------------------------------------------------------ set-up

class Env:
    """This rank: process group, device, backend of the conv, and the sizes to use."""

    def __init__(self, pg_timeout_s: float, procs_per_gpu: int = 1):
        self.rank = int(os.environ["RANK"])
        self.world = int(os.environ["WORLD_SIZE"])
        self.local_rank = int(os.environ.get("LOCAL_RANK", self.rank))
        self.cuda = torch.cuda.is_available()
        # procs_per_gpu > 1: several ranks share a GPU (rank r on GPU r % n_gpus); the world is then
        # gloo and the KCP groups are NCCL groups of ranks on distinct GPUs (the subgroup check only).
        self.procs_per_gpu = procs_per_gpu
        self.n_gpus = self.world // procs_per_gpu
        assert self.n_gpus * procs_per_gpu == self.world, "WORLD_SIZE must be a multiple of --procs-per-gpu"
        self.group_backend = None
        if self.cuda:
            gpu = self.local_rank % self.n_gpus if procs_per_gpu > 1 else self.local_rank
            torch.cuda.set_device(gpu)
            self.device = torch.device("cuda", gpu)
            self.dist_backend, self.conv_backend = ("gloo" if procs_per_gpu > 1 else "nccl"), "auto"
            self.group_backend = "nccl" if procs_per_gpu > 1 else None
        else:
            torch.set_num_threads(1)
            self.device = torch.device("cpu")
            self.dist_backend, self.conv_backend = "gloo", "reference"
        dist.init_process_group(self.dist_backend, timeout=datetime.timedelta(seconds=pg_timeout_s))
        assert dist.get_rank() == self.rank and dist.get_world_size() == self.world
        # sizes: (T of the main cases, C of the main cases, C of one document over all ranks)
        self.T = 32768 if self.cuda else 2048
        self.C = 256 if self.cuda else 16
        self.C_one_doc = 512 if self.cuda else 16
        self.multi_C = (256, 128, 256) if self.cuda else (16, 8, 24)  # biases: (b, None, b)

    def tag(self) -> str:
        return f"[rank {self.rank}/{self.world}]"


class Checker:
    """Collects mismatches of one check (never raises, so every rank reaches every collective)."""

    def __init__(self, env: Env):
        self.env = env
        self.problems: list[str] = []
        self.cases = 0
        self.skip_reason: str | None = None

    def fail(self, msg: str) -> None:
        self.problems.append(msg)

    def expect(self, ok: bool, msg: str) -> None:
        if not ok:
            self.fail(msg)

    def equal(self, got: torch.Tensor, want: torch.Tensor, what: str) -> None:
        if got.shape != want.shape or got.dtype != want.dtype:
            self.fail(f"{what}: {tuple(got.shape)} {got.dtype} vs {tuple(want.shape)} {want.dtype}")
            return
        if torch.equal(got, want):
            return
        bad = (got != want) & ~(torch.isnan(got) & torch.isnan(want))
        n = int(bad.sum())
        first = torch.nonzero(bad)[0].tolist() if n else []
        self.fail(f"{what}: {n} of {got.numel()} elements differ (first at {first})")

    def close(self, got: torch.Tensor, want: torch.Tensor, what: str, rtol: float = 1e-4) -> None:
        """Within FP32 reordering: |got - want| <= rtol * max(1, max |want|)."""
        got, want = got.double(), want.double()
        scale = max(1.0, want.abs().max().item()) if want.numel() else 1.0
        err = (got - want).abs().max().item() if want.numel() else 0.0
        self.expect(err <= rtol * scale, f"{what}: max error {err:.3g} > {rtol:g} * {scale:.3g}")


# ------------------------------------------------------------------------------------ inputs

def global_inputs(env, T, C, dtype, bias, seed, width=4):
    """x, dy [T, C] (dtype) and FP32 taps [C, width] / bias, the same on every rank, on the device."""
    g = torch.Generator(device=env.device).manual_seed(seed)  # same stream on every rank's (identical) device
    x = torch.randn(T, C, generator=g, device=env.device).to(dtype)
    dy = torch.randn(T, C, generator=g, device=env.device).to(dtype)
    w = torch.randn(C, width, generator=g, device=env.device) * 0.5
    b = torch.randn(C, generator=g, device=env.device) * 0.5 if bias else None
    return [x, dy, w, b]


def mixed_cu(rng, T, P, n_clusters=30):
    """Documents spanning ranks, clusters of 1-3-token documents, empty documents (repeated
    boundaries, also at 0 and T), boundaries on fragment edges and 1-3 tokens off them."""
    unit = max(1, T // (2 * P))
    cuts = [0, 0, T, T]
    for k in range(1, 2 * P):
        r = rng.random()
        if r < 0.3:
            cuts.append(k * unit)
        elif r < 0.6:
            cuts.append(k * unit + rng.choice([-3, -2, -1, 1, 2, 3]))
    for _ in range(n_clusters):
        s = rng.randrange(T)
        for _ in range(rng.randint(1, 5)):
            s += rng.randint(1, 3)
            cuts.append(s)
    cuts = [min(max(c, 0), T) for c in cuts]
    cuts += [rng.choice(cuts) for _ in range(6)]
    return sorted(cuts)


def per_doc_cu(rng, P, n_docs, big_units):
    """zigzag_per_document batch: every length a multiple of 2P (0: empty; 2P: 1-token chunks)."""
    lens = [2 * P * rng.choice([0, 1, 1, 2, 2, 3, 5, rng.randint(1, 40)]) for _ in range(n_docs)]
    lens.append(2 * P * big_units)
    rng.shuffle(lens)
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    return cu


# ----------------------------------------------------------------------------------- the core

def single(env, x, dy, w, b, cu, activation="silu"):
    """The single-rank op of the whole batch: (y, dx, dweight, dbias)."""
    xs = x.clone().requires_grad_(True)
    ws = w.clone().requires_grad_(True)
    bs = b.clone().requires_grad_(True) if b is not None else None
    y = cake_causal_conv1d_det(xs, ws, bs, cu_seqlens=cu, activation=activation, backend=env.conv_backend)
    y.backward(dy)
    return y.detach(), xs.grad, ws.grad, (bs.grad if bs is not None else None)


def kcp_step(env, ctx, x, dy, w, b, activation="silu"):
    xl = ctx.shard(x).requires_grad_(True)
    wl = w.clone().requires_grad_(True)
    bl = b.clone().requires_grad_(True) if b is not None else None
    y = cake_causal_conv1d_det_kcp(xl, wl, ctx, bias=bl, activation=activation, backend=env.conv_backend)
    y.backward(ctx.shard(dy))
    return y.detach(), xl.grad, wl.grad, (bl.grad if bl is not None else None)


def compare(env, chk, label, ctx, got, want, group=None):
    """y, dx bitwise on this rank's rows; dweight/dbias after an all-reduce over the group."""
    y, dx, dw, db = got
    y_s, dx_s, dw_s, db_s = want
    idx = ctx.local_token_indices
    chk.equal(y, y_s[idx], f"{label}: y")
    chk.equal(dx, dx_s[idx], f"{label}: dx")
    dist.all_reduce(dw, group=group)
    chk.close(dw, dw_s, f"{label}: dweight (all-reduced)")
    if db_s is not None:
        dist.all_reduce(db, group=group)
        chk.close(db, db_s, f"{label}: dbias (all-reduced)")
    chk.cases += 1


def run_case(env, chk, label, cu_list, *, layout=None, fragments=None, C=None, dtype=BF16, bias=True, seed=0, group=None,
             width=4, activation="silu"):
    C = C or env.C
    T = cu_list[-1]
    t_case = time.time()
    x, dy, w, b = global_inputs(env, T, C, dtype, bias, seed, width)
    cu = torch.tensor(cu_list, dtype=torch.int32, device=env.device)
    want = single(env, x, dy, w, b, cu, activation)
    ctx = build_kcp_context(cu, layout=layout, fragments=fragments, group=group)
    gsize = dist.get_world_size(group) if group is not None else env.world
    grank = dist.get_rank(group) if group is not None else env.rank
    chk.expect(ctx.rank == grank and ctx.world_size == gsize,
               f"{label}: ctx.rank/world_size = {ctx.rank}/{ctx.world_size}, the group says {grank}/{gsize}")
    chk.expect(ctx.local_token_indices.device == env.device, f"{label}: local_token_indices on {ctx.local_token_indices.device}")
    got = kcp_step(env, ctx, x, dy, w, b, activation)
    width_text = "" if (width, activation) == (4, "silu") else f" W={width} activation={activation}"
    name = f"{label} [{layout or 'fragments'} {str(dtype)[6:]} bias={bias} T={T} C={C} D={ctx.num_segments}{width_text}]"
    compare(env, chk, name, ctx, got, want, group)
    dt = time.time() - t_case
    if dt > 5.0:  # where a check's time goes (one_document once took 142 s)
        print(f"{env.tag()}     slow case ({dt:.1f} s): {name}", flush=True)
    return ctx


# ------------------------------------------------------------------------------------ checks

CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


@check
def layouts(env, chk):
    rng = random.Random(11)
    P, T = env.world, env.T
    # Each (dtype, bias, C) compiles its own Triton kernels (seconds each): the tier uses bf16 with
    # a bias and FP32 without one (and bf16 without a bias in multi, compile and one_document).
    combos = [(BF16, True), (FP32, False)]
    for layout in ("contiguous", "zigzag", "zigzag_per_document"):
        for i, (dtype, bias) in enumerate(combos):
            if layout == "zigzag_per_document":
                cu = per_doc_cu(rng, P, 12, big_units=(T // (2 * P)) // 2)
            else:
                cu = mixed_cu(rng, T, P)
            run_case(env, chk, "layouts", cu, layout=layout, dtype=dtype, bias=bias, seed=100 + i)


@check
def fragments(env, chk):
    rng = random.Random(12)
    P = env.world
    T = 4000 if env.cuda else 600
    cu = mixed_cu(rng, T, P, n_clusters=40)
    run_case(env, chk, "random 1-5-token fragments", cu, fragments=deal_fragments(rng, T, P), seed=200)
    # round robin, 1 token each: a fragment's 3 history rows sit on 3 other fragments (ranks)
    T1 = 2048 if env.cuda else 256
    cu1 = [0, 1, 2, 5, 700 % T1, T1 - 9, T1]
    frags = [[(t, t + 1) for t in range(r, T1, P)] for r in range(P)]
    run_case(env, chk, "round-robin 1-token fragments", cu1, fragments=frags, dtype=FP32, bias=False, seed=201)
    # round robin, 2 tokens each, local order reversed
    frags = [[(t, t + 2) for t in range(2 * r, T1, 2 * P)][::-1] for r in range(P)]
    run_case(env, chk, "round-robin 2-token fragments (reversed local order)", cu1, fragments=frags, seed=202)
    # the last rank holds no token at all (S_local = 0)
    if P > 1:
        frags = deal_fragments(rng, T, P - 1) + [[]]
        run_case(env, chk, "a rank without tokens", cu, fragments=frags, seed=203)
    # large spans in a permuted order across ranks
    n = 3 * P
    edges = sorted(rng.sample(range(1, T), n - 1))
    spans = list(zip([0] + edges, edges + [T]))
    rng.shuffle(spans)
    frags = [spans[r::P] for r in range(P)]
    run_case(env, chk, "large permuted spans", cu, fragments=frags, seed=204)


@check
def short_docs(env, chk):
    rng = random.Random(14)
    P = env.world
    T = 2 * env.T
    cu = [0]
    while cu[-1] < T:
        cu.append(min(T, cu[-1] + rng.randint(0, 8)))
    chk.expect(len(cu) > (T // 8), f"short_docs: only {len(cu) - 1} documents")
    run_case(env, chk, f"{len(cu) - 1} short documents", cu, layout="contiguous", seed=400)
    run_case(env, chk, f"{len(cu) - 1} short documents", cu, layout="zigzag", dtype=FP32, bias=False, seed=401)
    lens = [2 * P * rng.choice([0, 1, 1, 2]) for _ in range(T // (4 * P))]
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    run_case(env, chk, f"{len(lens)} documents of 0, 2P or 4P tokens", cu, layout="zigzag_per_document", seed=402)


@check
def empty_docs(env, chk):
    P = env.world
    T = 64 * P
    unit = T // (2 * P)
    edges = [k * unit for k in range(1, 2 * P)]
    cu = [0] * 5 + sorted(edges + edges + [edges[0] + 1] * 3) + [T] * 5
    run_case(env, chk, "empty documents (contiguous)", cu, layout="contiguous", seed=500)
    run_case(env, chk, "empty documents (zigzag)", cu, layout="zigzag", dtype=FP32, bias=False, seed=501)
    cu = [0, 0, 0, 2 * P, 2 * P, 2 * P, 6 * P, 6 * P, T, T, T]
    run_case(env, chk, "empty documents (zigzag_per_document)", cu, layout="zigzag_per_document", seed=502)
    # a batch of only empty documents around one token per rank
    cu = [0, 0] + list(range(1, P + 1)) + [P] * 3
    run_case(env, chk, "1-token documents and empties", cu, layout="contiguous", seed=503)


def _multi_case(env, chk, label, cu_list, *, layout=None, fragments=None, seed=0, width=4, activation="silu"):
    T = cu_list[-1]
    cu = torch.tensor(cu_list, dtype=torch.int32, device=env.device)
    ctx = build_kcp_context(cu, layout=layout, fragments=fragments)
    data = [global_inputs(env, T, C, BF16, True, seed + i, width) for i, C in enumerate(env.multi_C)]
    data[1][3] = None  # the middle tensor without a bias
    xs = [ctx.shard(d[0]).requires_grad_(True) for d in data]
    ws = [d[2].clone().requires_grad_(True) for d in data]
    bs = [d[3].clone().requires_grad_(True) if d[3] is not None else None for d in data]
    ys = cake_causal_conv1d_det_multi_kcp(xs, ws, ctx, biases=bs, activation=activation, backend=env.conv_backend)
    torch.autograd.backward(list(ys), [ctx.shard(d[1]) for d in data])
    for i, d in enumerate(data):
        what = f"{label} tensor {i} (C = {env.multi_C[i]})"
        one = kcp_step(env, ctx, *d, activation)
        chk.equal(ys[i].detach(), one[0], f"{what}: multi y vs single-tensor KCP")
        chk.equal(xs[i].grad, one[1], f"{what}: multi dx vs single-tensor KCP")
        chk.equal(ws[i].grad, one[2], f"{what}: multi dweight vs single-tensor KCP")
        if bs[i] is not None:
            chk.equal(bs[i].grad, one[3], f"{what}: multi dbias vs single-tensor KCP")
        chk.expect((bs[i] is None) == (one[3] is None), f"{what}: dbias presence")
        want = single(env, d[0], d[1], d[2], d[3], cu, activation)
        compare(env, chk, what, ctx, (ys[i].detach(), xs[i].grad, ws[i].grad.clone(),
                                      bs[i].grad.clone() if bs[i] is not None else None), want)


@check
def multi(env, chk):
    rng = random.Random(16)
    P = env.world
    T = env.T // 4
    _multi_case(env, chk, "multi zigzag", mixed_cu(rng, T, P), layout="zigzag", seed=600)
    T = 1200 if env.cuda else 300
    cu = mixed_cu(rng, T, P, n_clusters=20)
    _multi_case(env, chk, "multi fragments", cu, fragments=deal_fragments(rng, T, P, (1, 2, 3)), seed=610)


@check
def widths(env, chk):
    rng = random.Random(19)
    P = env.world
    T = env.T // 4
    # (layout, W, activation): every layout, each width, both activations; bf16 with a bias (each
    # (W, activation) compiles its own Triton kernels)
    for i, (layout, W, act) in enumerate((("zigzag", 2, None), ("zigzag", 3, "silu"), ("contiguous", 5, None),
                                          ("zigzag_per_document", 7, "silu"), ("zigzag_per_document", 8, None))):
        cu = per_doc_cu(rng, P, 12, big_units=(T // (2 * P)) // 4) if layout == "zigzag_per_document" else mixed_cu(rng, T, P)
        run_case(env, chk, "widths", cu, layout=layout, seed=800 + i, width=W, activation=act)
    # round robin, 1 token each: a fragment's 7 history rows sit on up to 7 other ranks
    T1 = 2048 if env.cuda else 256
    cu1 = [0, 1, 2, 9, 700 % T1, T1 - 9, T1]
    frags = [[(t, t + 1) for t in range(r, T1, P)] for r in range(P)]
    for i, act in enumerate(("silu", None)):
        run_case(env, chk, "round-robin 1-token fragments", cu1, fragments=frags, seed=810 + i, width=8, activation=act)
    _multi_case(env, chk, "multi W = 3", mixed_cu(rng, T, P), layout="zigzag", seed=820, width=3, activation=None)
    if env.cuda:
        _graph_at_width(env, chk, width=3, activation=None)


def _graph_at_width(env, chk, width, activation):
    """A KCP forward + backward of width W captured after one eager call of that width (which
    builds the context's tables of W), replayed on new data: bitwise the single-rank op."""
    P, C = env.world, env.C
    T = 4096 * P
    cu = torch.tensor([0, 5, T // 3, T // 3 + 1, T], dtype=torch.int32, device=env.device)
    ctx = build_kcp_context(cu, layout="zigzag")
    g = torch.Generator().manual_seed(21)
    w = (torch.randn(C, width, generator=g) * 0.5).to(env.device).requires_grad_(True)
    b = (torch.randn(C, generator=g) * 0.5).to(env.device).requires_grad_(True)
    x_s = torch.zeros(ctx.num_local_tokens, C, dtype=BF16, device=env.device).requires_grad_(True)
    dy_s = torch.zeros(ctx.num_local_tokens, C, dtype=BF16, device=env.device)

    def step():
        y = cake_causal_conv1d_det_kcp(x_s, w, ctx, bias=b, activation=activation)
        y.backward(dy_s)
        return y

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # the eager calls: tables of the width, compile, connected peers
            x_s.grad = w.grad = b.grad = None
            step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    chk.expect(width in ctx.widths, f"graph W = {width}: the eager call built no tables ({ctx.widths})")
    x_s.grad = w.grad = b.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_s = step()
    torch.cuda.synchronize()
    for seed in (1, 2):
        gg = torch.Generator().manual_seed(seed)
        x = torch.randn(T, C, generator=gg).to(BF16).to(env.device)
        dy = torch.randn(T, C, generator=gg).to(BF16).to(env.device)
        with torch.no_grad():
            x_s.copy_(ctx.shard(x))
            dy_s.copy_(ctx.shard(dy))
        graph.replay()
        torch.cuda.synchronize()
        want = single(env, x, dy, w.detach(), b.detach(), cu, activation)
        compare(env, chk, f"cuda graph W = {width} activation={activation} replay {seed}", ctx,
                (y_s.detach().clone(), x_s.grad.clone(), w.grad.clone(), b.grad.clone()), want)


@check
def recompute(env, chk):
    rng = random.Random(17)
    P = env.world
    T = env.T // 4
    T2 = 600 if env.cuda else 200
    contexts = [
        ("zigzag", build_kcp_context(torch.tensor(mixed_cu(rng, T, P), dtype=torch.int32, device=env.device), layout="zigzag")),
    ]
    cu2 = mixed_cu(rng, T2, P, n_clusters=10)
    contexts.append(("1-2-token fragments", build_kcp_context(torch.tensor(cu2, dtype=torch.int32, device=env.device),
                                                             fragments=deal_fragments(rng, T2, P, (1, 2)))))
    for name, ctx in contexts:
        for form in ("single", "multi"):
            key = "conv" if form == "single" else "conv_multi"
            Cs = env.multi_C[:2] if form == "multi" else env.multi_C[:1]
            data = [global_inputs(env, ctx.total_tokens, C, BF16, i == 0, 700 + i) for i, C in enumerate(Cs)]
            data = [(ctx.shard(x), ctx.shard(dy), w, b) for x, dy, w, b in data]  # the second without bias

            def fn_for(handle):
                def f(*leaves):
                    xs, ws, bs = leaves[0::3], leaves[1::3], leaves[2::3]
                    if form == "single":
                        return (cake_causal_conv1d_det_kcp(xs[0], ws[0], ctx, bias=bs[0], recompute_handle=handle,
                                                           backend=env.conv_backend),)
                    return tuple(cake_causal_conv1d_det_multi_kcp(list(xs), list(ws), ctx, biases=list(bs),
                                                                  recompute_handle=handle, backend=env.conv_backend))
                return f

            def run(mode, handle):
                leaves = []
                for x, _, w, b in data:
                    leaves += [t.clone().requires_grad_(True) if t is not None else None for t in (x, w, b)]
                f = fn_for(handle)
                ys = f(*leaves) if mode is None else checkpoint(f, *leaves, use_reentrant=mode)
                keys = sorted(handle.entries) if handle is not None else None
                torch.autograd.backward(list(ys), [d[1] for d in data])
                return [y.detach() for y in ys] + [t.grad for t in leaves if t is not None], keys

            plain, _ = run(None, None)
            for mode in (True, False):
                for use_handle in (False, True):
                    handle = RecomputeHandleDetKcp() if use_handle else None
                    outs, keys = run(mode, handle)
                    what = f"recompute {name} {form} use_reentrant={mode} handle={use_handle}"
                    if use_handle:
                        chk.expect(keys == [key], f"{what}: handle entries after the forward {keys}, expected [{key!r}]")
                    for i, (a, b) in enumerate(zip(outs, plain)):
                        chk.equal(a, b, f"{what}: output/grad {i} vs the run without checkpoint")
                    chk.cases += 1
            # a filled handle refuses a forward outside a backward (every rank, before any exchange)
            handle = RecomputeHandleDetKcp()
            run(False, handle)
            leaves = [t for x, _, w, b in data for t in (x, w, b)]
            try:
                fn_for(handle)(*leaves)
                chk.fail(f"recompute {name} {form}: a filled handle did not raise outside a backward")
            except RuntimeError as exc:
                chk.expect(key in str(exc), f"recompute {name} {form}: the refusal does not name {key!r}: {exc}")
            handle.clear()
            outs, keys = run(False, handle)
            chk.expect(keys == [key], f"recompute {name} {form}: after clear() the entries are {keys}")
            for i, (a, b) in enumerate(zip(outs, plain)):
                chk.equal(a, b, f"recompute {name} {form} after clear(): output/grad {i}")


@check
def compile(env, chk):  # noqa: A001  (the check's name)
    """torch.compile(fullgraph=True) of Linear -> bf16 -> KCP conv (single form) and of Linear ->
    bf16 -> split -> multi conv: y and every gradient bitwise eager's (the Linear has no bias and
    nothing but exact casts, splits and the conv sits between the Linear and the outputs, so every
    bit is the op's and cuBLAS's, not Inductor's own summation order)."""
    rng = random.Random(18)
    P, C = env.world, env.C
    T = env.T // 4
    ctx = build_kcp_context(torch.tensor(mixed_cu(rng, T, P), dtype=torch.int32, device=env.device), layout="zigzag")
    torch.manual_seed(0)  # the same Linear on every rank
    lin = torch.nn.Linear(C, C, bias=False, device=env.device)
    g = torch.Generator().manual_seed(19)
    w = (torch.randn(C, 4, generator=g) * 0.5).to(env.device).requires_grad_(True)
    b = (torch.randn(C, generator=g) * 0.5).to(env.device).requires_grad_(True)
    splits = [C // 2, C // 2]  # (on CUDA, C = 128 without bias: kernels the multi check compiled)
    ws = [(torch.randn(n, 4, generator=g) * 0.5).to(env.device).requires_grad_(True) for n in splits]
    bs = [None, None]

    def single_model(x):
        return (cake_causal_conv1d_det_kcp(lin(x).to(BF16), w, ctx, bias=b, backend=env.conv_backend),)

    def multi_model(x):
        hs = list(lin(x).to(BF16).split(splits, dim=1))
        return cake_causal_conv1d_det_multi_kcp(hs, ws, ctx, biases=bs, backend=env.conv_backend)

    for name, model, params in (("single", single_model, [lin.weight, w, b]),
                                ("multi", multi_model, [lin.weight] + ws)):
        compiled = torch.compile(model, fullgraph=True)
        for seed in (1, 2):
            gg = torch.Generator().manual_seed(seed)
            x = ctx.shard(torch.randn(T, C, generator=gg).to(env.device))
            dy = ctx.shard(torch.randn(T, C, generator=gg).to(BF16).to(env.device))
            dys = [dy] if name == "single" else list(dy.split(splits, dim=1))
            results = []
            for fn in (model, compiled):
                for p in params:
                    p.grad = None
                ys = fn(x)
                torch.autograd.backward(list(ys), dys)
                results.append([y.detach() for y in ys] + [p.grad.clone() for p in params])
            for i, (a, c) in enumerate(zip(*results)):
                chk.equal(c, a, f"compile {name} seed {seed}: output/grad {i} compiled vs eager")
            chk.cases += 1


@check
def cuda_graph(env, chk):
    if not env.cuda:
        chk.skip_reason = "needs CUDA (NCCL) for graph capture"
        return
    P, C = env.world, env.C
    T = 32768 * P  # S_local = 32,768 rows per rank
    chunk = T // (2 * P)
    # The same segment count on every rank and no boundary within 3 tokens of a chunk edge in
    # either batch: the second layout fits the first one's tables (load_layout_).
    cu_a = torch.tensor([0, 5, chunk + chunk // 3, T], dtype=torch.int32, device=env.device)
    cu_b = torch.tensor([0, 17, chunk + 2 * (chunk // 3), T], dtype=torch.int32, device=env.device)
    ctx = build_kcp_context(cu_a, layout="zigzag")
    g = torch.Generator().manual_seed(20)
    w = (torch.randn(C, 4, generator=g) * 0.5).to(env.device).requires_grad_(True)
    b = (torch.randn(C, generator=g) * 0.5).to(env.device).requires_grad_(True)

    def batch(seed):
        gg = torch.Generator().manual_seed(seed)
        return (torch.randn(T, C, generator=gg).to(BF16).to(env.device),
                torch.randn(T, C, generator=gg).to(BF16).to(env.device))

    x0, dy0 = batch(0)
    x_s = ctx.shard(x0).requires_grad_(True)
    dy_s = ctx.shard(dy0)

    def step():
        y = cake_causal_conv1d_det_kcp(x_s, w, ctx, bias=b)
        y.backward(dy_s)
        return y

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # warm-up: compile, connect the peers
            x_s.grad = w.grad = b.grad = None
            step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    x_s.grad = w.grad = b.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_s = step()
    torch.cuda.synchronize()

    first_kept = first_want = None
    for seed, cu in ((1, cu_a), (2, cu_a), (3, cu_b), (4, cu_b)):
        if cu is cu_b and ctx.global_cu_seqlens[1] != 17:
            ctx.load_layout_(build_kcp_context(cu_b, layout="zigzag"))
        x, dy = batch(seed)
        with torch.no_grad():
            x_s.copy_(ctx.shard(x))
            dy_s.copy_(ctx.shard(dy))
        graph.replay()
        torch.cuda.synchronize()
        idx = ctx.local_token_indices
        want = single(env, x, dy, w.detach(), b.detach(), cu)
        static = (y_s, x_s.grad, w.grad, b.grad)
        label = f"cuda graph replay {seed} ({'new layout' if cu is cu_b else 'first layout'})"
        if seed == 1:  # what a caller keeps of this replay: clones, made before the next replay
            first_kept = [t.detach().clone() for t in static]
            first_want = (want[0][idx], want[1][idx])
        else:
            # the replay rewrote the static y and dx, and the first replay's clones are intact
            chk.expect(not torch.equal(y_s, first_kept[0]) and not torch.equal(x_s.grad, first_kept[1]),
                       f"{label}: the static y / x.grad were not rewritten")
            chk.equal(first_kept[0], first_want[0], f"{label}: the first replay's kept y")
            chk.equal(first_kept[1], first_want[1], f"{label}: the first replay's kept dx")
        compare(env, chk, label, ctx, tuple(t.detach().clone() for t in static), want)


@check
def subgroup(env, chk):
    P, G = env.world, env.n_gpus
    keep_order = "sort_ranks" in inspect.signature(dist.new_group).parameters

    def new(ranks, **kw):  # every rank creates every group, in the same order
        if env.group_backend:
            kw["backend"] = env.group_backend
        return dist.new_group(ranks, **kw)

    groups = []  # (name, ranks in group-rank order, group)
    if env.procs_per_gpu > 1:
        # Ranks r and r + G share GPU r % G (NCCL allows one rank per GPU in a communicator): each
        # group below holds one rank per GPU. [G .. 2G-1]: group rank i is global rank G + i;
        # [1 .. G]: group rank 0 is global rank 1, and [0, G+1 .. 2G-1] beside it.
        assert env.procs_per_gpu == 2, "--procs-per-gpu 2 only"
        lo, hi = list(range(G)), list(range(G, 2 * G))
        shifted, rest = list(range(1, G + 1)), [0] + list(range(G + 1, 2 * G))
        g_lo, g_hi, g_sh, g_re = new(lo), new(hi), new(shifted), new(rest)
        groups += [("the second rank of every GPU", hi, g_hi), ("the first rank of every GPU", lo, g_lo),
                   ("ranks 1 .. G", shifted, g_sh), ("rank 0 and ranks G+1 .. 2G-1", rest, g_re)]
    else:
        groups.append(("the last rank alone", [P - 1], new([P - 1])))
        if keep_order:
            rev = list(range(P))[::-1]
            groups.append(("the world reversed", rev, new(rev, sort_ranks=False)))
        elif P < 4 and env.rank == 0:
            print(f"{env.tag()} subgroup: this torch has no new_group(sort_ranks=False): with {P} ranks no group of "
                  f"2+ ranks has group ranks that differ from the global ones (run.sh runs this check again "
                  f"with 2 ranks per GPU)", flush=True)
        if P >= 4:
            lo, hi = list(range(P // 2)), list(range(P // 2, P))
            ev, od = list(range(0, P, 2)), list(range(1, P, 2))
            g_lo, g_hi, g_ev, g_od = new(lo), new(hi), new(ev), new(od)
            groups += [("the upper half", hi, g_hi), ("the lower half", lo, g_lo),
                       ("the odd ranks", od, g_od), ("the even ranks", ev, g_ev)]
    for gi, (name, ranks, group) in enumerate(groups):
        if env.rank not in ranks:
            continue  # disjoint groups run side by side; the next collective of all ranks waits
        q = len(ranks)
        grank = dist.get_rank(group)
        chk.expect(grank == ranks.index(env.rank), f"subgroup {name}: group rank {grank}, expected {ranks.index(env.rank)}")
        rng = random.Random(800 + gi)
        T = 4096 if env.cuda else 512
        label = f"subgroup {name} {ranks} (group rank {grank}, global rank {env.rank})"
        for layout in ("contiguous", "zigzag"):
            run_case(env, chk, label, mixed_cu(rng, T, q), layout=layout, seed=810 + gi, group=group)
        run_case(env, chk, label, per_doc_cu(rng, q, 10, 20), layout="zigzag_per_document", seed=820 + gi, group=group)
        Tf = 500 if env.cuda else 200
        cu = mixed_cu(rng, Tf, q, n_clusters=10)
        run_case(env, chk, label, cu, fragments=deal_fragments(rng, Tf, q, (1, 2, 3)), seed=830 + gi, group=group)
    dist.barrier()


def _fla_cp_context(env, cu_list, layout, builder):
    """This rank's FLA context of the batch: FLA's builder, or the stand-in fields without fla."""
    if builder is not None:
        cu = torch.tensor(cu_list, dtype=torch.int32, device=env.device)
        return builder(cu, dist.group.WORLD, conv1d_kernel_size=4, layout=layout)
    return make_context(fla_context_fields(cu_list, env.world, env.rank, layout), dist.group.WORLD, env.device)


@check
def fla_context(env, chk):
    """One FLA context per batch serves cakeconv's ``causal_conv1d`` (``kcp_context_from_fla``): y and
    dx bitwise the single-rank op's on this rank's rows (FLA's local buffer), the all-reduced taps'
    and bias's gradients close (FP32 taps: FP32 reordering; BF16 taps: each rank's partial sum is
    rounded to BF16), the derived context cached per FLA context."""
    try:
        from fla.ops.cp import build_cp_context as builder
    except Exception:  # ImportError, or a dependency of fla failing to load
        builder = None
    if env.rank == 0:
        source = "fla.ops.cp.build_cp_context" if builder else "the stand-in"
        print(f"{env.tag()} fla_context: FLA contexts from {source}", flush=True)
    rng = random.Random(23)
    P, C = env.world, env.C
    T = env.T // (2 * P) * (2 * P)  # FLA's builder needs T % P == 0 (contiguous), T % 2P == 0 (zigzag)
    for layout in ("contiguous", "zigzag"):
        batches = [mixed_cu(rng, T, P), [0, T], [0, 3, T - 5, T], [0, 2 * P] if layout == "zigzag" else [0, P]]
        for i, cu_list in enumerate(batches):
            fla_ctx = _fla_cp_context(env, cu_list, layout, builder)
            ctx = kcp_context_from_fla(fla_ctx)
            label = f"fla_context {layout} batch {i} (T = {cu_list[-1]}, D = {ctx.num_segments})"
            chk.expect(kcp_context_from_fla(fla_ctx) is ctx, f"{label}: a second kcp_context_from_fla derived a new context")
            chk.expect(ctx.layout == layout and ctx.world_size == P, f"{label}: {ctx!r}")
            wdtype = BF16 if i % 2 else FP32
            x, dy, w, b = global_inputs(env, cu_list[-1], C, BF16, True, 900 + i)
            w, b = w.to(wdtype), b.to(wdtype)
            cu = torch.tensor(cu_list, dtype=torch.int32, device=env.device)
            y_s, dx_s, dw_s, db_s = single(env, x, dy, w, b, cu)
            xl = ctx.shard(x)[None].requires_grad_(True)
            wl, bl = w.clone().requires_grad_(True), b.clone().requires_grad_(True)
            y, state = causal_conv1d(xl, wl, bl, activation="silu", cp_context=fla_ctx, cake_backend=env.conv_backend)
            y.backward(ctx.shard(dy)[None])
            idx = ctx.local_token_indices
            chk.expect(state is None, f"{label}: a final state was returned")
            chk.equal(y.detach()[0], y_s[idx], f"{label}: y")
            chk.equal(xl.grad[0], dx_s[idx], f"{label}: dx")
            for got, want, name in ((wl.grad, dw_s, "dweight"), (bl.grad, db_s, "dbias")):
                chk.expect(got.dtype == wdtype, f"{label}: {name} dtype {got.dtype}")
                total = got.float()
                dist.all_reduce(total)
                chk.close(total, want.float(), f"{label}: {name} (all-reduced)", rtol=1e-4 if wdtype == FP32 else 2e-2)
            chk.cases += 1


@check
def one_document(env, chk):
    P = env.world
    T = env.T
    # one document of T = 32,768 tokens, contiguous (one segment per rank), C = 512, bf16, no bias
    ctx = run_case(env, chk, "one document, contiguous", [0, T], layout="contiguous", C=env.C_one_doc, bias=False,
                   seed=300)
    chk.expect(ctx.num_segments == 1, f"one document contiguous: num_segments = {ctx.num_segments}, expected 1")
    run_case(env, chk, "one document, zigzag", [0, T], layout="zigzag", seed=302)
    # tiny local shares with one segment: the integer values Triton specializes (1, a multiple of 16)
    for per_rank in (1, 16):
        run_case(env, chk, f"one document, {per_rank} token(s) per rank", [0, per_rank * P], layout="contiguous",
                 seed=303 + per_rank)
    run_case(env, chk, "one document, zigzag, 1-token chunks", [0, 2 * P], layout="zigzag", seed=320)
    # C = 8 (C / 8 = 1, a value Triton specializes), contiguous rows
    run_case(env, chk, "one document, C = 8", [0, T // 4], layout="zigzag", C=8, seed=322)
    # a document spanning every rank between two short ones
    run_case(env, chk, "document across all ranks", [0, 3, T - 5, T], layout="contiguous", seed=321)


# -------------------------------------------------------------------------------------- main

def main(argv=None) -> int:
    names = [fn.__name__ for fn in CHECKS]
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="", help="comma-separated checks to run (default: all)")
    parser.add_argument("--skip", default="", help="comma-separated checks to leave out")
    parser.add_argument("--timeout", type=float, default=300.0, help="process-group timeout in seconds")
    parser.add_argument("--procs-per-gpu", type=int, default=1,
                        help="ranks per GPU (2: the world is gloo, the subgroup check's groups are NCCL "
                             "groups with one rank per GPU; only --only subgroup makes sense then)")
    parser.add_argument("--list", action="store_true", help="print the checks and exit")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(names))
        return 0
    only = [n for n in args.only.split(",") if n]
    skip = [n for n in args.skip.split(",") if n]
    for n in only + skip:
        if n not in names:
            print(f"unknown check {n!r}; checks: {', '.join(names)}", file=sys.stderr)
            return 2
    selected = [fn for fn in CHECKS if (not only or fn.__name__ in only) and fn.__name__ not in skip]

    if args.procs_per_gpu > 1 and [fn.__name__ for fn in selected] != ["subgroup"]:
        print("--procs-per-gpu > 1 goes with --only subgroup", file=sys.stderr)
        return 2
    env = Env(args.timeout, args.procs_per_gpu)
    if env.rank == 0:
        where = torch.cuda.get_device_name(env.device) if env.cuda else "CPU"
        print(f"KCP multi-rank tier: {env.world} ranks ({env.procs_per_gpu} per device), {env.dist_backend} on {where}"
              f"{' (groups: ' + env.group_backend + ')' if env.group_backend else ''}, conv backend "
              f"{env.conv_backend!r}, torch {torch.__version__}; checks: {', '.join(fn.__name__ for fn in selected)}",
              flush=True)
    verdicts = []
    t_start = time.time()
    for fn in selected:
        chk = Checker(env)
        t0 = time.time()
        try:
            fn(env, chk)
        except BaseException:
            print(f"{env.tag()} FAIL {fn.__name__}: raised (this rank ends now; the others may be inside an exchange)\n"
                  f"{traceback.format_exc()}", file=sys.stdout, flush=True)
            sys.stderr.flush()
            os._exit(1)
        dt = time.time() - t0
        if chk.skip_reason:
            verdict = "SKIP"
            detail = chk.skip_reason
        else:
            verdict = "FAIL" if chk.problems else "PASS"
            detail = f"{chk.cases} cases"
        print(f"{env.tag()} {verdict} {fn.__name__} ({detail}, {dt:.1f} s)", flush=True)
        for p in chk.problems[:20]:
            print(f"{env.tag()}     {p}", flush=True)
        if len(chk.problems) > 20:
            print(f"{env.tag()}     ... and {len(chk.problems) - 20} more", flush=True)
        verdicts.append((fn.__name__, verdict, len(chk.problems)))

    gathered = [None] * env.world
    dist.all_gather_object(gathered, verdicts)
    failed = [(r, name) for r, v in enumerate(gathered) for name, verdict, _ in v if verdict == "FAIL"]
    if env.rank == 0:
        print(f"== summary over {env.world} ranks ({time.time() - t_start:.0f} s) ==", flush=True)
        for i, fn in enumerate(selected):
            row = " ".join(f"{gathered[r][i][1]:4s}" for r in range(env.world))
            print(f"  {fn.__name__:14s} {row}", flush=True)
        print("RESULT: " + ("FAIL " + ", ".join(f"{n}@rank{r}" for r, n in failed) if failed else "PASS"), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
