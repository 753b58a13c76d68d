#!/usr/bin/env bash
# Session 16's first device call (one H200), main: every GPU test on the code issue 17 closes on, alone in the call
# (device_run.sh gputestsx: step 1 in 6 workers, then the specialization file serially), with the margins
# session 15 learned (step 1 gets 450 s; its xdist workers are killed if it is cut).
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s)
GPU_TESTS_S=450 SPEC_TESTS_S=110 bash benchmarks/device_run.sh gputestsx
pkill -f "pytest" 2>/dev/null
echo "[$(( $(date +%s) - T0 )) s] done"
