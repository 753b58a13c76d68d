"""tools/host_rungs.py (the host time per call, rung by rung; here on the CPU) runs and reports
every rung: a smoke test with a few steps (the tool sets TRITON_INTERPRET=1 itself, so it runs in a
process of its own)."""

from __future__ import annotations

import os
import subprocess
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(REPO_ROOT, "tools", "host_rungs.py")


def test_every_rung_is_timed_against_the_trivial_function(tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, TOOL, "--steps", "3", "--rounds", "1"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    rows = {}
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0] in ("full", "no_launch", "no_launcher", "floor", "trivial"):
            rows[parts[0]] = (float(parts[1]), float(parts[2]))
    assert set(rows) == {"full", "no_launch", "no_launcher", "floor", "trivial"}, out.stdout
    assert rows["trivial"][1] == 1.0
    assert all(us > 0 for us, _ in rows.values())
