#!/usr/bin/env bash
# Session 15's fourth device call (one H200), branch v17-group-ticket: the test that failed in call 1
# (test_gpu_every_config_gives_the_same_bits[4096], its message lost to the step's limit) alone, one process, with
# its traceback. ticket_diag.py (call 3) found every backward configuration right at its shape.
set -u
export PYTHONUNBUFFERED=1
CAKECONV_TEST_GPUS=1 timeout 300 python3 -m pytest -v -rf --tb=long -x -m gpu "tests/test_gpu.py::test_gpu_every_config_gives_the_same_bits[4096]" \
  -p no:cacheprovider > "$OUT/pytest_every_config_4096.log" 2>&1
echo "rc $?"
grep -E "^E |Error|passed|failed|assert" "$OUT/pytest_every_config_4096.log" | head -30
