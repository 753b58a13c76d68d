#!/usr/bin/env bash
# Session 14's third device call (one H200; issue 16), main 78cb51f (v15 merged: one backward launch for S <= 8192):
# the hostcost benchmark (ours, FLA, Dao, the trivial Function; GPU time, eager loop, host cost), then the host
# probe (no eager rows) of the main before v15 (.variants/main, git archive of f412365; carry .variants) and of this
# tree, alternating twice.
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
MIX_ROWS=250340x128,250340x512 MIXES=seed bash benchmarks/device_run.sh daobuild warmbg hostcost > "$OUT/hostcost_step.log" 2>&1
say "hostcost: rc $?"
for r in 1 2; do
  for v in main this; do
    pp=$PWD; [ $v = main ] && pp=$PWD/.variants/main
    PYTHONPATH=$pp PROBE_EAGER=0 PROBE_NAME=probe_$v timeout 60 python3 benchmarks/tools/host_probe.py > "$OUT/probe_${v}_$r.log" 2>&1
    say "probe $v $r: rc $?"
  done
done
rm -f "$OUT/env.txt"
mkdir -p "$OUT/s14c3"; mv "$OUT"/*.log "$OUT"/*.json "$OUT/s14c3/" 2>/dev/null; tar -czf "$OUT/s14_call3.tgz" -C "$OUT" s14c3
tail -30 "$OUT/s14c3/hostcost_step.log"
echo "== probes (us per call)"
for r in 1 2; do for v in main this; do
  printf "%-5s %s " $v $r; grep -E "^(chain_trivial|chain_ours|nograd_fwd_us|ws_pair_us|ratio_chain) " "$OUT/s14c3/probe_${v}_$r.log" | awk '{printf "%s=%s ", $1, $2}'; echo
done; done
