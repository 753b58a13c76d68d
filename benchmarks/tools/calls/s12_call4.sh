#!/usr/bin/env bash
# Session 12's fourth device call (one H200; issue 16, branch v14-reduce-ticket): the group kernel finalizes one
# group itself (two backward launches instead of three for S <= 8192) and the group/finalize kernels find the group
# sums from the workspace base (no slice per call). First the GPU tests of the reduction's bits (the one-group test,
# the documented tree over 74 groups, the CUDA-graph tests, the single-rank specialization cases), then the host
# probe without its eager rows, main (.variants/main, git archive of main's cakeconv/; carry .variants) against
# this tree, alternating.
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
timeout 200 python3 -m pytest -v -rf -m gpu -p no:cacheprovider -n 4 --dist loadgroup \
  tests/test_gpu.py::test_gpu_one_group_dweight_is_the_documented_order \
  tests/test_gpu.py::test_gpu_dweight_tree_is_the_documented_order_every_time \
  tests/test_cuda_graphs.py tests/test_gpu_specialization.py -k "not kcp_case" \
  > "$OUT/pytest_gpu_v14.log" 2>&1; say "gpu tests: rc $?"
for r in 1 2; do
  for v in main v14; do
    pp=$PWD; [ $v = main ] && pp=$PWD/.variants/main
    PYTHONPATH=$pp PROBE_EAGER=0 PROBE_NAME=probe_${v}_$r timeout 45 python3 benchmarks/tools/host_probe.py \
      > "$OUT/probe_${v}_$r.log" 2>&1
    say "probe $v round $r: rc $?"
  done
done
rm -f "$OUT/env.txt"
echo "== gpu tests"; grep -E "FAILED|ERROR|passed|failed|^E " "$OUT/pytest_gpu_v14.log" | tail -12
echo "== probes (us per call; chain = fwd+bwd in the 16-call chain, S=4096 C=256)"
for f in main_1 v14_1 main_2 v14_2; do
  printf "%-7s " $f; grep -E "^(chain_trivial|chain_ours|chain_ours2|nograd_fwd_us|ws_pair_us|ratio_chain) " "$OUT/probe_$f.log" | awk '{printf "%s=%s ", $1, $2}'; echo
done
