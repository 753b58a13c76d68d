#!/usr/bin/env bash
# Session 12's third device call (one H200, carry .fla): issue 17 on main with v13b merged. The document-mix grid
# with Dao 1.7.0 and FLA 0.6.0 in the same run (daobuild warmbg mixes), then ncu of the forward and backward
# picks at C = 512 and 2048 for one document, uniform 1-8 and all-ones (the masked loop against the unmasked one).
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
timeout 300 bash benchmarks/device_run.sh daobuild warmbg mixes > "$OUT/mixes.txt" 2>&1; say "mixes: rc $?"
for m in one uniform:1-8 ones; do
  NCU_MIX=$m NCU_C=512,2048 timeout 100 bash benchmarks/device_run.sh ncu > "$OUT/ncu_${m//[:]/_}.log" 2>&1; say "ncu $m: rc $?"
done
mkdir -p "$OUT/ncu"; mv "$OUT"/ncu_*.txt "$OUT/ncu/" 2>/dev/null; tar -czf "$OUT/ncu.tgz" -C "$OUT" ncu && rm -rf "$OUT/ncu"
rm -f "$OUT/env.txt"
tail -30 "$OUT/mixes.txt"
for m in one uniform_1-8 ones; do echo "== ncu $m"; grep -E "cake_conv|DRAM Throughput|Duration|Issued Warp|documents" "$OUT/ncu_$m.log" | head -20; done
