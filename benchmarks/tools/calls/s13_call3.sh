#!/usr/bin/env bash
# Session 13's third device call (one H200; issue 16), this tree (Prepared.run calls Triton's C launch function
# directly): the hostcost benchmark (ours, FLA, Dao, the trivial Function, silu; GPU time, eager loop, host cost),
# then the rungs of host_rungs.py --device cuda twice, with the single operations' host and GPU time.
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
MIX_ROWS=250340x128,250340x512 MIXES=seed bash benchmarks/device_run.sh daobuild warmbg hostcost > "$OUT/hostcost_step.log" 2>&1
say "hostcost: rc $?"
for r in 1 2; do
  timeout 90 python3 benchmarks/tools/host_rungs.py --device cuda > "$OUT/rungs_$r.txt" 2>&1; say "rungs $r: rc $?"
done
rm -f "$OUT/env.txt"
cat "$OUT/hostcost_step.log" | tail -30
for r in 1 2; do echo "== rungs $r"; grep -v "^# host" "$OUT/rungs_$r.txt" | tail -18; done
