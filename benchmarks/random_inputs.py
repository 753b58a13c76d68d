"""The benchmarks' seeded inputs, drawn from a torch.Generator on the device: the same values for every
provider, rank and code version that draws them in the same order.

Activations (x, dy): bf16, standard normal. Taps: fp32 [C, W], N(0, 0.25) each (W = 4 draws the same values
as before the width was a parameter). Biases: fp32 [C], N(0, 0.04).
Shape legend: R rows, C channels, W taps per channel.
"""

from __future__ import annotations


def generator(torch, device, seed: int):
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def activations(torch, gen, rows: int, C: int, device):
    """bf16 [R, C], standard normal (drawn in fp32, then rounded)."""
    return torch.randn(rows, C, generator=gen, device=device, dtype=torch.float32).to(torch.bfloat16)


def taps(torch, gen, C: int, device, width: int = 4):
    """fp32 [C, width], N(0, 0.25) each."""
    return (torch.randn(C, width, generator=gen, device=device, dtype=torch.float32) * 0.5).contiguous()


def bias(torch, gen, C: int, device):
    """fp32 [C], N(0, 0.04)."""
    return (torch.randn(C, generator=gen, device=device, dtype=torch.float32) * 0.2).contiguous()
