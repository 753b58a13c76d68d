#!/usr/bin/env bash
# Session 20, call 1 (one H200, carry nothing). Issue 17, in one call:
# Step 0 (background): every forward and backward candidate of tuning.py plus three not yet listed, compiled once at
#   C = 128 and 256 (the small-C sweep's warm-up; Triton's disk cache is shared with step 2).
# Step 1: v19 (benchmarks/variants/v19_prologue.patch) against this tree (main): its digests in 3 shards beside
#   mixab's compiles, compared with main's (s19_call1.sh's v18c digests: main's kernels), then mixab, two alternating
#   rounds, seed / uniform 1-8 / 1-64 / one-token / uniform 1-1,024 at C = 128, 256, 512, 2048, no bias.
#   Prediction (session 19): short documents forward +1-3% at C = 512 (one-token 0.843 -> 0.85-0.86), backward +1-2%;
#   the seed mix within 1%; C = 128 and 256 seed unchanged (their index variant is off: documents too long).
# Step 2: the small-C sweep, seed mix, no bias: 4-5 forward and 11 backward configurations at C = 128 and 256.
#   Prediction: 128-row programs (forward R=4 SUB=32 or R=8 SUB=16; backward R=2 with 2 warps and 128 registers)
#   beat the picks at C = 128 by 4-6% (978 programs of 256 rows make 7.4 per SM, so the SMs holding 8 set the time;
#   1,956 programs of 128 rows make 14.8); at C = 256 (14.8 per SM already) within 2% of the picks.
# Step 3: kernel_times.py, every kernel of the forward and backward calls and the gaps between them, seed and uniform
#   1-8 at C = 128, 256, 512, 2048, no bias. Prediction (session 19): group + finalize + gaps 10-12 us at C = 512;
#   the main backward kernel alone 0.84-0.86 of its floor on the seed mix at C = 512, 0.70-0.72 at C = 128.
# Step 4: ncu of the main kernels at the two misses: uniform 1-8 at C = 512, the seed mix at C = 128.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
EXTRA="fwd:R=8,SUB=16,BC=128,num_warps=4,stages=4,maxnreg=128;bwd:R=2,BC=128,num_warps=2,stages=4,maxnreg=128;bwd:R=2,BC=128,num_warps=2,stages=3,maxnreg=128"
mkdir -p "$OUT/sweep" "$OUT/kt" /tmp/sweepwarm
for C in 128 256; do
  for p in fwd bwd; do
    timeout 300 python3 benchmarks/tools/sweep_configs.py --C $C --passes $p --doc-mix seed --bias no --reps 1 \
      --extra "$EXTRA" > /tmp/sweepwarm/${p}_$C.log 2>&1 &
  done
done
MIXES=seed,uniform:1-8,uniform:1-64,ones,uniform:1-1024 MIX_ROWS=250340x128,250340x256,250340x512,250340x2048 \
  VARIANT_TESTS=0 bash benchmarks/tools/variant_check.sh v19 benchmarks/variants/v19_prologue.patch \
  benchmarks/results/h200_2026-12-02_s19_bits_digest_v18c.tgz bits/v18c_0.log bits/v18c_1.log bits/v18c_2.log \
  > "$OUT/v19_check.txt" 2>&1
say "v19 check: rc $?"
wait
say "sweep warm-up done"
timeout 150 python3 benchmarks/tools/sweep_configs.py --C 128,256 --doc-mix seed --bias no --reps 20 --extra "$EXTRA" \
  --out "$OUT/sweep" > "$OUT/sweep/sweep.log" 2>&1
say "sweep: rc $?"
timeout 150 python3 benchmarks/tools/kernel_times.py --C 128,256,512,2048 --bias no --doc-mix seed,uniform:1-8 \
  --out "$OUT/kt" > "$OUT/kt/kernel_times.log" 2>&1
say "kernel_times: rc $?"
NCU_MIX=uniform:1-8 NCU_C=512 timeout 100 bash benchmarks/device_run.sh ncu > "$OUT/ncu_short.log" 2>&1
say "ncu uniform 1-8, C = 512: rc $?"
NCU_MIX=seed NCU_C=128 timeout 80 bash benchmarks/device_run.sh ncu > "$OUT/ncu_seed128.log" 2>&1
say "ncu seed, C = 128: rc $?"
rm -f "$OUT/env.txt"
NCU_FILES=$(cd "$OUT" && ls ncu_*.txt ncu_*.log 2>/dev/null)
tar -czf "$OUT/s20_call1.tgz" -C "$OUT" sweep kt $NCU_FILES && (cd "$OUT" && rm -rf sweep kt $NCU_FILES)
tar -xzOf "$OUT/s20_call1.tgz" sweep/sweep.log | grep -E "^(fwd|bwd) C="
tar -xzOf "$OUT/s20_call1.tgz" kt/kernel_times.log | grep -E "copy bandwidth|^(fwd|bwd) " | head -30
grep -E "bits:|DIFFER" "$OUT/v19_check.txt"
sed -n '/document mixes/,$p' "$OUT/v19_check.txt" | grep -E "^(==|seed|uniform|ones)" | head -60
