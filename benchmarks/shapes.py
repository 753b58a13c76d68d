"""The shapes of a run: the seed's single-rank grid, the shapes --rows selects, and one shape's inputs.

Inputs are seeded (``--seed``) and the same for every provider: x and dy bf16 [S, C] standard normal, taps
fp32 [C, W] N(0, 0.25), bias fp32 [C] N(0, 0.04), cu_seqlens int32 on the device. A shape has several
input sets (x, dy): at least 2, enough that they total 8x the L2, at most ``max_sets``; the timed calls
take them in turn, so two calls in a row never read the same data. The input sets do not depend on the
width W: the taps and bias of every W are drawn from the generator state right after the sets, so the
W = 4 taps are those drawn before the width was a parameter (ShapeData.use_taps).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from doc_mixes import DEFAULT_MIX, mix_lengths
from progress import log
from random_inputs import activations, bias, generator, taps

SWEEP_S = 250340
S_SWEEP_C = 512
S_SWEEP = [239718, 245028, 249866, 250340, 258574, 259042, 259584, 261393]
C_SWEEP = [128, 256, 1024, 1280, 1344, 1160, 1536, 2048, 2560, 4096, 8192]
S_262144_C = [1160, 1280, 1536]
QUICK_C = [128, 512, 4096]

DRY_SWEEP_S = 1531
DRY_SHAPES = [(1531, 16), (1531, 64), (1531, 200), (2053, 64)]


def full_grid():
    shapes = [(s, S_SWEEP_C) for s in S_SWEEP]
    shapes += [(SWEEP_S, c) for c in C_SWEEP]
    shapes += [(262144, c) for c in S_262144_C]
    return shapes


def quick_grid():
    return [(SWEEP_S, c) for c in QUICK_C]


def parse_shape(text: str):
    s, c = text.lower().split("x")
    return int(s), int(c)


def _parse_rows(rows: str):
    """(C values to keep, SxC shapes to add) of a --rows list."""
    keep_c, extra = set(), []
    for tok in rows.replace(" ", "").split(","):
        if not tok:
            continue
        if "x" in tok.lower():
            extra.append(parse_shape(tok))
        else:
            keep_c.add(int(tok))
    return keep_c, extra


def select_shapes(rows: str | None, dry_run: bool, quick: bool):
    """(shapes [(S, C)], S of the C sweep) of a run: the grid, or the tiny grid in --dry-run, or --quick's;
    ``rows``: C values keep the rows of those C, SxC tokens add shapes (alone: exactly those shapes)."""
    if dry_run:
        shapes, sweep_s = list(DRY_SHAPES), DRY_SWEEP_S
    elif quick:
        shapes, sweep_s = quick_grid(), SWEEP_S
    else:
        shapes, sweep_s = full_grid(), SWEEP_S
    if rows:
        keep_c, extra = _parse_rows(rows)
        if keep_c:
            # C values pick rows of the full grid (of the S=250340 sweep with --quick, of the tiny grid in --dry-run)
            if dry_run:
                base = list(DRY_SHAPES)
            elif quick:
                base = [sc for sc in full_grid() if sc[0] == SWEEP_S]
            else:
                base = full_grid()
            shapes = [sc for sc in base if sc[1] in keep_c]
            missing = keep_c - {c for _, c in shapes}
            if missing:
                log(f"note: --rows C values not in the grid, ignored: {sorted(missing)} (use SxC to add a shape)")
        elif extra:
            shapes = []
        shapes += [sc for sc in extra if sc not in shapes]
        if extra and not keep_c:
            counts = {}
            for s, _ in shapes:
                counts[s] = counts.get(s, 0) + 1
            if sweep_s not in counts:
                sweep_s = max(counts, key=counts.get)
    for s, c in shapes:
        if c % 8:
            raise SystemExit(f"C must be a multiple of 8, got {c}")
    return shapes, sweep_s


@dataclass
class ShapeData:
    """One shape's inputs; ``extra`` holds what providers prepare per shape (fla's chunk indices, Dao's seq_idx)."""

    S: int
    C: int
    device: object
    lengths: list
    cu: object  # int32 [N+1] on the device
    pos: object  # int64 [S] position of each token in its document (reference only)
    sets: list  # [(x, dy)] bf16 [S, C]
    w: object  # fp32 [C, W]
    b: object  # fp32 [C]
    mix: str = DEFAULT_MIX
    activation: str | None = "silu"  # "silu" or None (no activation)
    taps_state: object = None  # the generator state the taps and bias of every width are drawn from
    extra: dict = field(default_factory=dict)

    @property
    def width(self) -> int:
        return self.w.shape[1]

    def use_taps(self, torch, width: int, activation) -> None:
        """Taps [C, width] and bias drawn from the generator state right after the input sets (W = 4: the taps
        and bias make_shape drew), and the activation ("silu" or None) the providers apply."""
        if width != self.width:
            gen = torch.Generator(device=self.device)
            gen.set_state(self.taps_state)
            self.w = taps(torch, gen, self.C, self.device, width)
            self.b = bias(torch, gen, self.C, self.device)
        self.activation = activation

    @property
    def n_docs(self):
        return len(self.lengths)

    @property
    def doc_min(self):
        return min(self.lengths) if self.lengths else 0

    @property
    def doc_max(self):
        return max(self.lengths) if self.lengths else 0

    def chain_params(self, torch, chain: int, use_bias: bool):
        """``chain`` distinct taps (and biases) for the eager loop: fp32 leaves, the same for every provider."""
        key = ("chain", chain, use_bias, self.width)
        if key not in self.extra:
            gen = generator(torch, self.device, shape_seed(0, self.S, self.C) + 17)
            ws = [taps(torch, gen, self.C, self.device, self.width) for _ in range(chain)]
            bs = [bias(torch, gen, self.C, self.device) if use_bias else None for _ in range(chain)]
            self.extra[key] = (ws, bs)
        return self.extra[key]


def shape_seed(seed: int, S: int, C: int) -> int:
    """The seed of one grid shape's inputs and document lengths."""
    return seed * 1_000_003 + S * 131 + C


def make_shape(torch, S, C, device, seed, mean_doc_len, l2_bytes, max_sets, mix=DEFAULT_MIX):
    """The inputs of one shape and mix (see the module docstring)."""
    sh_seed = shape_seed(seed, S, C)
    lens = mix_lengths(mix, S, sh_seed, mean_doc_len)
    cu_host = [0]
    for n in lens:
        cu_host.append(cu_host[-1] + n)
    cu = torch.tensor(cu_host, dtype=torch.int32, device=device)
    lens_t = torch.tensor(lens, dtype=torch.int64, device=device)
    starts = torch.repeat_interleave(cu[:-1].to(torch.int64), lens_t)
    pos = torch.arange(S, dtype=torch.int64, device=device) - starts
    set_bytes = 2 * S * C * 2
    n_sets = max(2, min(max_sets, math.ceil(8 * l2_bytes / max(1, set_bytes))))
    gen = generator(torch, device, sh_seed)
    sets = []
    for _ in range(n_sets):
        x = activations(torch, gen, S, C, device)
        sets.append((x, activations(torch, gen, S, C, device)))
    state = gen.get_state()
    w = taps(torch, gen, C, device)
    b = bias(torch, gen, C, device)
    return ShapeData(S=S, C=C, device=device, lengths=lens, cu=cu, pos=pos, sets=sets, w=w, b=b, mix=mix,
                     taps_state=state)

