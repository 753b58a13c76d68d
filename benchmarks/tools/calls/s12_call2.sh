#!/usr/bin/env bash
# Session 12's second device call (one H200): issue 17's mixab, v13 (.variants/v13 = git archive of tag
# v13-segment-ids-s10a, carry .variants) against this tree (main with v13b merged), two alternating rounds.
set -u
export PYTHONUNBUFFERED=1
timeout 540 bash benchmarks/device_run.sh mixab > "$OUT/mixab.txt" 2>&1; echo "mixab: rc $?"
rm -f "$OUT/env.txt"
tail -60 "$OUT/mixab.txt"
