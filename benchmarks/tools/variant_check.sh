#!/usr/bin/env bash
# A kernel variant against this tree in one device call (one H200, carry nothing), the steps of session 19's
# s19_call1.sh:
#   1. (background) bits_digest.py of the variant in 3 shards, compared case by case with reference digests;
#   2. device_run.sh mixab: the variant (.variants/NAME, this tree's cakeconv/ with PATCH applied) against this tree;
#   3. PATCH applied to the device's copy of the tree, then the GPU tests of the short-document path and KCP on one
#      NCCL rank, 6 workers, until 570 s after the start.
# Usage: bash benchmarks/tools/variant_check.sh NAME PATCH REF_TGZ REF_MEMBER...
#   REF_TGZ / REF_MEMBER: the digest lines of this tree's kernels (a results .tgz and the files in it).
# MIXES (default seed,uniform:1-8,uniform:1-1024) and MIX_ROWS (default C = 128, 512, 2048 at S = 250,340) go to mixab.
# VARIANT_TESTS=0: steps 1 and 2 only (the tree stays unpatched; the call goes on with other steps).
set -u
NAME=$1; PATCH=$2; REF_TGZ=$3; shift 3
export PYTHONUNBUFFERED=1
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
rm -rf .variants && mkdir -p ".variants/$NAME" && cp -r cakeconv ".variants/$NAME/" \
  && (cd ".variants/$NAME" && patch -p1 -s < "../../$PATCH") || { echo "patch failed"; exit 1; }
mkdir -p "$OUT/bits"
tar -xzf "$REF_TGZ" -O "$@" > "$OUT/bits/reference.lines"
for k in 0 1 2; do
  PYTHONPATH=$PWD/.variants/$NAME timeout 200 python3 benchmarks/tools/bits_digest.py --shard $k/3 \
    > "$OUT/bits/${NAME}_$k.log" 2>&1 &
done
MIXES=${MIXES:-seed,uniform:1-8,uniform:1-1024} MIX_ROWS=${MIX_ROWS:-250340x128,250340x512,250340x2048} \
  MIX_PASSES=fwd,fwdbwd MIX_REPS=11 timeout 200 bash benchmarks/device_run.sh mixab > "$OUT/mixab.txt" 2>&1
say "mixab: rc $?"
wait
head -qn1 "$OUT"/bits/"${NAME}"_*.log
python3 benchmarks/tools/bits_digest.py --compare "$OUT/bits/reference.lines" "$OUT"/bits/"${NAME}"_*.log --name "$NAME"
tar -czf "$OUT/bits.tgz" -C "$OUT" bits && rm -rf "$OUT/bits"
[ "${VARIANT_TESTS:-1}" = 0 ] && { rm -f "$OUT/env.txt"; sed -n '/^== /,$p' "$OUT/mixab.txt" | grep -v "^ *$" | tail -40; exit 0; }
patch -p1 -s < "$PATCH" && say "tree patched to $NAME"
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
