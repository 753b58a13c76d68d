"""A short KCP probe: OUT=/tmp/probe torchrun --nproc-per-node 2 benchmarks/tools/kcp_probe.py

On 2 GPUs (NCCL): one document over the ranks (one segment each) and every
layout, bitwise against the single-rank op on every rank; then the host cost per KCP call (16-call
chain, S_local = 4096, C = 256) beside the local op, and the GPU-time overhead of the exchange at
S_local = 65,536, C = 4,096 (one call, host far ahead). Writes $OUT/kcp_probe.json.
"""
import json, os, statistics, time
for k, v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ[k] = v
import torch, torch.distributed as dist
from cakeconv import build_kcp_context, cake_causal_conv1d_det, cake_causal_conv1d_det_kcp
rank = int(os.environ["RANK"]); P = int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(rank); dev = "cuda"
dist.init_process_group("nccl")
res = {}
def check(cu_list, layout, C=512, bias=True, dtype=torch.bfloat16):
    T = cu_list[-1]
    g = torch.Generator(device=dev).manual_seed(T + C)
    x = torch.randn(T, C, device=dev, generator=g).to(dtype); dy = torch.randn(T, C, device=dev, generator=g).to(dtype)
    w = torch.randn(C, 4, device=dev, generator=g); b = torch.randn(C, device=dev, generator=g) if bias else None
    cu = torch.tensor(cu_list, dtype=torch.int32, device=dev)
    xs = x.clone().requires_grad_(True); ys = cake_causal_conv1d_det(xs, w, b, cu_seqlens=cu); ys.backward(dy)
    ctx = build_kcp_context(cu, layout=layout)
    xl = ctx.shard(x).requires_grad_(True); y = cake_causal_conv1d_det_kcp(xl, w, ctx, bias=b); y.backward(ctx.shard(dy))
    idx = ctx.local_token_indices
    ok = torch.equal(y, ys[idx]) and torch.equal(xl.grad, xs.grad[idx])
    flag = torch.tensor([0 if ok else 1], device=dev); dist.all_reduce(flag)
    return int(flag.item()) == 0, ctx.num_segments
for name, cu_list, layout in [("one_doc_contiguous", [0, 32768], "contiguous"), ("one_doc_zigzag", [0, 32768], "zigzag"),
                              ("mix_zigzag_per_doc", [0, 4, 8, 4000, 4096], "zigzag_per_document"),
                              ("tiny_frag", [0, 2], "contiguous"), ("C8", [0, 64], "contiguous")]:
    try:
        C = 8 if name == "C8" else 512
        ok, D = check(cu_list, layout, C=C)
        res[name] = f"{'bitwise' if ok else 'DIFFERS'} (D={D})"
    except Exception as e:
        res[name] = f"ERROR {type(e).__name__}: {str(e)[:300]}"
    if rank == 0: print(name, res[name], flush=True)
# host cost: 16-call chain at tiny shape (S_local 4096 per rank, C 256)
def chain(op, steps=100):
    S, C = 4096, 256
    x = torch.randn(S, C, device=dev).bfloat16().requires_grad_(True)
    ws = [(torch.randn(C, 4, device=dev) * 0.5).requires_grad_(True) for _ in range(16)]
    dy = torch.randn(S, C, device=dev).bfloat16()
    def step():
        y = x
        for w in ws: y = op(y, w)
        y.backward(dy); x.grad = None
        for w in ws: w.grad = None
    for _ in range(5): step()
    torch.cuda.synchronize(); dist.barrier()
    t = []
    for _ in range(steps):
        a = time.perf_counter(); step(); torch.cuda.synchronize(); t.append(time.perf_counter() - a)
    return statistics.median(t) / 16 * 1e6
for layout in ("contiguous", "zigzag"):
    ctx = build_kcp_context(torch.tensor([0, 4096 * P], dtype=torch.int32, device=dev), layout=layout)
    cul = ctx.local_cu_seqlens
    res[f"host_kcp_{layout}"] = chain(lambda y, w: cake_causal_conv1d_det_kcp(y, w, ctx))
    res[f"host_local_{layout}"] = chain(lambda y, w: cake_causal_conv1d_det(y, w, cu_seqlens=cul))
# GPU time overhead at S_local = 65536, C = 4096 (one call, host far ahead)
def gpu(op, x, dy, reps=15):
    w = torch.randn(x.shape[1], 4, device=dev).requires_grad_(True)
    t = []
    for i in range(reps + 3):
        x.grad = None; w.grad = None
        torch.cuda.synchronize(); dist.barrier(); torch.cuda._sleep(int(30e6))
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); y = op(x, w); y.backward(dy); b.record(); torch.cuda.synchronize()
        if i >= 3: t.append(a.elapsed_time(b) * 1e3)
    return statistics.median(t)
T = 65536 * P
for layout in ("contiguous", "zigzag", "zigzag_per_document"):
    cu = torch.tensor([0, 15948, 37796, T], dtype=torch.int32, device=dev)  # every length % 2P == 0 for P <= 2
    try:
        ctx = build_kcp_context(cu, layout=layout)
        x = torch.randn(ctx.num_local_tokens, 4096, device=dev).bfloat16().requires_grad_(True); dy = torch.randn_like(x)
        k = gpu(lambda x_, w: cake_causal_conv1d_det_kcp(x_, w, ctx), x, dy)
        l = gpu(lambda x_, w: cake_causal_conv1d_det(x_, w, cu_seqlens=ctx.local_cu_seqlens), x, dy)
        res[f"gpu_{layout}"] = [k, l, (k - l) / l * 100]
    except Exception as e:
        res[f"gpu_{layout}"] = f"ERROR {type(e).__name__}: {str(e)[:200]}"
allres = [None] * P
dist.all_gather_object(allres, res)
if rank == 0:
    json.dump(allres, open(os.path.join(os.environ.get("OUT", "."), "kcp_probe.json"), "w"), indent=1)
    for r, d in enumerate(allres):
        for k, v in d.items(): print(f"rank {r} {k}: {v}")
dist.destroy_process_group()
