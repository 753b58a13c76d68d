"""tools/cache_for_host.py: a Triton cache filled here under another installation's key (a GPU host
whose wheel of the same Triton release was built for another Python version).

The key is this machine's with the compiled library's hash exchanged, the host's wheel must be this
Triton release, and a warm-up under the host's key files its kernels where only that key finds them
(a second run finds them all; this machine's own warm-up finds none).
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import zipfile

import pytest
import triton
from triton.runtime.cache import triton_key

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO_ROOT, "tools"))
import cache_for_host  # noqa: E402

LIBRARY_HERE = os.path.join(os.path.dirname(triton.__file__), "_C", "libtriton.so")
OTHER_LIBRARY = b"another build of the same release's library"


def _wheel(path, version=triton.__version__, library=OTHER_LIBRARY):
    with zipfile.ZipFile(path, "w") as wheel:
        if library is not None:
            wheel.writestr(cache_for_host.LIBRARY, library)
        wheel.writestr(f"triton-{version}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: triton\nVersion: {version}\n")
    return str(path)


def test_this_machines_library_gives_this_machines_key():
    assert cache_for_host.host_key(LIBRARY_HERE) == triton_key()


def test_a_host_wheel_changes_only_the_librarys_hash(tmp_path):
    with open(LIBRARY_HERE, "rb") as f:
        here = cache_for_host._sha256(f)
    key = cache_for_host.host_key(_wheel(tmp_path / "host.whl"))
    assert key != triton_key()
    assert key == triton_key().replace(here, hashlib.sha256(OTHER_LIBRARY).hexdigest())


def test_another_release_or_a_wheel_without_the_library_is_refused(tmp_path):
    with pytest.raises(ValueError, match="the same release"):
        cache_for_host.host_key(_wheel(tmp_path / "old.whl", version="0.0.1"))
    with pytest.raises(ValueError, match="not a Triton wheel"):
        cache_for_host.host_key(_wheel(tmp_path / "empty.whl", library=None))


def _counts(out: subprocess.CompletedProcess) -> tuple[int, int]:
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    m = re.search(r"warmup: (\d+) compiled, (\d+) already cached", out.stdout)
    assert m, out.stdout
    return int(m[1]), int(m[2])


def test_the_hosts_kernels_are_found_under_its_key_only(tmp_path):
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "cache"), CAKECONV_KEY_AHEAD="0",
               PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("TRITON_INTERPRET", None)
    problem = ["--channels", "512", "--bias", "no", "--width", "2", "--activation", "none", "--tokens", "250340",
               "--target", "sm_90", "--jobs", "2"]
    tool = [sys.executable, os.path.join(REPO_ROOT, "tools", "cache_for_host.py"), "--host-triton",
            _wheel(tmp_path / "host.whl"), "--"]
    run = lambda cmd: subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)  # noqa: E731
    compiled, cached = _counts(run(tool + problem))
    assert compiled > 0 and cached == 0
    assert _counts(run(tool + problem)) == (0, compiled)
    assert _counts(run([sys.executable, "-m", "cakeconv", "warmup", *problem])) == (compiled, 0)
