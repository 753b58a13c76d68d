#!/usr/bin/env bash
# Session 15's first device call (one H200), branch v17-group-ticket: the ticket kernel adds each group of the
# dweight tree (its last program per group and channel block), so S > 8192 takes two backward launches (ticket,
# finalize) instead of three. First every GPU test in the two steps of `device_run.sh gputestsx`, then, in the
# time left, the host probe with its eager rows (S = 250,340, C = 128 and 512: eager loop against GPU time), this
# tree, then main (.variants/main = git archive of main 332148b, carry .variants).
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
GPU_TESTS_S=370 SPEC_TESTS_S=90 bash benchmarks/device_run.sh gputestsx > "$OUT/gputestsx_step.log" 2>&1
say "gpu tests: rc $?"
for v in this main; do
  LEFT=$(( 560 - ($(date +%s) - T0) ))
  [ $LEFT -lt 30 ] && break
  pp=$PWD; [ $v = main ] && pp=$PWD/.variants/main
  PYTHONPATH=$pp PROBE_NAME=probe_$v timeout $LEFT python3 benchmarks/tools/host_probe.py > "$OUT/probe_$v.log" 2>&1
  say "probe $v: rc $?"
done
mkdir -p "$OUT/s15c1"; mv "$OUT"/*.log "$OUT"/*.json "$OUT/s15c1/" 2>/dev/null; tar -czf "$OUT/s15_call1.tgz" -C "$OUT" s15c1
echo "== gpu tests"; cat "$OUT/s15c1/gputestsx_step.log" | tail -30
for v in this main; do echo "== probe $v"; grep -E "^(chain_trivial|chain_ours|nograd|ws_pair|eager|gpu_|frac|ratio)" "$OUT/s15c1/probe_$v.log"; done
