#!/usr/bin/env bash
# The test command (README quick start, .ci/run): every CPU tier, each in its own pytest process.
#   tier 1 + 3: reference backend, API, errors, determinism, KCP over gloo (2-8 ranks)
#   tier 2:     the real Triton kernels under TRITON_INTERPRET=1 (set before triton is imported)
# Tier 4 (GPU) tests are marked `gpu` and skip here; run `python -m pytest -m gpu tests` on a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== tiers 1 and 3: reference backend, API, KCP over gloo, two worker processes =="
# (two workers: 212 s where one took 300-420 s on a 2-core machine; the KCP tests spawn their ranks
# with file:// rendezvous in per-test temporary folders, so two of them can run at once)
python -m pytest -q tests -n 2
echo "== tier 2: Triton kernels in the CPU interpreter (TRITON_INTERPRET=1), two worker processes =="
# (pure-Python interpretation, one core per worker: 2 workers took 380 s where one took 583 s on a
# 2-core machine; each worker is its own process, so TRITON_INTERPRET is set before triton loads;
# the 8 slowest tests are listed at the end: tier 2 is most of CI's time)
TRITON_INTERPRET=1 python -m pytest -q -m interpret tests -n 2 --durations=8
