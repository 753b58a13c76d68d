#!/usr/bin/env bash
# Session 20, call 3 (one H200, carry .fla): the final main (v20 without its C = 128 backward pick), as a user meets it.
# Step 1 (background): Dao's causal-conv1d built (trimmed, sm_90); ours' kernels of the grid compiled (4 processes).
# Step 2: the GPU tests of what v20 changed that call 2 did not reach: the 74-group dweight tree, CUDA-graph capture
#   and replay, torch.compile (default and reduce-overhead), KCP on one NCCL rank (graph replay included), then the
#   specialization file serially (every integer argument at 1, 16k and other values, its coverage check included).
# Step 3: the document-mix grid, ours beside Dao 1.7.0 and FLA 0.6.0 in one run (FLA's autotuning falls in the
#   benchmark's warm-up rounds), S = 250,340, C = 128, 256, 512, 2048, no bias, fwd and fwd+bwd.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
BENCH=benchmarks/bench_cake_causal_conv1d_det.py
export MIXES=seed,uniform:1-8,uniform:1-64,uniform:1-1024,ones MIX_ROWS=250340x128,250340x256,250340x512,250340x2048
export MIX_PROVIDERS=ours,fla,dao MIX_REPS=11 DAO_TIMEOUT=90
bash benchmarks/device_run.sh daobuild > "$OUT/steps.log" 2>&1
mkdir -p /tmp/warm
for r in ${MIX_ROWS//,/ }; do
  timeout 240 python3 $BENCH --providers ours --rows "$r" --doc-mix "$MIXES" --bias no --passes fwd,bwd --reps 1 \
    --warmup 1 --no-check --no-plot --max-sets 2 --copy-bytes 67108864 --out "/tmp/warm/$r" > "/tmp/warm/$r.log" 2>&1 &
done
say "background started"
timeout 150 python3 -m pytest -v -rf -m gpu -p no:cacheprovider -n 6 --dist load --durations=10 \
  tests/test_gpu.py -k "(dweight_tree and (bwd2 or bwd7)) or one_group_dweight" tests/test_cuda_graphs.py tests/test_compile.py \
  tests/kcp/test_kcp_nccl_one_rank.py > "$OUT/pytest_gpu.log" 2>&1
say "GPU tests: rc $?"
pkill -f pytest 2>/dev/null
timeout 60 python3 -m pytest -v -rf -m gpu -p no:cacheprovider tests/test_gpu_specialization.py \
  > "$OUT/pytest_gpu_spec.log" 2>&1
say "specialization file: rc $?"
wait
say "warm-up done"
left=$(( 425 - ($(date +%s) - T0) ))
timeout $left bash benchmarks/device_run.sh mixes >> "$OUT/steps.log" 2>&1
say "mixes: rc $?"
rm -f "$OUT/env.txt"
grep -hE "FAILED|ERROR| passed| failed" "$OUT/pytest_gpu.log" "$OUT/pytest_gpu_spec.log" | tail -12
grep -E "^dao:|exit" "$OUT/steps.log" | head -8
tar -xzOf "$OUT/mixes.tgz" mixes/bench_cake_causal_conv1d_det_table.txt | sed -n '/^== document mixes/,$p' | head -45
