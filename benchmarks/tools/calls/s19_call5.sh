#!/usr/bin/env bash
# Session 19's fifth device call (one H200, warm), as run: main (v18c's backward) on the two target mixes s19_call1.sh
# left out (every document of length 1, uniform 1-64) at C = 512 and 2048, no bias, fwd and fwd+bwd.
export PYTHONPATH=$PWD; timeout 160 python3 benchmarks/bench_cake_causal_conv1d_det.py --providers ours --doc-mix ones,uniform:1-64 --rows 250340x512,250340x2048 --bias no --passes fwd,fwdbwd --reps 11 --no-plot --out $OUT/mix2 > $OUT/mix2.log 2>&1; echo rc $?; sed -n '/^== document mixes/,/^$/p' $OUT/mix2.log
