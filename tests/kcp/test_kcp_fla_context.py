"""kcp_context_from_fla: the KCP context derived from flash-linear-attention's ``FLACPContext``.

Tiers:
- host (no ranks): every rank's local FLA tables, encoded as fla_kcp_context's all-gather carries them,
  give back the global boundaries of the batch (empty documents aside), for P = 1..8 and both of
  FLA's layouts; inconsistent tables raise. The stand-in builder below agrees with FLA's builder
  field by field (that test needs fla).
- tier 3 (gloo, 2-4 ranks, one spawn per world size): on every rank, y and dx of the KCP op on
  ``kcp_context_from_fla(ctx)`` are bitwise the single-rank op's on the rank's tokens, the rank's
  rows are FLA's local buffer in order, and the all-reduced dweight/dbias are within FP32
  reordering of the single-rank ones (partial sums), for both layouts: documents across ranks,
  1-3-token documents, empty ones, one document over every rank, one token per part (multi-hop
  halos). A second call with the same FLA context makes no collective; a copy, and a context
  changed in place, derive again; contexts of the ranks that do not describe one batch raise on
  every rank.
- GPU (marked ``gpu``, needs fla): one NCCL rank, contexts from ``fla.ops.cp.build_cp_context``.

The FLA contexts of the gloo tier are made by FLA's own builder where fla is importable
(``fla.ops.cp.context.get_cp_cu_seqlens`` with ``world_size`` and ``rank`` given, the code path of
``build_cp_context``), in the pytest process: importing fla takes about 10 s, too long for every
spawned rank. Without fla, ``fla_context_fields`` below makes them. Each rank puts the fields in
``FlaContextStandIn`` (FLA's field names, unhashable like FLA's dataclass) with its group.
tests/test_integrations_fla_functional.py runs FLA's ``build_cp_context`` on the ranks themselves.

Shape legend: T global tokens, S local rows, C channels, P ranks, L part length.
"""

from __future__ import annotations

import dataclasses
import gc
import random
import re
import warnings

import pytest
import torch
import torch.distributed as dist

from cakeconv import cake_causal_conv1d_det, cake_causal_conv1d_det_kcp
from cakeconv.integrations import fla_kcp_context
from cakeconv.integrations.fla_kcp_context import kcp_context_from_fla

from ._dist import nccl_one_rank_group, run_on_ranks
from .test_kcp_plan import random_cu_seqlens


