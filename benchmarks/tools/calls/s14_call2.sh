#!/usr/bin/env bash
# Session 14's second device call (one H200), branch v15-one-group-ticket. Call 1's GPU tests ran out of time
# (470 s) inside the specialization file, which runs serially in one worker (its last test reads what the others
# recorded in that process). So: first compile its cases in 8 parallel workers (--dist load; the Triton cache is
# shared), then the file serially (cache hits), beside the one other unfinished test; then issue 17's sweep.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
timeout 200 python3 -m pytest -q -m gpu tests/test_gpu_specialization.py -p no:cacheprovider -n 8 --dist load \
  -k "not every_integer" > "$OUT/pytest_warm.log" 2>&1
say "warm: rc $?"
CAKECONV_TEST_GPUS=1 timeout 90 python3 -m pytest -v -rf -m gpu -p no:cacheprovider \
  "tests/test_gpu.py::test_gpu_uniform_batch_and_dtypes" > "$OUT/pytest_uniform.log" 2>&1 &
CAKECONV_TEST_GPUS=1 timeout 300 python3 -m pytest -v -rf -m gpu tests/test_gpu_specialization.py -p no:cacheprovider \
  --durations=8 > "$OUT/pytest_spec.log" 2>&1
say "specialization: rc $?"
wait; say "uniform: done"
LEFT=$(( 570 - ($(date +%s) - T0) ))
mkdir -p "$OUT/sweep"
[ $LEFT -gt 30 ] && timeout $LEFT python3 benchmarks/tools/sweep_configs.py --passes bwd --C 512,2048 --mean-doc 4 \
  --reps 20 --out "$OUT/sweep" > "$OUT/sweep/sweep.log" 2>&1
say "sweep: rc $?"
mkdir -p "$OUT/s14c2"; mv "$OUT"/*.log "$OUT/sweep" "$OUT/s14c2/" 2>/dev/null; tar -czf "$OUT/s14_call2.tgz" -C "$OUT" s14c2
for f in warm uniform spec; do echo "== $f"; grep -E "FAILED|ERROR|passed|failed|^E " "$OUT/s14c2/pytest_$f.log" | tail -8; done
echo "== sweep"; tail -25 "$OUT/s14c2/sweep/sweep.log"
