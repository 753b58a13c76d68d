#!/usr/bin/env bash
# Prepared in session 19, not run yet (no device time left). One H200, carry nothing. Same steps as s19_call1.sh:
#   .variants/v19 = this tree's cakeconv/ with benchmarks/variants/v19_prologue.patch (built here)
#   this tree     = main (v18c)
# v19: with per-token segment indices, a program's prologue finds its segment window from ids[p0 - 3] and
#   ids[p_last (+ 3)] (two independent loads) instead of two K-ary searches over cu (3 dependent rounds each for
#   250,340 documents); sm_90 SASS: both search loops gone from the index kernels, the search kernels unchanged.
# Step 1 (background): v19's digests in 3 shards, compared with main's (s19_call1.sh's v18c digests = main's kernels).
# Step 2: mixab, seed / uniform 1-8 / one-token / uniform 1-1,024 at C = 128, 512, 2048.
#   Prediction: short documents forward +1-3% at C = 512 (one-token 0.843 -> 0.85-0.86), backward +1-2%;
#   the seed mix within 1% (its K-ary search was one round); C = 128 seed unchanged (search kernels, same SASS).
# Step 3: the patch applied to the device's copy, then the GPU tests of the short-document path.
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
rm -rf .variants && mkdir -p .variants/v19 && cp -r cakeconv .variants/v19/ \
  && (cd .variants/v19 && patch -p1 -s < ../../benchmarks/variants/v19_prologue.patch) || { echo "patch failed"; exit 1; }
mkdir -p "$OUT/bits"
tar -xzf benchmarks/results/h200_2026-12-02_s19_bits_digest_v18c.tgz -O bits/v18c_0.log bits/v18c_1.log bits/v18c_2.log > "$OUT/bits/main_s18.lines"
for k in 0 1 2; do
  PYTHONPATH=$PWD/.variants/v19 timeout 200 python3 benchmarks/tools/bits_digest.py --shard $k/3 \
    > "$OUT/bits/v19_$k.log" 2>&1 &
done
MIXES=seed,uniform:1-8,ones,uniform:1-1024 MIX_ROWS=250340x128,250340x512,250340x2048 MIX_PASSES=fwd,fwdbwd MIX_REPS=11 \
  timeout 200 bash benchmarks/device_run.sh mixab > "$OUT/mixab.txt" 2>&1
say "mixab: rc $?"
wait
head -qn1 "$OUT"/bits/v19_*.log
python3 - "$OUT/bits" <<'PY'
import glob, sys
d = sys.argv[1]
def table(lines):
    return dict(l.rstrip("\n").split(": y ", 1) for l in lines if ": y " in l and not l.startswith("#"))
main = table(open(f"{d}/main_s18.lines"))
v = {}
for f in sorted(glob.glob(f"{d}/v19_*.log")):
    v.update(table(open(f)))
same = [k for k in v if k in main and v[k] == main[k]]
differ = [k for k in v if k in main and v[k] != main[k]]
print(f"bits: {len(v)} v19 cases, {len(same)} equal to main's, {len(differ)} differ, {len([k for k in v if k not in main])} without a main digest")
for k in differ:
    print("  DIFFER", k, "\n    main", main[k], "\n    v19", v[k])
PY
tar -czf "$OUT/bits.tgz" -C "$OUT" bits && rm -rf "$OUT/bits"
patch -p1 -s < benchmarks/variants/v19_prologue.patch && say "tree patched to v19"
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