def _fla_cp_builder():
    """FLA's ``get_cp_cu_seqlens`` (what ``build_cp_context`` calls), or None without fla."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from fla.ops.cp.context import get_cp_cu_seqlens
    except Exception:  # ImportError, or a dependency of fla failing to load
        return None
    return get_cp_cu_seqlens


FIELDS = ("cu_seqlens_cpu", "layout", "pre_num_conv_tokens", "part_len", "front_num_seqs",
          "pre_num_conv_tokens_by_part")


@dataclasses.dataclass
class FlaContextStandIn:
    """The fields of FLA 0.6.0's ``FLACPContext`` that fla_kcp_context reads (eq=True: unhashable, as FLA's)."""

    group: object = None
    cu_seqlens: torch.Tensor | None = None
    cu_seqlens_cpu: torch.Tensor | None = None
    layout: str = "contiguous"
    pre_num_conv_tokens: int | None = None
    part_len: int | None = None
    front_num_seqs: int | None = None
    pre_num_conv_tokens_by_part: tuple[int, int] | None = None


def _part(cu: list[int], start: int, stop: int) -> tuple[list[int], int]:
    """FLA's view of the part [start, stop): local boundaries, and pre_num_conv_tokens.

    The local boundaries are the global ones that fall inside the part, shifted to it, with 0 and
    stop - start, each once (empty documents collapse). pre_num_conv_tokens counts the tokens of the
    document holding the part's first token that lie before the part (the last boundary <= start).
    """
    local = sorted({0, stop - start} | {b - start for b in cu if start < b < stop})
    doc_start = max(b for b in cu if b <= start)
    return local, start - doc_start


def fla_context_fields(cu: list[int], world_size: int, rank: int, layout: str) -> dict:
    """The FLACPContext fields FLA's builder gives rank ``rank`` (written from FLA 0.6.0's semantics)."""
    T = cu[-1]
    if layout == "contiguous":
        L = T // world_size
        local, pre = _part(cu, rank * L, (rank + 1) * L)
        return dict(cu_seqlens_cpu=local, layout=layout, pre_num_conv_tokens=pre, part_len=None,
                    front_num_seqs=None, pre_num_conv_tokens_by_part=None)
    L = T // (2 * world_size)
    back = 2 * world_size - 1 - rank
    front_cu, front_pre = _part(cu, rank * L, (rank + 1) * L)
    back_cu, back_pre = _part(cu, back * L, (back + 1) * L)
    return dict(cu_seqlens_cpu=front_cu + [L + b for b in back_cu[1:]], layout=layout, pre_num_conv_tokens=None,
                part_len=L, front_num_seqs=len(front_cu) - 1, pre_num_conv_tokens_by_part=(front_pre, back_pre))


def _fields_of(fla_context) -> dict:
    fields = {name: getattr(fla_context, name) for name in FIELDS}
    fields["cu_seqlens_cpu"] = [int(v) for v in fields["cu_seqlens_cpu"].tolist()]
    if fields["pre_num_conv_tokens_by_part"] is not None:
        fields["pre_num_conv_tokens_by_part"] = tuple(fields["pre_num_conv_tokens_by_part"])
    return fields


def context_fields(cu: list[int], world_size: int, layout: str) -> list[dict]:
    """Every rank's FLA context fields: by FLA's builder where fla is importable, else the stand-in's."""
    builder = _fla_cp_builder()
    if builder is None:
        return [fla_context_fields(cu, world_size, r, layout) for r in range(world_size)]
    cu_N = torch.tensor(cu, dtype=torch.int32)
    return [_fields_of(builder(cu_N, world_size=world_size, rank=r, layout=layout)) for r in range(world_size)]


def make_context(fields: dict, group, device="cpu") -> FlaContextStandIn:
    cu = torch.tensor(fields["cu_seqlens_cpu"], dtype=torch.int32)
    rest = {k: v for k, v in fields.items() if k != "cu_seqlens_cpu"}
    return FlaContextStandIn(group=group, cu_seqlens=cu.to(device), cu_seqlens_cpu=cu, **rest)


def _mixed_cu(rng: random.Random, T: int, P: int) -> list[int]:
    """Documents across ranks, 1-3-token and empty documents, boundaries on and near part edges."""
    L = T // (2 * P)
    cuts = {0, T}
    cuts.update(k * L + rng.choice([-2, -1, 0, 1, 3]) for k in range(1, 2 * P) if rng.random() < 0.5)
    cu = sorted(min(max(c, 0), T) for c in cuts)
    for _ in range(3):  # a cluster of short documents, with an empty one
        s = rng.randrange(T)
        cu += [min(T, s + k) for k in (1, 2, 2, 4)]
    return sorted(cu)


def _cases(P: int) -> list[tuple[str, list[int]]]:
    rng = random.Random(50 + P)
    cases = []
    for layout in ("contiguous", "zigzag"):
        T = 2 * P * 6
        cases.append((layout, [0, T]))  # one document over every rank
        cases.append((layout, [0, 0, 2, 3, T - 1, T, T]))  # one long document between short and empty ones
        cases.append((layout, _mixed_cu(rng, T, P)))
        short = [min(c, T) for c in random_cu_seqlens(rng, 4 * T, 3)] + [T]
        cases.append((layout, sorted(short)))  # 0-3-token documents only
        cases.append((layout, [0, 2 * P] if layout == "zigzag" else [0, 1, P]))  # one token per part
    return cases


