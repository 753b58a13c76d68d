#!/usr/bin/env bash
# Ran on a1720fe (the patch was removed from benchmarks/variants/ when it landed on main in aec1ccd).
# Session 19's first device call (one H200; carry nothing): session 18's s18_call3.sh A/B, then v18c's bits and
# GPU tests in the same call.
#   .variants/v18c = this tree's cakeconv/ with benchmarks/variants/v18c_backward.patch (built here)
#   this tree      = main (v18's forward, session 16's backward)
# Step 1 (background, beside step 2's compiles): bits_digest.py of v18c in 3 shards, compared with main's digests of
#   session 18 (results/h200_2026-12-02_s18_bits_digest_main_v18.tgz: main's forward bits equal v18's, checked there).
# Step 2: device_run.sh mixab, seed / uniform 1-8 / uniform 1-1,024 at C = 128, 512, 2048, fwd and fwd+bwd.
#   Prediction: the seed and 1-1,024 mixes within 1% of main at every C; uniform 1-8 fwd+bwd 0.65 -> 0.69 at C = 512,
#   0.71 -> 0.76 at 2048 (v18's gains).
# Step 3: the patch applied to this tree (the device's copy), then the GPU tests of the short-document path and KCP on
#   one NCCL rank, 6 workers.
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
rm -rf .variants && mkdir -p .variants/v18c && cp -r cakeconv .variants/v18c/ \
  && (cd .variants/v18c && patch -p1 -s < ../../benchmarks/variants/v18c_backward.patch) || { echo "patch failed"; exit 1; }
mkdir -p "$OUT/bits"
tar -xzf benchmarks/results/h200_2026-12-02_s18_bits_digest_main_v18.tgz -O bits/main.lines > "$OUT/bits/main_s18.lines"
for k in 0 1 2; do
  PYTHONPATH=$PWD/.variants/v18c timeout 200 python3 benchmarks/tools/bits_digest.py --shard $k/3 \
    > "$OUT/bits/v18c_$k.log" 2>&1 &
done
MIXES=seed,uniform:1-8,uniform:1-1024 MIX_ROWS=250340x128,250340x512,250340x2048 MIX_PASSES=fwd,fwdbwd MIX_REPS=11 \
  timeout 200 bash benchmarks/device_run.sh mixab > "$OUT/mixab.txt" 2>&1
say "mixab: rc $?"
wait
head -qn1 "$OUT"/bits/v18c_*.log
python3 - "$OUT/bits" <<'PY'
import glob, sys
d = sys.argv[1]
def table(lines):
    return dict(l.rstrip("\n").split(": y ", 1) for l in lines if ": y " in l and not l.startswith("#"))
main = table(open(f"{d}/main_s18.lines"))
v = {}
for f in sorted(glob.glob(f"{d}/v18c_*.log")):
    v.update(table(open(f)))
same = [k for k in v if k in main and v[k] == main[k]]
differ = [k for k in v if k in main and v[k] != main[k]]
print(f"bits: {len(v)} v18c cases, {len(same)} equal to main's, {len(differ)} differ, {len([k for k in v if k not in main])} without a main digest")
for k in differ:
    print("  DIFFER", k, "\n    main", main[k], "\n    v18c", v[k])
PY
tar -czf "$OUT/bits.tgz" -C "$OUT" bits && rm -rf "$OUT/bits"
patch -p1 -s < benchmarks/variants/v18c_backward.patch && say "tree patched to v18c"
left=$(( 570 - ($(date +%s) - T0) ))
say "GPU tests, ${left} s"
CAKECONV_TEST_GPUS=1 timeout $left python3 -m pytest -v -rf -m gpu -p no:cacheprovider -n 6 --dist load --durations=8 \
  tests/test_gpu.py -k "segment_indices or where_it_sits or uniform_batch or random_fragments or every_config" \
  tests/kcp/test_kcp_nccl_one_rank.py::test_nccl_one_rank_random_fragments_and_multi > "$OUT/pytest_gpu.log" 2>&1
say "GPU tests: rc $?"
pkill -f pytest 2>/dev/null
grep -E "PASSED|FAILED|ERROR|passed|failed" "$OUT/pytest_gpu.log" | tail -20
rm -f "$OUT/env.txt"
sed -n '/^== /,$p' "$OUT/mixab.txt" | grep -v "^ *$" | tail -40
