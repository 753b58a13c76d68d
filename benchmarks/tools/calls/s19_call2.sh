#!/usr/bin/env bash
# Session 19's second device call (one H200; carry nothing): every GPU test on main with v18c's backward, alone, the
# whole call to step 1 (every test but the specialization file's coverage check, 6 workers: 444 s in session 16). The
# coverage check needs the specialization file run serially, which is compile-bound and was cut in every call that
# tried it after a parallel step (sessions 14-16): not attempted here.
set -u
export PYTHONUNBUFFERED=1
GPU_TESTS_S=555 SPEC_TESTS_S=1 bash benchmarks/device_run.sh gputestsx 2>&1 | head -60
pkill -f pytest 2>/dev/null
rm -f "$OUT/env.txt" "$OUT/pytest_gpu_specialization.log"
grep -E "^tests/.*(PASSED|FAILED|ERROR)|PASSED|FAILED" "$OUT/pytest_gpu.log" | grep -c PASSED
grep -E "FAILED|ERROR" "$OUT/pytest_gpu.log" | tail -12
