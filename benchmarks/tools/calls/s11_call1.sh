#!/usr/bin/env bash
# Session 11's first device call (2 H200s; issue 16): host cost of the single-rank op before (main 219ff8d, in
# .variants/before: git archive of cakeconv/) and after the per-signature plans (this tree), alternating, each probe
# alone on a quiet host (benchmarks/tools/host_probe.py); then the benchmark's host-cost and eager rows beside Dao's
# and FLA's ops (device_run.sh hostcost), then the KCP benchmark (device_run.sh kcpbench). Carry .variants and .fla.
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
bash benchmarks/device_run.sh daobuild waitdao > "$OUT/daobuild.txt" 2>&1; say "dao: $(tail -1 "$OUT/daobuild.txt")"
for r in 1 2; do
  for v in before after; do
    pp=$PWD; [ $v = before ] && pp=$PWD/.variants/before
    CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$pp PROBE_NAME=probe_${v}_$r timeout 150 python3 benchmarks/tools/host_probe.py \
      > "$OUT/probe_${v}_$r.log" 2>&1
    say "probe $v round $r: rc $?"
  done
done
mkdir -p "$OUT/probes" && mv "$OUT"/probe_* "$OUT/probes/" && tar -czf "$OUT/probes.tgz" -C "$OUT" probes && rm -rf "$OUT/probes"
timeout 240 bash benchmarks/device_run.sh hostcost > "$OUT/hostcost.txt" 2>&1; say "hostcost: rc $?"
KCP_TIMEOUT=110 timeout 240 bash benchmarks/device_run.sh kcpbench > "$OUT/kcpbench.txt" 2>&1; say "kcpbench: rc $?"
echo "== probes (us per call; chain = fwd+bwd in the 16-call chain, S=4096 C=256)"
for f in before_1 after_1 before_2 after_2; do
  printf "%-9s " $f; tar -xzOf "$OUT/probes.tgz" probes/probe_$f.log 2>/dev/null | awk '{printf "%s=%s ", $1, $2}' | cut -c1-400; echo
done
echo "== hostcost"; tail -30 "$OUT/hostcost.txt"
echo "== kcpbench"; tail -25 "$OUT/kcpbench.txt"
