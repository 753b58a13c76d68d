"""The KCP benchmark's workload: the seed's three documents, scaled and padded to each layout's rule.

The seed's workload is a packed batch of T = 65,536 tokens in 3 documents of 15,945, 21,845 and 27,746
tokens; ``--tokens T`` scales them proportionally (largest remainder). Layouts (SPEC section 4):
``contiguous`` needs T % P == 0, ``zigzag`` T % 2P == 0 (the last document is padded at its end),
``zigzag_per_document`` every document length % 2P == 0 (each document padded at its end).
"""

from __future__ import annotations

SEED_DOC_LENGTHS = (15945, 21845, 27746)  # the seed's workload: T = 65,536
SEED_TOKENS = sum(SEED_DOC_LENGTHS)
LAYOUTS = ("contiguous", "zigzag", "zigzag_per_document")
FORMS = ("single", "multi")
NUM_MULTI = 3  # q, k, v
SUBJECTS = ("kcp", "local", "kcp_multi", "local_multi")
PASSES = ("fwd", "bwd", "fwdbwd")
PASS_LABEL = {"fwd": "fwd", "bwd": "bwd", "fwdbwd": "fwd+bwd"}
FLOOR_FACTOR = {"fwd": 4, "bwd": 6, "fwdbwd": 10}  # bytes per (row, channel) with bf16 x
TARGET_OVERHEAD_PCT = 3.0  # SPEC section 7, GPU time, at S_local = 65,536, C = 4,096
TARGET_EAGER_PCT = 5.0  # eager-loop KCP call within 5% of the local op's
TARGET_HOST_RATIO = 1.5  # KCP host cost <= 1.5x the single-rank op's
TARGET_S_LOCAL = 65536


def scaled_doc_lengths(total_tokens: int) -> list[int]:
    """The seed's 3 document lengths scaled to ``total_tokens`` (largest remainder, exact sum)."""
    if total_tokens < len(SEED_DOC_LENGTHS):
        raise ValueError(f"--tokens must be at least {len(SEED_DOC_LENGTHS)} (one per document), got {total_tokens}")
    exact = [n * total_tokens / SEED_TOKENS for n in SEED_DOC_LENGTHS]
    lengths = [int(v) for v in exact]
    by_remainder = sorted(range(len(exact)), key=lambda i: lengths[i] - exact[i])
    for i in by_remainder[: total_tokens - sum(lengths)]:
        lengths[i] += 1
    return lengths


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def padded_doc_lengths(lengths: list[int], layout: str, world_size: int) -> list[int]:
    """Document lengths that meet the layout's divisibility rule for P ranks (SPEC section 4).

    contiguous: T % P == 0; zigzag: T % 2P == 0 (the last document is padded at its end);
    zigzag_per_document: every length % 2P == 0 (each document padded at its end).
    """
    if layout == "zigzag_per_document":
        return [_round_up(n, 2 * world_size) for n in lengths]
    multiple = world_size if layout == "contiguous" else 2 * world_size
    total = sum(lengths)
    return lengths[:-1] + [lengths[-1] + _round_up(total, multiple) - total]


def cu_from_lengths(lengths: list[int]) -> list[int]:
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return cu
