"""Fill a Triton cache on this machine (no GPU) that a GPU host running another Python version hits.

Triton keys every cached kernel with the hash of its own installation (``triton_key()``: its Python
files and its compiled library ``_C/libtriton.so``). Each Python version's wheel of one Triton
release carries the same Python files but its own build of that library, so a cache filled here
under Python 3.11 misses every entry on a host that runs the same Triton under Python 3.12
(notes 3.7). This tool takes the host's wheel (or its ``libtriton.so``), checks that it is the
release installed here, computes the host's installation key (this machine's key with the
library's hash exchanged) and runs ``python -m cakeconv warmup`` under that key: the kernels are
compiled by this machine's Triton (the same compiler, so the same binaries) and filed where the
host looks them up.

    pip download triton==3.6.0 --python-version 3.12 --only-binary=:all: --no-deps -d /tmp/wheel
    TRITON_CACHE_DIR=/abs/path python tools/cache_for_host.py --host-triton /tmp/wheel/triton-*.whl -- \\
        --channels 512,2048 --bias no --width 2,3,4,5,7,8 --activation silu,none --tokens 250340 \\
        --target sm_90 --jobs 2

The warm-up's arguments follow ``--`` (``--target`` names the host's GPU). On the host, set
TRITON_CACHE_DIR to the same absolute path (Triton's group files name their entries' paths). Only
the ``.json`` and ``.cubin`` files of the folder are read on a hit; the rest may be left behind.
``--print-key`` prints the SHA-256 of the host's key (what ``triton_key()`` hashes to there) and
compiles nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import zipfile

LIBRARY = "triton/_C/libtriton.so"


def _sha256(stream) -> str:
    digest = hashlib.sha256()
    for chunk in iter(lambda: stream.read(1 << 20), b""):
        digest.update(chunk)
    return digest.hexdigest()


def library_hash(path: str) -> tuple[str, str | None]:
    """(SHA-256 of the host's libtriton.so, the wheel's Triton version or None for a bare library)."""
    if not path.endswith(".whl"):
        with open(path, "rb") as f:
            return _sha256(f), None
    with zipfile.ZipFile(path) as wheel:
        names = wheel.namelist()
        if LIBRARY not in names:
            raise ValueError(f"{path} holds no {LIBRARY}: not a Triton wheel")
        meta = next((n for n in names if n.endswith(".dist-info/METADATA")), None)
        version = None
        if meta is not None:
            for line in wheel.read(meta).decode().splitlines():
                if line.startswith("Version:"):
                    version = line.split(":", 1)[1].strip()
                    break
        with wheel.open(LIBRARY) as f:
            return _sha256(f), version


def host_key(path: str) -> str:
    """The installation key Triton computes on the host whose wheel (or libtriton.so) is ``path``."""
    import triton
    from triton.runtime import cache

    host_hash, version = library_hash(path)
    if version is not None and version != triton.__version__:
        raise ValueError(f"the host's Triton is {version}, this machine's {triton.__version__}: the same release is "
                         "needed (only the compiled library may differ)")
    with open(os.path.join(os.path.dirname(triton.__file__), "_C", "libtriton.so"), "rb") as f:
        here = _sha256(f)
    key = cache.triton_key()
    if key.count(here) != 1:
        raise RuntimeError("this Triton's installation key does not hold its library's hash once: the key's "
                           "layout changed (triton/runtime/cache.py, triton_key)")
    return key.replace(here, host_hash)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host-triton", required=True, help="the host's Triton wheel (.whl) or its _C/libtriton.so")
    ap.add_argument("--print-key", action="store_true", help="print the SHA-256 of the host's key and stop")
    ap.add_argument("warmup_args", nargs=argparse.REMAINDER, help="-- then python -m cakeconv warmup's arguments")
    a = ap.parse_args(argv)
    key = host_key(a.host_triton)
    if a.print_key:
        print(hashlib.sha256(key.encode()).hexdigest())
        return 0
    from triton.runtime import cache

    cache.triton_key = lambda: key  # read through the module by get_cache_key; the warm-up's workers fork
    from cakeconv import warmup

    args = a.warmup_args[1:] if a.warmup_args[:1] == ["--"] else a.warmup_args
    return warmup.main(args)


if __name__ == "__main__":
    sys.exit(main())