def _bad_cases(P: int) -> list[tuple[list[dict], list[str]]]:
    """(every rank's fields, the message each rank must raise) for contexts that are not one batch."""
    L = 8
    T = P * L
    cu = [0, 3, T - L - 3, T]  # the last document starts 3 tokens before the last rank's part
    good = context_fields(cu, P, "contiguous")
    differ = "differ in"
    cases = []
    # one rank's context is zigzag
    fields = list(good[:-1]) + [context_fields(cu, P, "zigzag")[-1]]
    cases.append((fields, [f"{differ} layout"] * P))
    # one rank's context is of a batch of another length
    fields = list(good[:-1]) + [context_fields(cu[:-1] + [2 * T], P, "contiguous")[-1]]
    cases.append((fields, [f"{differ} part length"] * P))
    # the last rank's document starts 2 tokens before its part, the others' 3 tokens
    fields = list(good[:-1]) + [context_fields([0, 3, T - L - 2, T], P, "contiguous")[-1]]
    cases.append((fields, ["do not describe one batch"] * P))
    # a local table FLA cannot make (rank 0): that rank says why, the others that it failed
    fields = [dict(good[0], layout="zigzag_per_document")] + list(good[1:])
    cases.append((fields, ["takes FLA's layouts"] + ["failed on rank(s) [0]"] * (P - 1)))
    return cases


class _AllGatherCount:
    """Counts torch.distributed.all_gather calls (fla_kcp_context's and build_kcp_context's)."""

    def __init__(self):
        self.n = 0
        self._real = dist.all_gather

        def counted(*args, **kwargs):
            self.n += 1
            return self._real(*args, **kwargs)

        dist.all_gather = counted

    def restore(self):
        dist.all_gather = self._real


def _inputs(T, C, seed, dtype):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, C, generator=g).to(dtype)
    dy = torch.randn(T, C, generator=g).to(dtype)
    return x, dy, torch.randn(C, 4, generator=g) * 0.5, torch.randn(C, generator=g) * 0.5


