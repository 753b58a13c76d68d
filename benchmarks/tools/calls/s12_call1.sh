#!/usr/bin/env bash
# Session 12's first device call (2 H200s): every GPU test of branch v13-segment-ids (git archive of the whole
# tree in .variants/branch_v13b; carry .variants), now that the oracle no longer loops over 50,021 documents,
# then the two-device test with both GPUs visible.
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
cd .variants/branch_v13b
PYTHONPATH=$PWD timeout 470 bash benchmarks/device_run.sh gputestsx > "$OUT/gputestsx.txt" 2>&1; say "branch gputestsx: rc $?"
PYTHONPATH=$PWD timeout 60 python3 -m pytest -v -rf -m gpu tests/test_gpu_devices.py -p no:cacheprovider \
  > "$OUT/pytest_gpu_devices.log" 2>&1; say "devices test: rc $?"
rm -f "$OUT/env.txt"
echo "== gputestsx (branch v13b)"; grep -E "FAILED|ERROR|passed|failed|^[0-9.]+s call" "$OUT/pytest_gpu.log" | tail -22
echo "== two devices"; grep -E "FAILED|^E |passed|failed" "$OUT/pytest_gpu_devices.log" | head -8
