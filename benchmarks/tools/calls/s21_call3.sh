#!/usr/bin/env bash
# Session 21, call 3 (one H200): the specialization file on this tree (main; the kernels of calls 1-2), its cases in
# 12 parallel workers (CASES_S seconds, 165 as run), each writing what its launches recorded to
# CAKECONV_SPEC_SEEN_DIR; then the coverage check (every integer argument of every kernel took 1, a multiple of 16
# and another value) in a process of its own, over those records, on a cold machine (no Triton cache). Calls 1 and 2
# ran the 24 cases among the other GPU tests (all passed), but the serial run that feeds the coverage check was cut
# at its limit (10 of 25 cases).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD CAKECONV_SPEC_SEEN_DIR=/tmp/spec_seen_$$
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
rm -rf "$CAKECONV_SPEC_SEEN_DIR"
CAKECONV_TEST_GPUS=1 timeout ${CASES_S:-165} python3 -m pytest -v -rf -m gpu -p no:cacheprovider -n 12 --dist load \
  -k "not every_integer_argument" --durations=8 tests/test_gpu_specialization.py > "$OUT/pytest_gpu_spec_cases.log" 2>&1
say "cases: rc $?; $(ls "$CAKECONV_SPEC_SEEN_DIR" | wc -l) record files"
timeout 30 python3 -m pytest -v -rf -m gpu -p no:cacheprovider \
  tests/test_gpu_specialization.py::test_zz_every_integer_argument_took_1_16k_and_other > "$OUT/pytest_gpu_spec_zz.log" 2>&1
say "coverage check: rc $?"
grep -hE "FAILED|ERROR|SKIPPED| passed| failed|^[0-9.]+s call" "$OUT"/pytest_gpu_spec_*.log | tail -14
