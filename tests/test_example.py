"""The runnable example runs in CI: examples/train_kcp_toy.py exits 0 and prints its OK line.

It spawns 2 gloo ranks on the CPU with the reference backend (no TRITON_INTERPRET), trains a toy
layer with CakeShortConv under KCP and checks loss and gradients against a 1-rank run itself.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.dist
def test_train_kcp_toy_example_runs_and_matches():
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)  # the example must not need the interpreter
    proc = subprocess.run([sys.executable, str(REPO / "examples" / "train_kcp_toy.py")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=180)
    report = f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert proc.returncode == 0, report
    ok_lines = [line for line in proc.stdout.splitlines() if line.startswith("OK: KCP over 2 ranks matches")]
    assert len(ok_lines) == 1, report
    assert "conv.weights.2" in proc.stdout, report  # the gradient table is printed
