#!/usr/bin/env bash
# Session 18's second device call (one H200; carry .variants), the session's last: s18_call1.sh's two steps
# overlapped, then the GPU tests of the changed paths.
#   .variants/main   = git archive of main before v18;   .variants/nopeel = v18 without the peeled last backward step
#   this tree        = v18
# Step 1 (background): bits_digest.py for main and v18, compared line by line. Prediction: identical.
# Step 2 (foreground, beside step 1's compiles; its timed rounds start once every version is compiled):
#   device_run.sh mixab at C = 128, 512, 2048, every document mix, fwd and fwd+bwd. Prediction: as s18_call1.sh.
# Step 3: the GPU tests of the short-document path (segment indices against the search, a document's bits wherever
#   it sits, [B, T, C] and dtypes) and KCP on one NCCL rank (random fragments, the multi form), 6 workers.
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
mkdir -p "$OUT/bits"
PYTHONPATH=$PWD/.variants/main timeout 200 python3 benchmarks/tools/bits_digest.py > "$OUT/bits/main.log" 2>&1 &
PYTHONPATH=$PWD timeout 200 python3 benchmarks/tools/bits_digest.py > "$OUT/bits/v18.log" 2>&1 &
MIX_ROWS=250340x128,250340x512,250340x2048 MIX_PASSES=fwd,fwdbwd timeout 240 bash benchmarks/device_run.sh mixab \
  > "$OUT/mixab.txt" 2>&1
say "mixab: rc $?"
wait
grep -v "^#" "$OUT/bits/main.log" > "$OUT/bits/main.lines"; grep -v "^#" "$OUT/bits/v18.log" > "$OUT/bits/v18.lines"
head -1 "$OUT/bits/main.log"; head -1 "$OUT/bits/v18.log"
if cmp -s "$OUT/bits/main.lines" "$OUT/bits/v18.lines"; then say "bits: IDENTICAL ($(wc -l < "$OUT/bits/v18.lines") lines)"
else say "bits: DIFFER ($(wc -l < "$OUT/bits/main.lines") / $(wc -l < "$OUT/bits/v18.lines") lines)"; diff "$OUT/bits/main.lines" "$OUT/bits/v18.lines" | head -8; fi
tar -czf "$OUT/bits.tgz" -C "$OUT" bits && rm -rf "$OUT/bits"
left=$(( 560 - ($(date +%s) - T0) ))
say "GPU tests, ${left} s"
CAKECONV_TEST_GPUS=1 timeout $left python3 -m pytest -v -rf -m gpu -p no:cacheprovider -n 6 --dist load --durations=8 \
  tests/test_gpu.py -k "segment_indices or where_it_sits or uniform_batch or random_fragments" \
  tests/kcp/test_kcp_nccl_one_rank.py::test_nccl_one_rank_random_fragments_and_multi > "$OUT/pytest_gpu.log" 2>&1
say "GPU tests: rc $?"
pkill -f pytest 2>/dev/null
grep -E "PASSED|FAILED|ERROR|passed|failed" "$OUT/pytest_gpu.log" | tail -16
rm -f "$OUT/env.txt"
sed -n '/^== /,$p' "$OUT/mixab.txt" | grep -v "^ *$" | tail -60
