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
