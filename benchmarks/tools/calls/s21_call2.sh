#!/usr/bin/env bash
# Session 21, call 2 (one H200, right after call 1 on the same machine where it stayed warm, so its Triton cache is
# kept): the GPU tests call 1 left unfinished (the node ids of its $OUT/unfinished.txt, copied to
# ./s21_unfinished.txt, untracked), 8 workers; then the specialization file serially if call 1 cut it.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
say "$(wc -l < s21_unfinished.txt) tests"
CAKECONV_TEST_GPUS=1 timeout ${TESTS_S:-480} python3 -m pytest -v -rf -m gpu -p no:cacheprovider -n 8 --dist load \
  --durations=15 $(cat s21_unfinished.txt) > "$OUT/pytest_gpu_rest.log" 2>&1
say "GPU tests: rc $?"
if [ "${SPEC:-0}" = 1 ]; then
  timeout $(( 585 - ($(date +%s) - T0) )) python3 -m pytest -v -rf -m gpu -p no:cacheprovider \
    tests/test_gpu_specialization.py > "$OUT/pytest_gpu_spec.log" 2>&1
  say "specialization file serially: rc $?"
fi
grep -hE "FAILED|ERROR| passed| failed" "$OUT"/pytest_gpu_*.log | tail -12
