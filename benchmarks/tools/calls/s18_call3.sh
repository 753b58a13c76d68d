#!/usr/bin/env bash
# Never run; superseded by s19_call1.sh (session 19), which ran this A/B on a1720fe.
# Session 18's third device call (one H200), not run (288 s of device time were left, too few to start a machine):
# v18c (benchmarks/variants/v18c_backward.patch, applied to a copy of this tree's cakeconv/ in .variants/v18c) against
# this tree (main).
#   v18c = v18 without the peeled last backward step (which cost C = 128 a tenth of its fwd+bwd: s18_call2.sh), and with
#   the first and last row blocks' many-segment backward loop not software-pipelined, so the kernel keeps one loop's
#   shared memory (24,768 bytes; two pipelined many-segment loops took 49,536: that variant, "nopeel", lost 6% on the
#   seed mix at C = 512, probably its register spills meeting a smaller L1).
# Prediction: the seed mix within 1% of main at C = 128, 512, 2048; the short-document gains of s18_call2.sh
#   (uniform 1-8 fwd+bwd 0.65 -> 0.69 at C = 512, 0.71 -> 0.76 at 2048).
set -u
export PYTHONUNBUFFERED=1
rm -rf .variants && mkdir -p .variants/v18c && cp -r cakeconv .variants/v18c/ \
  && (cd .variants/v18c && patch -p1 -s < ../../benchmarks/variants/v18c_backward.patch) || { echo "patch failed"; exit 1; }
MIXES=seed,uniform:1-8,uniform:1-1024 MIX_ROWS=250340x128,250340x512,250340x2048 MIX_PASSES=fwd,fwdbwd MIX_REPS=11 \
  timeout 165 bash benchmarks/device_run.sh mixab > "$OUT/mixab.txt" 2>&1
echo "mixab: rc $?"
rm -f "$OUT/env.txt"
sed -n '/^== /,$p' "$OUT/mixab.txt" | grep -v "^ *$"
