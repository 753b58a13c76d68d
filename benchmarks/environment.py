"""What every results file records about its run: date, commit, GPU, torch, triton, Python, host.

The commit is the environment variable ``BENCH_COMMIT`` when it is set (the GPU machine gets a copy of
the working tree whose ``.git``, if any, need not be the tree's commit: set it there), else
``git rev-parse HEAD`` of the repository (with ``-dirty`` when cakeconv/ or benchmarks/ have uncommitted
changes); without either it is None.
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", REPO_ROOT, *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_commit() -> str | None:
    """The commit of the measured tree (see the module docstring)."""
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    head = _git("rev-parse", "--short=12", "HEAD")
    if head is None:
        return None
    dirty = _git("status", "--porcelain", "--", "cakeconv", "benchmarks")
    return head + ("-dirty" if dirty else "")


def triton_version() -> str | None:
    try:
        import triton
    except Exception:  # noqa: BLE001 - any import failure means "not available"
        return None
    return triton.__version__


def run_environment(torch, device, cpu_name: str) -> dict:
    """The fields every run records; ``cpu_name`` stands for the GPU's name on a CPU run."""
    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "torch": torch.__version__,
        "triton": triton_version(),
        "python": platform.python_version(),
        "host": platform.node(),
        "cpu_count": os.cpu_count(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env["gpu"] = props.name
        env["sm"] = f"{props.major}.{props.minor}"
        env["l2_bytes"] = int(getattr(props, "L2_cache_size", 0) or 0)
        env["cuda"] = torch.version.cuda
    else:
        env["gpu"] = cpu_name
        env["sm"] = None
        env["l2_bytes"] = 0
        env["cuda"] = None
    return env