def _fla_local_tokens(layout: str, T: int, P: int, rank: int) -> list[int]:
    """The global tokens of FLA's local buffer on ``rank``, in order."""
    if layout == "contiguous":
        return list(range(rank * T // P, (rank + 1) * T // P))
    L = T // (2 * P)
    back = 2 * P - 1 - rank
    return list(range(rank * L, (rank + 1) * L)) + list(range(back * L, (back + 1) * L))


def check_against_single(rank, ctx, cu, seed, dtype, backend, C=16):
    """KCP on ``ctx`` == the single-rank op on cu: y, dx bitwise on this rank's rows, dweight/dbias close."""
    T = cu[-1]
    x, dy, w, b = _inputs(T, C, seed, dtype)
    xs, ws, bs = (t.clone().requires_grad_(True) for t in (x, w, b))
    y_s = cake_causal_conv1d_det(xs, ws, bs, cu_seqlens=torch.tensor(cu, dtype=torch.int32), backend=backend)
    y_s.backward(dy)
    xl = ctx.shard(x).requires_grad_(True)
    wl, bl = w.clone().requires_grad_(True), b.clone().requires_grad_(True)
    y = cake_causal_conv1d_det_kcp(xl, wl, ctx, bias=bl, backend=backend)
    y.backward(ctx.shard(dy))
    idx = ctx.local_token_indices
    assert torch.equal(y, y_s.detach()[idx]), f"rank {rank}: y differs ({ctx.layout}, cu {cu})"
    assert torch.equal(xl.grad, xs.grad[idx]), f"rank {rank}: dx differs ({ctx.layout}, cu {cu})"
    dw, db = wl.grad.clone(), bl.grad.clone()
    dist.all_reduce(dw)
    dist.all_reduce(db)
    for got, want, name in ((dw, ws.grad, "dweight"), (db, bs.grad, "dbias")):
        scale = max(1.0, want.abs().max().item())
        assert (got - want).abs().max().item() <= 1e-5 * scale, f"rank {rank}: all-reduced {name} ({ctx.layout})"


def _check_from_fla(rank, world, cases, fields_by_case, bad_cases):
    group = dist.group.WORLD
    count = _AllGatherCount()
    try:
        for i, ((layout, cu), fields) in enumerate(zip(cases, fields_by_case)):
            fla_ctx = make_context(fields[rank], group)
            before = count.n
            ctx = kcp_context_from_fla(fla_ctx)
            derivation = count.n - before
            assert 2 <= derivation <= 3, f"rank {rank}: {derivation} all-gathers to derive"
            assert kcp_context_from_fla(fla_ctx) is ctx and count.n == before + derivation, "the cache made a collective"
            assert ctx.layout == layout and ctx.group is group and ctx.world_size == world
            assert ctx.global_cu_seqlens == tuple(sorted(set(cu))), (ctx.global_cu_seqlens, cu)
            assert ctx.local_token_indices.tolist() == _fla_local_tokens(layout, cu[-1], world, rank)
            check_against_single(rank, ctx, cu, 10 + i, torch.bfloat16 if i % 2 else torch.float32, "reference")
        # a copy of the FLA context (as copy_for_backward makes) is another object: it derives again
        copy = dataclasses.replace(fla_ctx, cu_seqlens=fla_ctx.cu_seqlens.clone())
        before = count.n
        again = kcp_context_from_fla(copy)
        assert again is not ctx and count.n > before and again.global_cu_seqlens == ctx.global_cu_seqlens
        # a context changed in place (as FLA's CUDA-graph mode refreshes cu_seqlens) derives again
        fla_ctx.cu_seqlens.add_(0)
        before = count.n
        refreshed = kcp_context_from_fla(fla_ctx)
        assert refreshed is not ctx and count.n > before and refreshed.global_cu_seqlens == ctx.global_cu_seqlens
        assert kcp_context_from_fla(fla_ctx) is refreshed
        layout, cu = cases[2]  # its fields set to another batch's: that batch's context
        for name, value in vars(make_context(fields_by_case[2][rank], group)).items():
            setattr(fla_ctx, name, value)
        check_against_single(rank, kcp_context_from_fla(fla_ctx), cu, 98, torch.float32, "reference")
        # an FLA context that is garbage-collected leaves the cache
        cached = len(fla_kcp_context._CACHE)
        del fla_ctx, copy
        gc.collect()
        assert len(fla_kcp_context._CACHE) == cached - 2, (cached, len(fla_kcp_context._CACHE))
    finally:
        count.restore()
    messages = []
    for fields, expected in bad_cases:
        with pytest.raises(ValueError, match=re.escape(expected[rank])) as info:
            kcp_context_from_fla(make_context(fields[rank], group))
        messages.append(str(info.value))
    # after the failures a valid context still derives (nothing was left half-built)
    layout, cu = cases[2]
    check_against_single(rank, kcp_context_from_fla(make_context(fields_by_case[2][rank], group)), cu, 99,
                         torch.float32, "reference")
    return messages


@pytest.mark.dist
@pytest.mark.parametrize("world", [2, 3, 4])
def test_from_fla_bitwise_on_every_rank(world):
    cases = _cases(world)
    fields_by_case = [context_fields(cu, world, layout) for layout, cu in cases]
    bad = _bad_cases(world)
    messages = run_on_ranks(_check_from_fla, world, cases, fields_by_case, bad, timeout_s=240)
    assert len(messages) == world and all(len(m) == len(bad) for m in messages)


# ---------------------------------------------------------------------------------- host tier


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_global_boundaries_from_local_tables(layout):
    """Encode each rank's local parts as fla_kcp_context's all-gather carries them; decode on the host."""
    rng = random.Random(7)
    checked = 0
    for rep in range(150):
        P = rng.randint(1, 8)
        parts = 2 * P if layout == "zigzag" else P
        L = rng.choice([1, 2, 3, 5, 16])
        T = parts * L
        cu = sorted([min(c, T) for c in random_cu_seqlens(rng, rng.randint(1, 3 * T), rng.choice([3, T]))] + [T])
        fields = [fla_context_fields(cu, P, r, layout) for r in range(P)]
        encoded = [fla_kcp_context.encode_parts(*fla_kcp_context.local_parts(make_context(f, None), r, P), P)
                   for r, f in enumerate(fields)]
        got = fla_kcp_context.global_cu_seqlens([e[0] for e in encoded], [e[1] for e in encoded])
        assert got == sorted(set(cu)), (P, layout, cu, got)
        checked += 1
    assert checked == 150


def test_inconsistent_tables_raise():
    P, L = 2, 8
    a = [fla_context_fields([0, 5, 16], P, r, "contiguous") for r in range(P)]
    b = fla_context_fields([0, 6, 16], P, 1, "contiguous")
    encoded = [fla_kcp_context.encode_parts(*fla_kcp_context.local_parts(make_context(f, None), r, P), P)
               for r, f in enumerate([a[0], b])]
    expected = "rank 1's part starting at token 8 continues a document that starts at token 6"
    with pytest.raises(ValueError, match=expected):
        fla_kcp_context.global_cu_seqlens([e[0] for e in encoded], [e[1] for e in encoded])
    bad = make_context(dict(a[1], pre_num_conv_tokens=9), None)
    with pytest.raises(ValueError, match="pre_num_conv_tokens = 9"):
        fla_kcp_context.local_parts(bad, 1, P)
    with pytest.raises(ValueError, match="no process group"):
        kcp_context_from_fla(make_context(a[0], None))
    with pytest.raises(ValueError, match="without group"):
        kcp_context_from_fla(object())


def test_stand_in_builder_agrees_with_flas():
    builder = _fla_cp_builder()
    if builder is None:
        pytest.skip("flash-linear-attention (fla 0.6.0) is not importable")
    rng = random.Random(9)
    for rep in range(120):
        P = rng.randint(1, 6)
        layout = rng.choice(["contiguous", "zigzag"])
        T = (2 * P if layout == "zigzag" else P) * rng.choice([1, 2, 3, 7])
        cu = sorted([min(c, T) for c in random_cu_seqlens(rng, rng.randint(1, 2 * T), rng.choice([3, T]))] + [T])
        cu_N = torch.tensor(cu, dtype=torch.int32)
        for r in range(P):
            theirs = _fields_of(builder(cu_N, world_size=P, rank=r, layout=layout))
            assert theirs == fla_context_fields(cu, P, r, layout), (cu, P, r, layout)


# ----------------------------------------------------------------------------------- GPU tier


@pytest.fixture(scope="module")
def nccl_group():
    yield from nccl_one_rank_group()


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_gpu_nccl_one_rank_flas_builder(nccl_group, layout):
    """FLA's build_cp_context on a 1-rank NCCL group: kcp_context_from_fla, the KCP op (Triton), and FLA's
    functional op through cakeconv (bf16 taps cast to FP32 inside): y and dx bitwise the single-rank op."""
    if _fla_cp_builder() is None:
        pytest.skip("flash-linear-attention (fla 0.6.0) is not importable")
    from fla.ops.cp import build_cp_context

    from cakeconv.integrations.fla import causal_conv1d

    T, C = 16384, 256
    cu = torch.tensor([0, 1, 3, 3, 5000, 8190, 8194, 12000, T], dtype=torch.int32, device="cuda")
    fla_ctx = build_cp_context(cu, nccl_group, conv1d_kernel_size=4, layout=layout)
    ctx = kcp_context_from_fla(fla_ctx)
    assert kcp_context_from_fla(fla_ctx) is ctx and ctx.device == torch.device("cuda", torch.cuda.current_device())
    assert ctx.local_token_indices.tolist() == _fla_local_tokens(layout, T, 1, 0)
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(T, C, device="cuda", generator=g).bfloat16()
    dy = torch.randn(T, C, device="cuda", generator=g).bfloat16()
    w = (torch.randn(C, 4, device="cuda", generator=g) * 0.5).bfloat16()
    b = (torch.randn(C, device="cuda", generator=g) * 0.5).bfloat16()
    xs = x.clone().requires_grad_(True)
    y_s = cake_causal_conv1d_det(xs, w, b, cu_seqlens=cu)
    y_s.backward(dy)
    idx = ctx.local_token_indices
    xl = ctx.shard(x).clone().requires_grad_(True)
    y = cake_causal_conv1d_det_kcp(xl, w.float(), ctx, bias=b.float())
    y.backward(ctx.shard(dy))
    assert torch.equal(y, y_s[idx]) and torch.equal(xl.grad, xs.grad[idx])
    xf = ctx.shard(x)[None].clone().requires_grad_(True)
    yf, state = causal_conv1d(xf, w, b, activation="silu", cp_context=fla_ctx)
    yf.backward(ctx.shard(dy)[None])
    assert state is None and torch.equal(yf[0], y_s[idx]) and torch.equal(xf.grad[0], xs.grad[idx])
