#!/usr/bin/env bash
# Session 11's second device call (2 H200s): every GPU test on this tree (issue 16's plans: the fast path launches
# the compiled kernels directly), the two-device test with both GPUs visible, then the CUDA-graph test of branch
# v13-segment-ids (git archive of the whole tree in .variants/branch_v13b; carry .variants), to name the failure
# that session 10's and this session's cut runs could not show.
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
timeout 390 bash benchmarks/device_run.sh gputestsx > "$OUT/gputestsx.txt" 2>&1; say "gputestsx: rc $?"
# both GPUs visible (gputestsx gives each worker one): operands on a GPU that is not the current one
PYTHONPATH=$PWD timeout 60 python3 -m pytest -v -rf -m gpu tests/test_gpu_devices.py -p no:cacheprovider \
  > "$OUT/pytest_gpu_devices.log" 2>&1; say "devices test: rc $?"
mkdir -p "$OUT/branch"
(cd .variants/branch_v13b && PYTHONPATH=$PWD OUT="$OUT/branch" timeout 120 python3 -m pytest -v -rf -m gpu tests/test_cuda_graphs.py \
   -p no:cacheprovider --tb=long > "$OUT/branch/pytest_cuda_graphs_v13b.log" 2>&1); say "branch graph test: rc $?"
rm -rf "$OUT/branch/env.txt"
echo "== gputestsx (this tree)"; grep -E "FAILED|ERROR|passed|failed" "$OUT/pytest_gpu.log" | tail -15
echo "== two devices"; grep -E "PASSED|FAILED|SKIPPED|^E |passed|failed" "$OUT/pytest_gpu_devices.log" | head -12
echo "== branch v13b, tests/test_cuda_graphs.py"; grep -E "^E |FAILED|passed|failed|Error" "$OUT/branch/pytest_cuda_graphs_v13b.log" | head -30
