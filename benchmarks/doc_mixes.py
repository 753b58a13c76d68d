"""Document mixes: the lengths of the packed documents of one shape, and their cu_seqlens.

Mixes (``--doc-mix``): ``seed`` (85% of documents exponential around a mean length, capped at 8x it, 15%
of 1-63 tokens), ``uniform:A-B`` (lengths uniform in A..B), ``ones`` (every document of length 1),
``fixed:N`` (all of length N, the last shorter), ``one`` (a single document). The kernel tools also use
the sweep's mix (``sweep_cu``: lengths uniform in 1..2*mean-1).
"""

from __future__ import annotations

import random
import zlib

DEFAULT_MIX = "seed"
SEED_MEAN_LEN = 3000


def doc_lengths(S: int, seed: int, mean_len: int) -> list[int]:
    """The seed mix: random document lengths summing to S, mostly exponential around mean_len, 15% short ones (1..63)."""
    rng = random.Random(seed)
    lens: list[int] = []
    total = 0
    while total < S:
        if rng.random() < 0.15:
            n = rng.randint(1, 63)
        else:
            n = 64 + int(rng.expovariate(1.0 / max(1, mean_len - 64)))
            n = min(n, 8 * mean_len)
        n = min(n, S - total)
        lens.append(n)
        total += n
    return lens


def parse_mix(token: str) -> str:
    """The canonical name of one --doc-mix token (raises SystemExit on a bad one)."""
    t = token.strip().lower()
    if t in ("seed", "ones", "one"):
        return t
    try:
        if t.startswith("uniform:"):
            lo, hi = (int(v) for v in t.split(":", 1)[1].split("-"))
            if not 1 <= lo <= hi:
                raise ValueError
            return f"uniform:{lo}-{hi}"
        if t.startswith("fixed:"):
            n = int(t.split(":", 1)[1])
            if n < 1:
                raise ValueError
            return f"fixed:{n}"
    except ValueError:
        pass
    raise SystemExit(f"unknown --doc-mix {token!r}: use seed, uniform:A-B, ones, fixed:N or one")


def parse_mixes(values) -> list[str]:
    """The mixes of comma lists (the option may repeat), each once, in order; [seed] when none."""
    out = []
    for v in values or [DEFAULT_MIX]:
        for tok in v.split(","):
            if tok.strip():
                m = parse_mix(tok)
                if m not in out:
                    out.append(m)
    return out or [DEFAULT_MIX]


def mix_lengths(mix: str, S: int, seed: int, mean_len: int) -> list[int]:
    """Document lengths of ``mix`` summing to S (seed: the shape's seed)."""
    if S == 0:
        return []
    if mix == "seed":
        return doc_lengths(S, seed, mean_len)
    if mix == "one":
        return [S]
    if mix == "ones":
        return [1] * S
    if mix.startswith("fixed:"):
        n = int(mix.split(":")[1])
        return [n] * (S // n) + ([S % n] if S % n else [])
    if mix.startswith("uniform:"):
        lo, hi = (int(v) for v in mix.split(":")[1].split("-"))
        rng = random.Random(seed * 7919 + zlib.crc32(mix.encode()))
        lens, total = [], 0
        while total < S:
            n = min(rng.randint(lo, hi), S - total)
            lens.append(n)
            total += n
        return lens
    raise ValueError(f"unknown mix {mix!r}")


def is_short_mix(mix: str) -> bool:
    """The short-document mixes of SPEC section 7 (uniform 1-8, 1-64, 1-1,024 and all of length 1)."""
    return mix == "ones" or (mix.startswith("uniform:") and int(mix.split("-")[-1]) <= 1024)


def mix_cu(S: int, mix: str, seed: int, device="cuda"):
    """cu_seqlens (int32 [N+1], on ``device``) of the benchmark's document mix ``mix`` (a --doc-mix token)."""
    import torch

    lens = mix_lengths(parse_mix(mix), S, seed, mean_len=SEED_MEAN_LEN)
    cu = torch.tensor([0] + lens, dtype=torch.int64).cumsum(0)
    return cu.to(torch.int32).to(device)


def sweep_cu(S: int, seed: int, mean: int = SEED_MEAN_LEN, device="cuda"):
    """cu_seqlens of the sweep's mix: lengths uniform in 1..2*mean-1 (one document if mean >= S)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    cuts = [0]
    while cuts[-1] < S:
        step = S if mean >= S else int(torch.randint(1, 2 * mean, (), generator=g))
        cuts.append(min(S, cuts[-1] + step))
    return torch.tensor(cuts, dtype=torch.int32, device=device)
