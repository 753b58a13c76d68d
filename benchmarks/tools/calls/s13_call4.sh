#!/usr/bin/env bash
# Session 13's fourth device call (one H200; issue 16, branch v15-one-group-ticket: one launch for a backward of
# one dweight group). First every GPU test of the branch (6 workers), then the host cost A/B: the rungs of
# host_rungs.py --device cuda and the host probe (no eager rows), main (.variants/main: git archive of main's
# cakeconv/; carry .variants) against this tree, alternating.
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
CAKECONV_TEST_GPUS=1 timeout 420 python3 -m pytest -v -rf -m gpu tests -p no:cacheprovider -n 6 --dist loadgroup \
  --ignore=tests/multigpu --ignore=tests/test_integrations_fla.py --durations=10 > "$OUT/pytest_gpu_v15.log" 2>&1
say "gpu tests: rc $?"
for r in 1 2; do
  for v in main this; do
    pp=$PWD; [ $v = main ] && pp=$PWD/.variants/main
    PYTHONPATH=$pp timeout 60 python3 benchmarks/tools/host_rungs.py --device cuda > "$OUT/rungs_${v}_$r.txt" 2>&1
    say "rungs $v $r: rc $?"
  done
done
for v in main this; do
  pp=$PWD; [ $v = main ] && pp=$PWD/.variants/main
  PYTHONPATH=$pp PROBE_EAGER=0 PROBE_NAME=probe_$v timeout 60 python3 benchmarks/tools/host_probe.py > "$OUT/probe_$v.log" 2>&1
  say "probe $v: rc $?"
done
rm -f "$OUT/env.txt"
mkdir -p "$OUT/s13c4"; mv "$OUT"/*.txt "$OUT"/*.log "$OUT"/*.json "$OUT/s13c4/" 2>/dev/null; tar -czf "$OUT/s13_call4.tgz" -C "$OUT" s13c4
echo "== gpu tests"; grep -E "FAILED|ERROR|passed|failed|^E " "$OUT/s13c4/pytest_gpu_v15.log" | tail -12
for f in main_1 this_1 main_2 this_2; do echo "== rungs $f"; grep -v "^# host\|^rung\|^operation\|^# single" "$OUT/s13c4/rungs_$f.txt" | head -16; done
echo "== probes (us per call)"
for v in main this; do
  printf "%-5s " $v; grep -E "^(chain_trivial|chain_ours|chain_trivial2|chain_ours2|nograd_fwd_us|ws_pair_us|ratio_chain) " "$OUT/s13c4/probe_$v.log" | awk '{printf "%s=%s ", $1, $2}'; echo
done
