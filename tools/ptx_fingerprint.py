"""Fingerprint the PTX of every Triton launch the test cases make (no GPU needed).

Records the launches of tests/launch_cases.py on CPU tensors (nothing runs), compiles each distinct
specialization for sm_90 down to PTX with Triton's own binder and pipeline, and writes one line per
(kernel, specialization): the SHA-256 of its PTX. Two trees whose kernels compile to the same PTX
for a launch compute the same bits at the same speed there: this is how a change to the kernels'
source is shown to leave the width-4 SiLU kernels as they were.

``--stage ttir`` hashes the TTIR instead (after Triton's TTIR passes, source locations left out,
the constants' definitions in sorted order):
seconds per launch where PTX takes minutes at W = 7 and 8 (the layout pass). Equal TTIR and options
give equal PTX (the later stages depend on nothing else), so it shows the same; a different TTIR
may still compile to the same PTX (then compare the PTX of those launches, ``--keys-of``).

    python tools/ptx_fingerprint.py OUT.json [--kernels a,b] [--jobs N] [--keys-of OLD.json] [--stage ttir]
    python tools/ptx_fingerprint.py --compare A.json B.json
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import re
import sys
from concurrent.futures import ProcessPoolExecutor


def _specs(kernel_names):
    """[(kernel name, frozen specialization, (fn module, fn name), spec)] of every distinct launch."""
    sys.path.insert(0, os.getcwd())
    from cakeconv.cake_causal_conv1d_det_train_backend import checks
    from cakeconv.cake_causal_conv1d_det_train_backend.kernels import launch
    from tests import launch_cases
    from tests.test_specialization import triton_specialization

    checks.INTERPRET = True
    with launch.record_launches() as launches:
        for name in launch_cases.SINGLE_CASES:
            launch_cases.run_single(name, "cpu", "triton")
        for name in launch_cases.KCP_CASES:
            launch_cases.run_kcp(name, "cpu", "triton")
    seen = {}
    for r in launches:
        if kernel_names and r.kernel.name not in kernel_names:
            continue
        spec = triton_specialization(r.kernel.fn, r.args, r.options)
        key = (r.kernel.name, named_key(r.kernel.fn, spec))
        args = tuple(a.detach() if hasattr(a, "detach") else a for a in r.args)
        seen.setdefault(key, (r.kernel.name, args, r.options))
    return seen


# Compile-time constants that a launch of the seed's width and activation (W = 4, SiLU) did not have
# before the kernels took them, and the quick twins' switch (QUICK, 0 in every launch recorded here):
# left out of the key at those values, so that the launches keep their keys across those changes.
_SEED_CONSTANTS = {"W": 4, "ACT": 1, "QUICK": 0}


def named_key(fn, spec) -> str:
    """A launch's specialization by parameter name: each pointer's type and attributes, each
    constexpr's value, the compile options (W = 4 and ACT = 1 left out, _SEED_CONSTANTS)."""
    options, signature, constexprs, attrs = spec
    names = [p.name for p in fn.params]
    consts = {names[i[0]]: v for i, v in constexprs.items()}
    for name, value in _SEED_CONSTANTS.items():
        if consts.get(name) == value:
            del consts[name]
    parts = [f"{n}:{t}" for n, t in signature.items() if t != "constexpr"]
    parts += [f"{n}={v!r}" for n, v in sorted(consts.items())]
    parts += [f"{names[i[0]]}@{v!r}" for i, v in sorted(attrs.items())]
    parts += [f"{k}={v!r}" for k, v in sorted(options.__dict__.items())]
    return " ".join(parts)


_CONSTANT = re.compile(r"\s*(%[\w.]+) = arith\.constant (.*)$")


