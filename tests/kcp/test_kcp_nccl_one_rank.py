"""KCP on a 1-rank NCCL group (tier 4, the GPU machine): every layout, the compiled Triton kernels.

With one rank, zigzag's back part follows its own front part (the self-halo) and every explicit
fragment table of several fragments exercises the local copies of the exchange; what only a
machine with several GPUs can show (point-to-point over NCCL between GPUs) is issue 7's.
"""

import datetime
import os
import random
import tempfile

import pytest
import torch
import torch.distributed as dist

from cakeconv import build_kcp_context, cake_causal_conv1d_det, cake_causal_conv1d_det_kcp, cake_causal_conv1d_det_multi_kcp

from .test_kcp_plan import random_cu_seqlens, random_fragments

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def nccl_group():
    for var, val in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
        os.environ.setdefault(var, val)
    tmp = tempfile.mkdtemp(prefix="cakeconv_nccl_")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"file://{tmp}/store", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60))
    yield dist.group.WORLD
    dist.destroy_process_group()


def _check(cu_list, C, seed, layout=None, fragments=None):
    cu = torch.tensor(cu_list, dtype=torch.int32, device="cuda")
    T = cu_list[-1]
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(T, C, device="cuda", generator=g).bfloat16()
    dy = torch.randn(T, C, device="cuda", generator=g).bfloat16()
    w = torch.randn(C, 4, device="cuda", generator=g) * 0.5
    b = torch.randn(C, device="cuda", generator=g) * 0.5
    xs = x.clone().requires_grad_(True)
    y_s = cake_causal_conv1d_det(xs, w, b, cu_seqlens=cu)
    y_s.backward(dy)
    ctx = build_kcp_context(cu, layout=layout, fragments=fragments)
    xl = ctx.shard(x).requires_grad_(True)
    wl = w.clone().requires_grad_(True)
    y = cake_causal_conv1d_det_kcp(xl, wl, ctx, bias=b)
    y.backward(ctx.shard(dy))
    idx = ctx.local_token_indices
    assert torch.equal(y, y_s[idx])
    assert torch.equal(xl.grad, xs.grad[idx])
    return ctx


@pytest.mark.parametrize("layout", ["contiguous", "zigzag", "zigzag_per_document"])
def test_nccl_one_rank_layouts(nccl_group, layout):
    cu = [0, 2, 4, 4, 40000, 40002, 65536]  # every document length even: valid for all layouts at P = 1
    ctx = _check(cu, 512, 1, layout=layout)
    assert ctx.world_size == 1
    if layout == "zigzag":
        assert ctx.num_segments >= 2  # the back part reads its own front part


def test_nccl_one_rank_random_fragments_and_multi(nccl_group):
    rng = random.Random(3)
    for rep in range(3):
        cu = random_cu_seqlens(rng, 30, 400)
        if cu[-1] == 0:
            cu.append(16)
        _check(cu, 128, 10 + rep, fragments=random_fragments(rng, cu[-1], 1))
    cu = torch.tensor([0, 3, 1000, 4096], dtype=torch.int32, device="cuda")
    ctx = build_kcp_context(cu, layout="zigzag")
    xs = [torch.randn(4096, C, device="cuda").bfloat16() for C in (128, 256, 64)]
    ws = [torch.randn(C, 4, device="cuda") for C in (128, 256, 64)]
    ys = cake_causal_conv1d_det_multi_kcp([ctx.shard(x) for x in xs], ws, ctx)
    for x, w, y in zip(xs, ws, ys):
        assert torch.equal(y, cake_causal_conv1d_det_kcp(ctx.shard(x), w, ctx))
