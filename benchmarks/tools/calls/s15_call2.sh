#!/usr/bin/env bash
# Session 15's second device call (one H200), branch v17-group-ticket. (1) ticket_diag.py at C = 4096 (the failed
# test's shape, every backward configuration, two rounds) for this tree (the group sum not inlined) and for
# .variants/v17inline (the same code with the group sum inlined), side by side in two processes; (2) the host probe
# with its eager rows, this tree and main (.variants/main = git archive of main 332148b), alternating twice, nothing
# else running (call 1's probes ran beside orphaned pytest workers). Carry .variants.
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
CD_CS=4096 CD_NAME=diag_noinline PYTHONPATH=$PWD timeout 200 python3 benchmarks/tools/ticket_diag.py > "$OUT/diag_noinline.log" 2>&1 &
CD_CS=4096 CD_NAME=diag_inline PYTHONPATH=$PWD/.variants/v17inline timeout 200 python3 benchmarks/tools/ticket_diag.py > "$OUT/diag_inline.log" 2>&1 &
wait
say "diag done"
for r in 1 2; do
  for v in this main; do
    LEFT=$(( 560 - ($(date +%s) - T0) ))
    [ $LEFT -lt 30 ] && break
    pp=$PWD; [ $v = main ] && pp=$PWD/.variants/main
    PYTHONPATH=$pp PROBE_NAME=probe_${v}_$r timeout $LEFT python3 benchmarks/tools/host_probe.py > "$OUT/probe_${v}_$r.log" 2>&1
    say "probe $v $r: rc $?"
  done
done
mkdir -p "$OUT/s15c2"; mv "$OUT"/*.log "$OUT"/*.json "$OUT"/*.txt "$OUT/s15c2/" 2>/dev/null; tar -czf "$OUT/s15_call2.tgz" -C "$OUT" s15c2
for v in noinline inline; do echo "== diag $v"; cut -c1-400 "$OUT/s15c2/diag_$v.log" | tail -18; done
echo "== probes"
for r in 1 2; do for v in this main; do
  printf "%-5s %s " $v $r; grep -E "^(chain_trivial|chain_ours|nograd_fwd_us|ws_pair_us|eager_128_us|gpu_128_us|eager_512_us|gpu_512_us|ratio_chain) " "$OUT/s15c2/probe_${v}_$r.log" | awk '{printf "%s=%s ", $1, $2}'; echo
done; done
