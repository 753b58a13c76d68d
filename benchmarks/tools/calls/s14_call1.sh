#!/usr/bin/env bash
# Session 14's first device call (one H200). Branch v15-one-group-ticket: every GPU test (6 workers, full log kept),
# then, in the time left, issue 17's backward sweep on documents of about 4 tokens (the segment-index variant with
# every candidate of tuning.BWD_CONFIGS, R=2/BC=128/2 warps among them) at C = 512 and 2048.
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
CAKECONV_TEST_GPUS=1 timeout 470 python3 -m pytest -v -rf -m gpu tests -p no:cacheprovider -n 6 --dist loadgroup \
  --ignore=tests/multigpu --ignore=tests/test_integrations_fla.py --durations=10 > "$OUT/pytest_gpu_v15.log" 2>&1
say "gpu tests: rc $?"
LEFT=$(( 575 - ($(date +%s) - T0) ))
mkdir -p "$OUT/sweep"
[ $LEFT -gt 30 ] && timeout $LEFT python3 benchmarks/tools/sweep_configs.py --passes bwd --C 512,2048 --mean-doc 4 \
  --reps 20 --out "$OUT/sweep" > "$OUT/sweep/sweep.log" 2>&1
say "sweep: rc $?"
mkdir -p "$OUT/s14c1"; mv "$OUT"/*.log "$OUT/sweep" "$OUT/s14c1/" 2>/dev/null; tar -czf "$OUT/s14_call1.tgz" -C "$OUT" s14c1
echo "== gpu tests"; grep -E "FAILED|ERROR|passed|failed|^E " "$OUT/s14c1/pytest_gpu_v15.log" | tail -14
echo "== sweep"; tail -25 "$OUT/s14c1/sweep/sweep.log"
