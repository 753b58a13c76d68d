"""A short probe (one GPU) of the host cost of the single-rank op beside a trivial autograd.Function.

    OUT=/tmp/probe python benchmarks/tools/host_probe.py

The 16-call chain at S = 4096, C = 256 (ours, the trivial Function, silu), the no-grad forward, the
workspace entry points, and the eager loop against GPU time at S = 250,340, C = 128 and 512. Writes
$OUT/<PROBE_NAME>.json (default host_probe). Quick enough to alternate two code versions
(PYTHONPATH) as an A/B; PROBE_EAGER=0 skips the eager-loop rows (the host cost alone). The benchmark
proper (bench_cake_causal_conv1d_det.py --host-cost --eager) measures the same with its full protocol.
"""
import json, os, statistics, time
import torch
import cakeconv
from cakeconv import cake_causal_conv1d_det, cake_causal_conv1d_det_train_forward, cake_causal_conv1d_det_train_backward, cake_causal_conv1d_det_train_backward_workspace_bytes

dev = "cuda"
class Trivial(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w): return x.clone()
    @staticmethod
    def backward(ctx, g): return g, None

def chain_time(op, S, C, steps, cu):
    x = torch.randn(S, C, device=dev).bfloat16().requires_grad_(True)
    ws = [(torch.randn(C, 4, device=dev) * 0.5).requires_grad_(True) for _ in range(16)]
    dy = torch.randn(S, C, device=dev).bfloat16()
    def step():
        y = x
        for w in ws: y = op(y, w, cu)
        y.backward(dy)
        x.grad = None
        for w in ws: w.grad = None
    for _ in range(5): step()
    torch.cuda.synchronize()
    times = []
    for _ in range(steps):
        t = time.perf_counter(); step(); torch.cuda.synchronize(); times.append(time.perf_counter() - t)
    return statistics.median(times) / 16 * 1e6

def gpu_time(op, S, C, cu, reps=20):
    x = torch.randn(S, C, device=dev).bfloat16().requires_grad_(True)
    ws = [(torch.randn(C, 4, device=dev) * 0.5).requires_grad_(True) for _ in range(16)]
    dy = torch.randn(S, C, device=dev).bfloat16()
    def step():
        y = x
        for w in ws: y = op(y, w, cu)
        y.backward(dy)
    for _ in range(3): step(); x.grad = None; [setattr(w, "grad", None) for w in ws]
    times = []
    for _ in range(reps):
        x.grad = None
        for w in ws: w.grad = None
        torch.cuda.synchronize()
        torch.cuda._sleep(int(50e6))  # host far ahead
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); step(); b.record(); torch.cuda.synchronize(); times.append(a.elapsed_time(b) * 1e3 / 16)
    return statistics.median(times)

ours = lambda y, w, cu: cake_causal_conv1d_det(y, w, cu_seqlens=cu)
triv = lambda y, w, cu: Trivial.apply(y, w)
silu = lambda y, w, cu: torch.nn.functional.silu(y)
rows = {}
S, C = 4096, 256
cu = torch.tensor([0, S], dtype=torch.int32, device=dev)
for name, op in (("trivial", triv), ("silu", silu), ("ours", ours), ("trivial2", triv), ("ours2", ours)):
    rows[f"chain_{name}"] = chain_time(op, S, C, 200, cu)
x = torch.randn(S, C, device=dev).bfloat16(); w = torch.randn(C, 4, device=dev)
for _ in range(20): cake_causal_conv1d_det(x, w, cu_seqlens=cu)
torch.cuda.synchronize(); t = time.perf_counter()
for _ in range(2000): cake_causal_conv1d_det(x, w, cu_seqlens=cu)
rows["nograd_fwd_us"] = (time.perf_counter() - t) / 2000 * 1e6; torch.cuda.synchronize()
y = torch.empty_like(x); dx = torch.empty_like(x); dy = torch.randn_like(x)
wsb = torch.empty(cake_causal_conv1d_det_train_backward_workspace_bytes(S, C), dtype=torch.uint8, device=dev)
for _ in range(20):
    cake_causal_conv1d_det_train_forward(x, w, None, cu, out=y); cake_causal_conv1d_det_train_backward(dy, x, w, None, cu, dx=dx, workspace=wsb)
torch.cuda.synchronize(); t = time.perf_counter()
for _ in range(2000):
    cake_causal_conv1d_det_train_forward(x, w, None, cu, out=y); cake_causal_conv1d_det_train_backward(dy, x, w, None, cu, dx=dx, workspace=wsb)
rows["ws_pair_us"] = (time.perf_counter() - t) / 2000 * 1e6; torch.cuda.synchronize()
# eager loop vs GPU time at the seed-like shape
S2 = 250340
g = torch.Generator().manual_seed(0)
lens = [int(v) for v in torch.randint(1, 16384, (40,), generator=g)]
cuts = [0]
for L in lens:
    if cuts[-1] + L >= S2: break
    cuts.append(cuts[-1] + L)
cuts.append(S2)
cu2 = torch.tensor(cuts, dtype=torch.int32, device=dev)
eager_Cs = (128, 512) if os.environ.get("PROBE_EAGER", "1") != "0" else ()
for C2 in eager_Cs:
    e = chain_time(ours, S2, C2, 20, cu2); gt = gpu_time(ours, S2, C2, cu2)
    floor = 10 * S2 * C2 / 1e3  # bytes / 1e3 -> us at 1 GB/ms ... compute fraction later
    rows[f"eager_{C2}_us"] = e; rows[f"gpu_{C2}_us"] = gt
src = torch.empty(2**30, dtype=torch.uint8, device=dev); dst = torch.empty_like(src)
for _ in range(3): dst.copy_(src)
a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
a.record()
for _ in range(10): dst.copy_(src)
b.record(); torch.cuda.synchronize()
rows["copy_GBps"] = 2 * 2**30 * 10 / (a.elapsed_time(b) / 1e3) / 1e9
for C2 in eager_Cs:
    rows[f"frac_gpu_{C2}"] = 10 * S2 * C2 / (rows[f"gpu_{C2}_us"] * 1e-6) / 1e9 / rows["copy_GBps"]
    rows[f"frac_eager_{C2}"] = 10 * S2 * C2 / (rows[f"eager_{C2}_us"] * 1e-6) / 1e9 / rows["copy_GBps"]
rows["ratio_chain"] = rows["chain_ours"] / rows["chain_trivial"]
out = os.environ.get("OUT", ".")
rows["cakeconv_path"] = os.path.dirname(cakeconv.__file__)
json.dump(rows, open(os.path.join(out, os.environ.get("PROBE_NAME", "host_probe") + ".json"), "w"), indent=1)
for k, v in rows.items(): print(f"{k:20s} {v:10.2f}" if isinstance(v, float) else f"{k:20s} {v}")
