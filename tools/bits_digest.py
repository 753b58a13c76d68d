"""SHA-256 digests of y, dx, dweight and dbias of the Triton backend over a fixed set of cases.

Run it once per code version (PYTHONPATH=<that version>) and compare the printed lines: equal
digests mean the two versions compute the same bits on every case. It is how a kernel change that
must not move a bit is shown against main on the GPU, where the
sigmoid and the row loops run the code users run. The cases span the document mixes of the
benchmark (every document of length 1, uniform 1-8 / 1-64 / 1-1,024, the seed mix, one document),
C = 128, 512 and 2048 (8 and 24 with --small), with and without bias, bf16 / fp16 / fp32 x, FP32 and
bf16 taps, and the [B, T, C] form, each through the picked configuration (that every other
configuration gives the same bits is tests/test_gpu.py's test_gpu_every_config_gives_the_same_bits).

    python tools/bits_digest.py --out digests.txt              # GPU
    TRITON_INTERPRET=1 python tools/bits_digest.py --small     # CPU interpreter, small shapes
    python tools/bits_digest.py --shard 1/3                    # every third case, from the second
    python tools/bits_digest.py --compare main.lines new_*.log  # a version's lines against a reference's

Shards print their lines in case order; sorting the lines of all shards gives one comparable list.

Inputs are drawn from a seeded generator on the device, so every version sees the same values.
"""

import argparse
import hashlib
import itertools
import os
import sys

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.append(REPO)  # the benchmarks package; after PYTHONPATH, where an A/B puts another cakeconv
from benchmarks.op import mix_lengths  # noqa: E402

import cakeconv  # noqa: E402


def digest(t):
    if t is None:
        return "-"
    return hashlib.sha256(t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()).hexdigest()[:16]


def cases(small: bool):
    S_big, S_small = 250_340, 600
    S = S_small if small else S_big
    Cs = (8, 24) if small else (128, 512, 2048)
    out = []
    for mix in ("ones", "uniform:1-8", "uniform:1-64", "uniform:1-1024", "seed", "one"):
        for C in Cs:
            out.append(dict(mix=mix, S=S, C=C, bias=C % 3 != 0, dtype=torch.bfloat16, wdtype=torch.float32))
    # dtypes, taps and odd lengths at one mix
    for dtype, wdtype in ((torch.float32, torch.float32), (torch.float16, torch.bfloat16)):
        out.append(dict(mix="uniform:1-8", S=S + 13, C=Cs[1], bias=True, dtype=dtype, wdtype=wdtype))
    out.append(dict(mix="uniform:1-64", S=S + 5, C=Cs[0], bias=False, dtype=torch.float32, wdtype=torch.float32))
    return out


def inputs(case, seed, device):
    """The case's x, dy, w, b and cu_seqlens, drawn on ``device`` from a generator seeded by the
    case (the same values in every process and code version on the same device and torch)."""
    g = torch.Generator(device=device).manual_seed(seed)
    S, C = case["S"], case["C"]
    x = torch.randn(S, C, generator=g, device=device).to(case["dtype"])
    dy = torch.randn(S, C, generator=g, device=device).to(case["dtype"])
    w = (torch.randn(C, 4, generator=g, device=device) * 0.5).to(case["wdtype"])
    b = (torch.randn(C, generator=g, device=device) * 0.5).to(case["wdtype"]) if case["bias"] else None
    lens = mix_lengths(case["mix"], S, seed, 3000)
    cu = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32, device=device)
    return x, dy, w, b, cu


def run_case(case, device):
    x, dy, w, b, cu = inputs(case, case["C"] * 31 + case["S"], device)
    lines = []
    y = cakeconv.cake_causal_conv1d_det_train_forward(x, w, b, cu, backend="triton")
    dx, dw, db = cakeconv.cake_causal_conv1d_det_train_backward(dy, x, w, b, cu, backend="triton")
    name = f"{case['mix']} S={case['S']} C={case['C']} bias={case['bias']} x={str(case['dtype'])[6:]} w={str(case['wdtype'])[6:]}"
    lines.append(f"{name}: y {digest(y)} dx {digest(dx)} dw {digest(dw)} db {digest(db)}")
    # the [B, T, C] form: equal-length documents, bitwise the packed call
    if case["mix"] == "one":
        T = case["S"] // 4
        xb = x[: 4 * T].reshape(4, T, -1)
        yb = cakeconv.cake_causal_conv1d_det_train_forward(xb, w, b, backend="triton")
        lines.append(f"{name} [4, {T}, C]: y {digest(yb)}")
    return lines


def _digest_table(path):
    """{case: "digests"} of the lines in a digest log (comment lines skipped)."""
    with open(path) as f:
        return dict(line.rstrip("\n").split(": y ", 1) for line in f if ": y " in line and not line.startswith("#"))


def compare(reference, logs, name):
    """Print how many cases of ``logs`` (one version's shards) have the reference's digests; each
    that differs is named with both. Returns the number that differ."""
    ref = _digest_table(reference)
    mine = {}
    for path in logs:
        mine.update(_digest_table(path))
    differ = [k for k in mine if k in ref and mine[k] != ref[k]]
    print(f"bits: {len(mine)} {name} cases, {len([k for k in mine if k in ref]) - len(differ)} equal to the reference, "
          f"{len(differ)} differ, {len([k for k in mine if k not in ref])} without a reference digest")
    for k in differ:
        print("  DIFFER", k, "\n    reference", ref[k], f"\n    {name}", mine[k])
    return len(differ)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true", help="small shapes (the CPU interpreter)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--shard", default="0/1", metavar="I/N",
                    help="run only the cases whose index is I modulo N (N processes in parallel compile N times faster)")
    ap.add_argument("--compare", nargs="+", metavar=("REFERENCE", "LOG"), default=None,
                    help="compare digest logs (one version's shards) with a reference's lines instead of running")
    ap.add_argument("--name", default="version", help="with --compare: the version's name in the report")
    args = ap.parse_args()
    if args.compare:
        compare(args.compare[0], args.compare[1:], args.name)
        return 0
    shard, n_shards = (int(v) for v in args.shard.split("/"))
    if not 0 <= shard < n_shards:
        raise ValueError(f"--shard {args.shard}: need 0 <= I < N")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"# cakeconv from {os.path.dirname(cakeconv.__file__)}, device {device}", flush=True)
    lines = []
    for i, case in enumerate(cases(args.small)):
        if i % n_shards != shard:
            continue
        for line in run_case(case, device):
            print(line, flush=True)
            lines.append(line)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
