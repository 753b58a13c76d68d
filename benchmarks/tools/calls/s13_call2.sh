#!/usr/bin/env bash
# Session 13's second device call (one H200; issue 16): where the single-rank op's host time goes on the GPU,
# rung by rung (host_rungs.py --device cuda), main (.variants/main: git archive of main's cakeconv/; carry
# .variants) against this tree (Prepared.run calls Triton's C launch function directly), alternating; the host
# probe of each (no eager rows); then the GPU tests that cover the launch path (specialization, CUDA graphs).
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
PYTHONPATH=$PWD timeout 120 python3 benchmarks/tools/host_rungs.py --device cuda --rounds 1 --steps 5 > /dev/null 2>&1
say "warm: rc $?"
for r in 1 2; do
  PYTHONPATH=$PWD/.variants/main timeout 60 python3 benchmarks/tools/host_rungs.py --device cuda --rungs full,floor,trivial \
    > "$OUT/rungs_main_$r.txt" 2>&1; say "rungs main $r: rc $?"
  PYTHONPATH=$PWD timeout 60 python3 benchmarks/tools/host_rungs.py --device cuda > "$OUT/rungs_this_$r.txt" 2>&1
  say "rungs this $r: rc $?"
done
for v in main this; do
  pp=$PWD; [ $v = main ] && pp=$PWD/.variants/main
  PYTHONPATH=$pp PROBE_EAGER=0 PROBE_NAME=probe_$v timeout 60 python3 benchmarks/tools/host_probe.py > "$OUT/probe_$v.log" 2>&1
  say "probe $v: rc $?"
done
PYTHONPATH=$PWD timeout 240 python3 -m pytest -v -rf -m gpu -p no:cacheprovider -n 4 --dist loadgroup \
  tests/test_cuda_graphs.py tests/test_gpu_specialization.py tests/test_gpu.py::test_gpu_workspace_path_allocates_nothing \
  > "$OUT/pytest_gpu_direct.log" 2>&1; say "gpu tests: rc $?"
rm -f "$OUT/env.txt"
mkdir -p "$OUT/s13c2"; mv "$OUT"/*.txt "$OUT"/*.log "$OUT"/*.json "$OUT/s13c2/" 2>/dev/null; tar -czf "$OUT/s13_call2.tgz" -C "$OUT" s13c2
echo "== gpu tests"; grep -E "FAILED|ERROR|passed|failed|^E " "$OUT/s13c2/pytest_gpu_direct.log" | tail -8
for f in main_1 this_1 main_2 this_2; do echo "== rungs $f"; grep -v "^#\|^rung" "$OUT/s13c2/rungs_$f.txt" | head -12; done
echo "== probes (us per call)"
for v in main this; do
  printf "%-5s " $v; grep -E "^(chain_trivial|chain_ours|nograd_fwd_us|ws_pair_us|ratio_chain) " "$OUT/s13c2/probe_$v.log" | awk '{printf "%s=%s ", $1, $2}'; echo
done
