#!/usr/bin/env bash
# Prepared in session 19, not run yet (no device time left): issue 17's next step, "What to try next" (session 19)
# item 1. One H200, carry nothing.
# Step 1: where the backward's time goes that does not grow with C (session 19's fit: F = 25-38 us per backward):
#   every kernel of the forward and backward calls, the launch gaps, and the main kernel against its byte floor, for
#   the seed mix and uniform 1-8 at C = 128, 512, 2048, no bias (tools/kernel_times.py --doc-mix).
#   Prediction: the group + finalize kernels and the gaps 10-12 us at C = 512; the main kernel alone 0.84-0.86 of its
#   floor on the seed mix at C = 512 and 0.70-0.72 at C = 128.
# Step 2: ncu of the main kernels at the two misses: uniform 1-8 at C = 512 and the seed mix at C = 128.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
mkdir -p "$OUT/kt"
timeout 240 python3 benchmarks/tools/kernel_times.py --C 128,512,2048 --bias no --doc-mix seed,uniform:1-8 \
  --out "$OUT/kt" > "$OUT/kt/kernel_times.log" 2>&1
say "kernel_times: rc $?"
NCU_MIX=uniform:1-8 NCU_C=512 timeout 150 bash benchmarks/device_run.sh ncu > "$OUT/ncu_short.log" 2>&1
say "ncu uniform 1-8, C = 512: rc $?"
NCU_MIX=seed NCU_C=128 timeout 150 bash benchmarks/device_run.sh ncu > "$OUT/ncu_seed128.log" 2>&1
say "ncu seed, C = 128: rc $?"
rm -f "$OUT/env.txt"
grep -E "copy bandwidth|^(fwd|bwd) " "$OUT/kt/kernel_times.log"
grep -E "cake_conv|Duration|DRAM Throughput|Issued Warp|No Eligible|Achieved Occupancy" "$OUT"/ncu_*.txt | head -40
