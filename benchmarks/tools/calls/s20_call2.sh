#!/usr/bin/env bash
# Session 20, call 2 (one H200, carry .variants). Issue 17, three code versions:
#   .variants/main = main at the start of the call (v19; git archive of the commit before v20)
#   this tree      = v20: no dbias adds without a bias; C <= 128 takes 128-row programs (forward R=4 SUB=32, backward
#                    R=2 with 2 warps); two or more groups: the group kernel's last program per column block (by
#                    ticket) adds the group sums (no finalize launch), and the group kernel is a programmatic
#                    dependent launch of the main kernel
#   .variants/v20b = v20, and the forward and backward main kernels programmatic dependent launches too
# Step 1 (background, beside the compiles of step 2): v20's and v20b's digests in 3 shards each, compared with main's
#   (results/h200_2026-12-02_s20_bits_digest_v19.tgz); the rest of the small-C sweep compiled (C = 256, and C = 128's
#   backward with 128 registers, which call 1 did not reach).
# Step 2: mixab, two alternating rounds: seed / uniform 1-8 / uniform 1-1,024 / one-token at C = 128, 256, 512, 2048,
#   no bias, fwd, bwd and fwd+bwd.
#   Predictions. v20 against main: C = 128 seed fwd 0.78 -> 0.85 (the sweep's +10%), fwd+bwd 0.67 -> 0.76; backward
#   -3 to -5 us at every C (no finalize launch, no gap before the group kernel), short documents' backward -3% more (one
#   add of 38.6 instructions per element, sm_90 SASS); C = 256 seed fwd+bwd 0.77 -> 0.79. v20b against v20: fwd+bwd
#   -2 us (the backward launches while the forward's last programs run), fwd alone unchanged.
# Step 3: the sweep timed (C = 256 every candidate, C = 128 the new ones).
# Step 4: v20b copied over the tree, then its GPU tests (the paths v20 and v20b change first) until 575 s.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
BENCH=benchmarks/bench_cake_causal_conv1d_det.py
export MIXES=seed,uniform:1-8,uniform:1-1024,ones MIX_ROWS=250340x128,250340x256,250340x512,250340x2048
export MIX_PASSES=fwd,bwd,fwdbwd MIX_REPS=11
mkdir -p "$OUT/bits" "$OUT/sweep" /tmp/warm
tar -xzf benchmarks/results/h200_2026-12-02_s20_bits_digest_v19.tgz -O bits/v19_0.log bits/v19_1.log bits/v19_2.log \
  > "$OUT/bits/reference.lines"
for k in 0 1 2; do
  timeout 300 python3 benchmarks/tools/bits_digest.py --shard $k/3 > "$OUT/bits/v20_$k.log" 2>&1 &
  PYTHONPATH=$PWD/.variants/v20b timeout 300 python3 benchmarks/tools/bits_digest.py --shard $k/3 \
    > "$OUT/bits/v20b_$k.log" 2>&1 &
done
EXTRA="fwd:R=8,SUB=16,BC=128,num_warps=4,stages=4,maxnreg=128;bwd:R=2,BC=128,num_warps=2,stages=4,maxnreg=128;bwd:R=2,BC=128,num_warps=2,stages=3,maxnreg=128"
for k in 0 1 2 3; do
  timeout 300 python3 benchmarks/tools/sweep_configs.py --C 256 --passes bwd --doc-mix seed --bias no --reps 1 \
    --extra "$EXTRA" --shard $k/4 > /tmp/warm/sweep_bwd_$k.log 2>&1 &
done
for k in 0 1; do
  timeout 300 python3 benchmarks/tools/sweep_configs.py --C 256 --passes fwd --doc-mix seed --bias no --reps 1 \
    --extra "$EXTRA" --shard $k/2 > /tmp/warm/sweep_fwd_$k.log 2>&1 &
done
timeout 300 python3 benchmarks/tools/sweep_configs.py --C 128 --passes bwd --doc-mix seed --bias no --reps 1 \
  --extra "$EXTRA" --shard 8/1 > /tmp/warm/sweep_bwd128.log 2>&1 &
for v in main v20b this; do  # mixab's own warm-up, here, so that its timed rounds start with nothing else running
  if [ "$v" = this ]; then pp=$PWD; else pp=$PWD/.variants/$v; fi
  for r in ${MIX_ROWS//,/ }; do
    PYTHONPATH=$pp timeout 300 python3 $BENCH --providers ours --rows "$r" --doc-mix "$MIXES" --bias no --passes fwd,bwd \
      --reps 1 --warmup 1 --no-check --no-plot --max-sets 2 --copy-bytes 67108864 --out "/tmp/warm/${v}_$r" \
      > "/tmp/warm/${v}_$r.log" 2>&1 &
  done
done
wait
say "digests and warm-ups done"
for v in v20 v20b; do  # (it ran at 20272ec with this comparison inline, the same code as bits_digest.compare)
  python3 benchmarks/tools/bits_digest.py --compare "$OUT/bits/reference.lines" "$OUT"/bits/${v}_*.log --name $v
done
tar -czf "$OUT/bits.tgz" -C "$OUT" bits && rm -rf "$OUT/bits"
timeout 200 bash benchmarks/device_run.sh mixab > "$OUT/mixab.txt" 2>&1
say "mixab: rc $?"
timeout 90 python3 benchmarks/tools/sweep_configs.py --C 256 --doc-mix seed --bias no --reps 15 --extra "$EXTRA" \
  --out "$OUT/sweep" > "$OUT/sweep/sweep.log" 2>&1
say "sweep C = 256: rc $?"
timeout 40 python3 benchmarks/tools/sweep_configs.py --C 128 --passes bwd --doc-mix seed --bias no --reps 15 \
  --extra "$EXTRA" --shard 8/1 > "$OUT/sweep/sweep_bwd128.log" 2>&1
say "sweep C = 128 new backward configurations: rc $?"
tar -czf "$OUT/sweep.tgz" -C "$OUT" sweep && rm -rf "$OUT/sweep"
rm -rf cakeconv && cp -r .variants/v20b/cakeconv . && say "tree is v20b"
left=$(( 575 - ($(date +%s) - T0) ))
say "GPU tests, ${left} s"
timeout $left python3 -m pytest -v -rf -m gpu -p no:cacheprovider -n 6 --dist load --durations=10 \
  tests/test_gpu.py -k "dweight_tree or matches_reference or one_group or workspace or autograd or uniform_batch or every_config" \
  tests/test_cuda_graphs.py tests/test_compile.py tests/kcp/test_kcp_nccl_one_rank.py > "$OUT/pytest_gpu.log" 2>&1
say "GPU tests: rc $?"
pkill -f pytest 2>/dev/null
rm -f "$OUT/env.txt"
grep -E "FAILED|ERROR| passed| failed" "$OUT/pytest_gpu.log" | tail -12
echo "not finished: $(grep -c "PASSED\|FAILED\|SKIPPED" "$OUT/pytest_gpu.log") done"
tar -xzOf "$OUT/bits.tgz" bits/v20_0.log | head -2
sed -n '/^== /,$p' "$OUT/mixab.txt" | grep -v "^ *$" | grep -E "^==|seed|1-8|ones" | head -80
tail -3 "$OUT/mixab.txt"
