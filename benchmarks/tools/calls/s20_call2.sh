#!/usr/bin/env bash
# Prepared in session 19, not run yet (no device time left). One H200, carry nothing. The steps of s19_call1.sh
# (benchmarks/tools/variant_check.sh):
#   .variants/v19 = this tree's cakeconv/ with benchmarks/variants/v19_prologue.patch (built here)
#   this tree     = main (v18c)
# v19: with per-token segment indices, a program's prologue finds its segment window from ids[p0 - 3] and
#   ids[p_last (+ 3)] (two independent loads) instead of two K-ary searches over cu (3 dependent rounds each for
#   250,340 documents); sm_90 SASS: both search loops gone from the index kernels, the search kernels unchanged.
# Step 1 (background): v19's digests in 3 shards, compared with main's (s19_call1.sh's v18c digests: main's kernels).
# Step 2: mixab, seed / uniform 1-8 / one-token / uniform 1-1,024 at C = 128, 512, 2048.
#   Prediction: short documents forward +1-3% at C = 512 (one-token 0.843 -> 0.85-0.86), backward +1-2%;
#   the seed mix within 1% (its K-ary search was one round); C = 128 seed unchanged (search kernels, same SASS).
# Step 3: the patch applied to the device's copy, then the GPU tests of the short-document path.
MIXES=seed,uniform:1-8,ones,uniform:1-1024 bash benchmarks/tools/variant_check.sh v19 benchmarks/variants/v19_prologue.patch \
  benchmarks/results/h200_2026-12-02_s19_bits_digest_v18c.tgz bits/v18c_0.log bits/v18c_1.log bits/v18c_2.log
