#!/usr/bin/env bash
# Ran on a1720fe, with the steps written out here (`git show a1720fe:benchmarks/tools/calls/s19_call1.sh`); they are now
# benchmarks/tools/variant_check.sh. The patch left benchmarks/variants/ when it landed on main (aec1ccd), so this
# call runs only at a1720fe.
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
bash benchmarks/tools/variant_check.sh v18c benchmarks/variants/v18c_backward.patch \
  benchmarks/results/h200_2026-12-02_s18_bits_digest_main_v18.tgz bits/main.lines
