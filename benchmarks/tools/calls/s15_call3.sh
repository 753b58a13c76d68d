#!/usr/bin/env bash
# Session 15's third device call (one H200): ticket_diag.py (call 2's run failed on the first launch's index: with
# 5+ documents the segment-index build launches first), three processes side by side: this tree (v17, group sum
# not inlined) and .variants/v17inline at S = 100,003, C = 4096 (the failed test's shape); main
# (.variants/main, its one-group kernel) at S = 8192, C = 4096 with every configuration (the pick alone was tested
# there on the GPU). Carry .variants.
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
CD_CS=4096 CD_NAME=diag_noinline PYTHONPATH=$PWD timeout 240 python3 benchmarks/tools/ticket_diag.py > "$OUT/diag_noinline.log" 2>&1 &
CD_CS=4096 CD_NAME=diag_inline PYTHONPATH=$PWD/.variants/v17inline timeout 240 python3 benchmarks/tools/ticket_diag.py > "$OUT/diag_inline.log" 2>&1 &
CD_S=8192 CD_CS=4096 CD_NAME=diag_main_onegroup PYTHONPATH=$PWD/.variants/main timeout 240 python3 benchmarks/tools/ticket_diag.py > "$OUT/diag_main_onegroup.log" 2>&1 &
wait
say "diag done"
mkdir -p "$OUT/s15c3"; mv "$OUT"/*.log "$OUT/s15c3/" 2>/dev/null; rm -f "$OUT"/*.txt; tar -czf "$OUT/s15_call3.tgz" -C "$OUT" s15c3
for v in noinline inline main_onegroup; do echo "== diag $v"; sed -E 's/BwdConfig\(R=([0-9]+), BC=([0-9]+), num_warps=([0-9]), stages=([0-9]), maxnreg=([A-Za-z0-9]+), step_branch=([A-Za-z]+)\)/R\1 BC\2 w\3 s\4 r\5 sb\6/; s/ kernels \[[^]]*\]//' "$OUT/s15c3/diag_$v.log" | cut -c1-330 | tail -17; done
