#!/usr/bin/env bash
# Session 19's fourth device call (one H200, still warm: every specialization case compiled by s19_call3.sh), as run:
# the specialization file serially in one process, so its coverage check sees what its other tests recorded.
CAKECONV_TEST_GPUS=1 timeout 150 python3 -m pytest -v -rf -m gpu -p no:cacheprovider tests/test_gpu_specialization.py > $OUT/pytest_gpu_spec_serial.log 2>&1; echo rc $?; grep -E "FAILED|ERROR|passed|failed|every_integer" $OUT/pytest_gpu_spec_serial.log | tail -8