def constants_by_value(ttir: str) -> str:
    """The TTIR with every constant named by its value and the constants' definitions sorted. MLIR
    hoists the constants to the top of the kernel and numbers them (``%cst_3``) in the order it
    meets them, which moves when code moves into a helper function (inlined): not a change of the
    program."""
    lines = ttir.splitlines()
    names = {}
    for line in lines:
        m = _CONSTANT.match(line)
        if m:
            names[m[1]] = "%<" + m[2] + ">"
    lines = [re.sub(r"%[\w.]+", lambda t: names.get(t[0], t[0]), line) for line in lines]
    at = [i for i, line in enumerate(lines) if " = arith.constant " in line]
    for i, line in zip(at, sorted(lines[i] for i in at)):
        lines[i] = line
    return "\n".join(lines)


def _ptx_hash(item, stage="ptx"):
    key, (name, args, options) = item
    sys.path.insert(0, os.getcwd())
    os.environ.setdefault("TRITON_DISABLE_LINE_INFO", "1")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from cakeconv.cake_causal_conv1d_det_train_backend.kernels import launch
    from tests.test_specialization import triton_specialization

    kernel = next(k for k in launch.KERNELS if k.name == name)
    opts, signature, constexprs, attrs = triton_specialization(kernel.fn, args, options)
    if stage == "ttir":
        from tests.test_specialization import compile_front_end

        text = str(compile_front_end(kernel.fn, opts, signature, constexprs, attrs))
        text = re.sub(r" loc\((#loc\d*|\"[^\"]*\"[^)]*)\)", "", text)
        text = "\n".join(line for line in text.splitlines() if not line.startswith("#loc"))
        return "|".join(key), hashlib.sha256(constants_by_value(text).encode()).hexdigest()
    src = ASTSource(fn=kernel.fn, signature=signature, constexprs=constexprs, attrs=attrs)
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts.__dict__)
    return "|".join(key), hashlib.sha256(normalized_ptx(compiled.asm["ptx"]).encode()).hexdigest()


def normalized_ptx(ptx: str) -> str:
    """The kernel's PTX from its entry on, without what names the source rather than the code:
    line-info directives (.loc, .file: a moved line or another checkout changes them) and the
    debug sections after the code."""
    body = ptx[ptx.index(".visible .entry"):] if ".visible .entry" in ptx else ptx
    body = body.split(".section\t.debug")[0].split(".section .debug")[0]
    keep = [ln for ln in body.splitlines() if not ln.lstrip().startswith((".loc", ".file"))]
    return "\n".join(keep)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?")
    ap.add_argument("--kernels", default="")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--compare", nargs=2)
    ap.add_argument("--keys-of", default=None, help="only the launches fingerprinted in this earlier file")
    ap.add_argument("--stage", default="ptx", choices=("ptx", "ttir"), help="what is hashed (module docstring)")
    a = ap.parse_args()
    if a.compare:
        old, new = (json.load(open(p)) for p in a.compare)
        same = [k for k in old if new.get(k) == old[k]]
        diff = [k for k in old if k in new and new[k] != old[k]]
        missing = [k for k in old if k not in new]
        print(f"{len(same)} identical, {len(diff)} different, {len(missing)} missing of {len(old)}")
        for k in diff + missing:
            print(("DIFFERENT " if k in diff else "MISSING   ") + k[:160])
        sys.exit(1 if diff or missing else 0)
    items = list(_specs(set(filter(None, a.kernels.split(",")))).items())
    if a.keys_of:
        keep = set(json.load(open(a.keys_of)))
        items = [it for it in items if "|".join(it[0]) in keep]
    print(f"{len(items)} distinct launches", flush=True)
    fingerprint = functools.partial(_ptx_hash, stage=a.stage)
    if a.jobs == 1:
        result = dict(map(fingerprint, items))
    else:
        with ProcessPoolExecutor(a.jobs) as ex:
            result = dict(ex.map(fingerprint, items))
    json.dump(result, open(a.out, "w"), indent=0, sort_keys=True)
    print(f"wrote {len(result)} fingerprints to {a.out}")


if __name__ == "__main__":
    main()
