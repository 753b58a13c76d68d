#!/usr/bin/env bash
# Session 16's second device call (one H200), main + the channel-block reference: call 1's four out-of-memory
# failures and the test whose whole-tensor reference held 112 GiB, in 5 workers together (the GPU's memory in use
# sampled every 0.5 s), then the specialization file serially (cut at 110 s in call 1), with its durations.
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > "$OUT/mem_used_mib.txt" 2>&1 &
SMI=$!
CAKECONV_TEST_GPUS=1 timeout 330 python3 -m pytest -v -rf -m gpu -p no:cacheprovider -n 5 --dist load --durations=10 \
  tests/test_gpu.py::test_gpu_matches_reference_and_oracle \
  tests/test_gpu.py::test_gpu_dweight_tree_is_the_documented_order_every_time \
  tests/test_gpu.py::test_gpu_autograd_saves_only_inputs_and_small_backward_peak \
  "tests/test_gpu.py::test_gpu_segment_indices_give_the_search_bits" \
  "tests/test_gpu.py::test_gpu_every_config_gives_the_same_bits" > "$OUT/pytest_rerun.log" 2>&1
say "step 1: rc $?"
pkill -f pytest 2>/dev/null; kill $SMI 2>/dev/null
echo "GPU memory in use, max: $(sort -n "$OUT/mem_used_mib.txt" | tail -1) MiB"
grep -E "FAILED|ERROR|passed|failed|^[0-9.]+s call" "$OUT/pytest_rerun.log" | tail -25
CAKECONV_TEST_GPUS=1 timeout 220 python3 -m pytest -v -rf -m gpu tests/test_gpu_specialization.py -p no:cacheprovider \
  --durations=8 > "$OUT/pytest_gpu_specialization.log" 2>&1
say "step 2: rc $?"
grep -E "FAILED|ERROR|passed|failed|^[0-9.]+s call" "$OUT/pytest_gpu_specialization.log" | tail -14
