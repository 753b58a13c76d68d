#!/usr/bin/env bash
# One call on the GPU machine: environment, GPU tests, benchmarks, kernel tools. Steps run in the order given:
#   bash benchmarks/device_run.sh STEP [STEP ...]
# Benchmarks (SPEC section 7; each writes ONE file, $OUT/<step>.tgz, and prints its short table last):
#   daobuild   start the build of Dao's causal-conv1d (peer) in the background, detached (benchmarks/tools/build_dao.sh:
#              sdist from .fla/ -- carry .fla --, sm_90 only, bf16/fp32 kernels only; ~1-2 min; a prebuilt
#              .fla/dao_prebuilt_sm90.tgz takes seconds). The steps below that use Dao wait for it (DAO_TIMEOUT, 600 s)
#   waitdao    wait for that build now; on success put it on PYTHONPATH, on failure copy its log to $OUT/daobuild.log
#   warmbg     in the background: compile ours' kernels for hostcost and mixes (parallel processes; Triton's disk cache
#              is shared), then FLA's autotuning of the same C alone on the GPU (cached on disk)
#   hostcost   issue 16, one GPU: host cost per call at S=4096 C=256 (ours, FLA, Dao, trivial Function, silu; chain of
#              16, one call per step, no_grad forward, workspace entry points) + GPU time and eager loop (16-call chain
#              and one call per step) at the seed mix, S=250340, C=128 and 512 (HOST_ROWS)        -> hostcost.tgz
#   mixes      issue 17, one GPU: GPU time of fwd and fwd+bwd (MIX_PASSES) for ours, ours_search (v12's A/B: the
#              segment indices off), FLA and Dao (MIX_PROVIDERS), document mixes
#              seed, uniform 1-8 / 1-64 / 1-1024, all length 1 (MIXES) x S=250340, C=128,256,512,2048 (MIX_ROWS) -> mixes.tgz
#   fla        issue 18: flatests then flaexample: the FLA drop-in's GPU tests, examples/train_fla_model.py (carry
#              .fla; each needs a call of its own: FLA autotunes every kernel on first use)      -> fla/*.log
#   mixab      issue 17 A/B: ours of each .variants/<name> (git archives, carry .variants) and of this tree on the
#              document mixes, two alternating rounds                                           -> mixab.tgz
#   multigpu   the multi-GPU test tier, tests/multigpu/run.sh NGPU                                  -> multigpu.log
#   e.g. issue 18, a call each:  bash benchmarks/device_run.sh flatests;  bash benchmarks/device_run.sh flaexample  (carry .fla)
#   kcpbench   torchrun on NGPU (2) GPUs: the KCP benchmark, every layout, the seed workload (S_local = 65536/NGPU) and
#              --tokens 65536*NGPU (S_local = 65536): GPU time, eager loop, host cost, bitwise    -> kcpbench.tgz
#   e.g. one H200:   bash benchmarks/device_run.sh daobuild warmbg hostcost mixes            (carry .fla)
#        two H200s:  bash benchmarks/device_run.sh daobuild warmbg hostcost mixes kcpbench   (carry .fla)
# Older steps: [tests|gputests|gputestsx|gputestsfast|gpumodule|gpuconfigs|gpunew] [ab] [oddc] [onedoc] [kerneltimes]
#   [sweep|sweepbwd|sweepsmall] [ncu] [bitsbg] [benchwarm] [waitbg] [bench|benchsplit|benchpeers|benchours|benchquick]
#   abbench (= abwarmbg waitbg abtimed): AB_ROWS (SxC list) through the benchmark for each .variants/<name> and this tree
# Writes under $OUT (set by the device tool; defaults to ./device_out). The device returns at most 8 files (2 folders
# deep): the benchmark steps pack their folder into one .tgz each.
set -u
OUT=${OUT:-./device_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1
AB_ROWS=${AB_ROWS:-250340x128,250340x512,250340x1024,250340x1160,250340x2048}  # abwarmbg / abtimed shapes (SxC list)
DAO_DIR=${DAO_DIR:-/tmp/dao}
DAO_SRC=$DAO_DIR/causal_conv1d-1.7.0
HOST_ROWS=${HOST_ROWS:-250340x128,250340x512}
MIXES=${MIXES:-seed,uniform:1-8,uniform:1-64,uniform:1-1024,ones}
MIX_ROWS=${MIX_ROWS:-250340x128,250340x256,250340x512,250340x2048}
MIX_PASSES=${MIX_PASSES:-fwd,fwdbwd}
MIX_REPS=${MIX_REPS:-15}
NGPU=${NGPU:-2}
BENCH=benchmarks/bench_cake_causal_conv1d_det.py
BENCH_ARGS=${BENCH_ARGS:-}  # appended to the benchmark steps' command lines (e.g. --dry-run to try the steps on a CPU)
KCP_ARGS=${KCP_ARGS:-}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if ls .fla/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/fla .fla/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/fla
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/env.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/env.txt"

use_dao() {  # Dao's build on PYTHONPATH once it is there
  if [ -f "$DAO_SRC/DONE" ] && [[ ":$PYTHONPATH:" != *":$DAO_SRC:"* ]]; then export PYTHONPATH=$PYTHONPATH:$DAO_SRC; fi
}
DAO_WAITED=0
wait_dao() {  # wait for a build started by daobuild (none started, or waited for already: return at once)
  [ -f "$DAO_DIR/build.log" ] && [ "$DAO_WAITED" = 0 ] || { use_dao; return 0; }
  DAO_WAITED=1
  local t=0 limit=${DAO_TIMEOUT:-600}
  while [ ! -f "$DAO_SRC/DONE" ] && [ ! -f "$DAO_SRC/FAILED" ] && [ "$t" -lt "$limit" ]; do sleep 5; t=$((t + 5)); done
  if [ -f "$DAO_SRC/DONE" ]; then
    echo "dao: ready ($(grep -E '^(built|prebuilt ok)' "$DAO_DIR/build.log" | tail -1); waited ${t} s)"
  else
    echo "dao: NOT ready after ${t} s ($( [ -f "$DAO_SRC/FAILED" ] && echo failed || echo timeout)); its rows are skipped; log in \$OUT/daobuild.log"
    tail -5 "$DAO_DIR/build.log"; cp "$DAO_DIR/build.log" "$OUT/daobuild.log"
  fi
  use_dao
}
quiet() {  # host-cost and GPU-time steps start with no background work of this script left (warm-ups, Dao's build)
  wait; wait_dao
}
pack() {  # $OUT/$1/ -> $OUT/$1.tgz (one file comes back instead of many)
  [ -d "$OUT/$1" ] && tar -czf "$OUT/$1.tgz" -C "$OUT" "$1" && rm -rf "${OUT:?}/$1"
}
use_dao

for step in "$@"; do
  case "$step" in
    daobuild) # Dao's causal-conv1d, detached (setsid) so that it also outlives this call on a warm machine
         if [ -f "$DAO_SRC/DONE" ]; then echo "dao: already built in $DAO_SRC"; use_dao
         else
           DAO_WAITED=0
           mkdir -p "$DAO_DIR"; rm -f "$DAO_SRC/FAILED" "$DAO_DIR/FAILED"; : > "$DAO_DIR/build.log"
           if command -v setsid >/dev/null; then OUT=$OUT setsid -f bash benchmarks/tools/build_dao.sh </dev/null >/dev/null 2>&1
           else (OUT=$OUT nohup bash benchmarks/tools/build_dao.sh </dev/null >/dev/null 2>&1 &) fi
           echo "dao: build started in the background ($DAO_DIR/build.log)"
         fi ;;
    waitdao) wait_dao ;;
    warmbg) # in the background (a later quiet/waitbg waits): ours' kernels of hostcost and mixes compiled in parallel
         # processes (Triton's disk cache is shared), then FLA's autotuning of the same C alone on the GPU (its results
         # are cached on disk, keyed by C; alone, so that no other process disturbs the configurations it times)
         mkdir -p /tmp/warm
         rows=$(echo ${HOST_ROWS//,/ } ${MIX_ROWS//,/ } | tr ' ' '\n' | sort -u | tr '\n' ' ')
         (
           for r in $rows; do
             python3 $BENCH --providers ours,ours_search --rows "$r" --doc-mix "$MIXES" --bias no --passes fwd,bwd,fwdbwd --reps 1 \
               --warmup 1 --no-check --no-plot --max-sets 2 --copy-bytes 67108864 $BENCH_ARGS --out "/tmp/warm/$r" \
               > "/tmp/warm/$r.log" 2>&1 &
           done
           python3 $BENCH --providers ours --passes none --host-cost --host-steps 1 --host-warmup 1 --no-plot \
             --copy-bytes 67108864 $BENCH_ARGS --out /tmp/warm/host > /tmp/warm/host.log 2>&1 &
           wait
           python3 $BENCH --providers fla --rows "${rows// /,}" --doc-mix seed --bias no --passes fwd,fwdbwd --reps 1 \
             --warmup 1 --no-check --no-plot --max-sets 2 --copy-bytes 67108864 \
             --host-cost --host-steps 1 --host-warmup 1 $BENCH_ARGS --out /tmp/warm/fla > /tmp/warm/fla.log 2>&1
           echo "warm-up done: $(grep -l 'time taken' /tmp/warm/*/bench_cake_causal_conv1d_det_table.txt 2>/dev/null | wc -l) runs"
         ) &
         echo "warm-up started in the background" ;;
    hostcost) quiet; mkdir -p "$OUT/hostcost"
         python3 $BENCH --providers ours,fla,dao --doc-mix seed --rows "$HOST_ROWS" --bias no --passes fwdbwd --eager \
           --host-cost $BENCH_ARGS --out "$OUT/hostcost" 2>"$OUT/hostcost/progress.log" > "$OUT/hostcost/bench.log"
         r=$?; echo "hostcost: exit $r"; [ $r -ne 0 ] && tail -5 "$OUT/hostcost/progress.log"
         grep "^# note\|^# check" "$OUT/hostcost/bench.log" | head -8; pack hostcost
         tar -xzOf "$OUT/hostcost.tgz" hostcost/bench_cake_causal_conv1d_det_table.txt 2>/dev/null \
           | sed -n '/^== GPU time/,/^# note/p' | grep -v "^# note" ;;
    mixes) quiet; mkdir -p "$OUT/mixes"
         python3 $BENCH --providers ${MIX_PROVIDERS:-ours,ours_search,fla,dao} --doc-mix "$MIXES" --rows "$MIX_ROWS" \
           --bias no --passes "$MIX_PASSES" \
           --reps "$MIX_REPS" $BENCH_ARGS --out "$OUT/mixes" 2>"$OUT/mixes/progress.log" > "$OUT/mixes/bench.log"
         r=$?; echo "mixes: exit $r"; [ $r -ne 0 ] && tail -5 "$OUT/mixes/progress.log"
         grep "^# note\|^# check" "$OUT/mixes/bench.log" | head -8; pack mixes
         tar -xzOf "$OUT/mixes.tgz" mixes/bench_cake_causal_conv1d_det_table.txt 2>/dev/null \
           | sed -n '/^== document mixes/,/^# note/p' | grep -v "^# note" ;;
    mixab) # issue 17 A/B: the document mixes (MIXES x MIX_ROWS, MIX_PASSES) for ours of each code version in
         # .variants/<name> (git archives; carry .variants) and of this tree: every version's kernels compiled
         # first (parallel processes), then two alternating timed rounds; one table per version and round
         mkdir -p "$OUT/mixab"
         for v in $(ls .variants 2>/dev/null) this; do
           if [ "$v" = this ]; then pp=$PWD; else pp=$PWD/.variants/$v; fi
           for r in ${MIX_ROWS//,/ }; do
             PYTHONPATH=$pp:$PYTHONPATH python3 $BENCH --providers ours --rows "$r" --doc-mix "$MIXES" --bias no \
               --passes fwd,bwd --reps 1 --warmup 1 --no-check --no-plot --max-sets 2 --copy-bytes 67108864 $BENCH_ARGS \
               --out "/tmp/mixabwarm/${v}_$r" > /dev/null 2>&1 &
           done
         done
         wait
         for round in 1 2; do
           for v in $(ls .variants 2>/dev/null) this; do
             if [ "$v" = this ]; then pp=$PWD; else pp=$PWD/.variants/$v; fi
             d="$OUT/mixab/${v}_$round"; mkdir -p "$d"
             PYTHONPATH=$pp:$PYTHONPATH python3 $BENCH --providers ours --doc-mix "$MIXES" --rows "$MIX_ROWS" --bias no \
               --passes "$MIX_PASSES" --reps "$MIX_REPS" --no-plot $BENCH_ARGS --out "$d" 2>"$d/progress.log" > "$d/bench.log"
             echo "== $v round $round (exit $?)"
             sed -n '/^== document mixes/,/^$/p' "$d/bench.log" | tail -n +3
           done
         done
         pack mixab ;;
    kcpbench) quiet; mkdir -p "$OUT/kcpbench"
         for run in seed "tokens$((65536 * NGPU))"; do
           extra=""; [ "$run" != seed ] && extra="--tokens $((65536 * NGPU))"
           timeout ${KCP_TIMEOUT:-300} python3 -m torch.distributed.run --standalone --nproc-per-node "$NGPU" \
             benchmarks/bench_cake_causal_conv1d_det_kcp.py $extra $KCP_ARGS --out "$OUT/kcpbench/$run" > "$OUT/kcpbench/$run.log" 2>&1
           r=$?; echo "kcpbench $run: exit $r"; [ $r -ne 0 ] && grep -v "^\[kcp bench\]\|^W[0-9]" "$OUT/kcpbench/$run.log" | tail -15
         done
         pack kcpbench
         for run in seed "tokens$((65536 * NGPU))"; do
           tar -xzOf "$OUT/kcpbench.tgz" "kcpbench/$run/bench_cake_causal_conv1d_det_kcp_p${NGPU}_table.txt" 2>/dev/null \
             | grep -v "^# local\|^# time\|^$"
         done ;;
    tests) python3 -m pytest -q tests -p no:cacheprovider 2>&1 | tee "$OUT/pytest.log" | tail -25 ;;
    gputests) python3 -m pytest -q -m gpu tests -p no:cacheprovider 2>&1 | tee "$OUT/pytest_gpu.log" | tail -25 ;;
    gpumodule) python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider 2>&1 | tee "$OUT/pytest_gpu_module.log" | tail -8 ;;
    gpuconfigs) python3 -m pytest -q -m gpu tests/test_gpu.py -k every_config -p no:cacheprovider 2>&1 | tee "$OUT/pytest_gpu_configs.log" | tail -8 ;;
    gpunew) python3 -m pytest -q tests/test_cuda_graphs.py tests/kcp/test_kcp_nccl_one_rank.py -p no:cacheprovider 2>&1 | tee "$OUT/pytest_gpu_new.log" | tail -15 ;;
    gputestsx) # every GPU test in one call, alone (beside other jobs it ran 2-3x slower), in two steps (session 14:
         # the specialization file compiles cold for minutes when its cases run serially in one worker):
         # (1) every test but the specialization file's coverage check, XDIST (6; 8 may run the GPU out of memory)
         # workers spread over the GPUs (tests/conftest.py) with --dist load, so the specialization cases compile in
         # parallel into the shared Triton cache; (2) the specialization file alone and serially (its coverage check
         # reads what its other tests recorded in the same process; the kernels are cached by then). A line per
         # test so a run cut by the call's limit still names its failures (-v, -rf). GPU_TESTS (default: tests)
         # narrows step 1, e.g. "tests/test_gpu.py"
         CAKECONV_TEST_GPUS=$(nvidia-smi -L | wc -l) timeout ${GPU_TESTS_S:-400} python3 -m pytest -v -rf -m gpu \
           ${GPU_TESTS:-tests} -p no:cacheprovider -n ${XDIST:-6} --dist load -k "not every_integer_argument" \
           --ignore=tests/multigpu --ignore=tests/test_integrations_fla.py --durations=15 > "$OUT/pytest_gpu.log" 2>&1
         echo "step 1: rc $?"; grep -E "FAILED|ERROR|passed|failed|^[0-9.]+s (call|setup)" "$OUT/pytest_gpu.log" | tail -40
         CAKECONV_TEST_GPUS=$(nvidia-smi -L | wc -l) timeout ${SPEC_TESTS_S:-120} python3 -m pytest -v -rf -m gpu \
           tests/test_gpu_specialization.py -p no:cacheprovider > "$OUT/pytest_gpu_specialization.log" 2>&1
         echo "step 2: rc $?"; grep -E "FAILED|ERROR|passed|failed" "$OUT/pytest_gpu_specialization.log" | tail -10 ;;
    ab)  # the tuner's picks of each code version in .variants/<name> (git archives; carry .variants), then this tree
         for v in $(ls .variants 2>/dev/null) this; do
           if [ "$v" = this ]; then pp=$PWD; else pp=$PWD/.variants/$v; fi
           mkdir -p "$OUT/ab_$v"; echo "== $v"
           PYTHONPATH=$pp:$PYTHONPATH python3 benchmarks/tools/sweep_configs.py --picks --C 128,512,2048,8192 --reps 20 \
             --out "$OUT/ab_$v" 2>&1 | tee "$OUT/ab_$v/sweep.log" | grep best
         done ;;
    abbench) bash "$0" abwarmbg waitbg abtimed ;;
    abwarmbg) # the benchmark (host-ahead sleep, cold L2) of each code version in .variants/<name> and of this
         # tree, AB_ROWS (SxC list): every version's kernels compiled first in background processes (a later
         # step's `wait`, e.g. benchwarm or waitbg, waits for them); abtimed then runs two alternating rounds
         mkdir -p "$OUT/abwarm"
         for v in $(ls .variants 2>/dev/null) this; do
           if [ "$v" = this ]; then pp=$PWD; else pp=$PWD/.variants/$v; fi
           for r in ${AB_ROWS//,/ }; do
             PYTHONPATH=$pp:$PYTHONPATH python3 $BENCH --providers ours --rows "$r" \
               --passes fwd,bwd --reps 1 --warmup 1 --no-check --no-plot --max-sets 2 --copy-bytes 67108864 \
               --out "$OUT/abwarm/${v}_$r" > "$OUT/abwarm/${v}_$r.log" 2>&1 &
           done
         done ;;
    abtimed)
         for round in 1 2; do
           for v in $(ls .variants 2>/dev/null) this; do
             if [ "$v" = this ]; then pp=$PWD; else pp=$PWD/.variants/$v; fi
             d="$OUT/abbench/${v}_$round"; mkdir -p "$d"
             PYTHONPATH=$pp:$PYTHONPATH python3 $BENCH --providers ours --rows "$AB_ROWS" \
               --passes fwd,bwd --no-check --no-plot --out "$d" 2>"$d/progress.log" > "$d/bench.log"
             echo "== $v round $round"; grep -E "^== |^ *[0-9]+ +[0-9]+ (fwd|bwd)" "$d/bench.log"
           done
         done ;;
    oddc) # row strides that are not a multiple of 128 bytes (C = 1160, 1168) next to 1152 and 1280: the picks
         mkdir -p "$OUT/oddc"
         python3 benchmarks/tools/sweep_configs.py --picks --C 1152,1160,1168,1280 --reps 20 --out "$OUT/oddc" 2>&1 \
           | tee "$OUT/oddc/sweep.log" | grep best
         mkdir -p "$OUT/oddc_all"  # every forward candidate at C = 1160
         python3 benchmarks/tools/sweep_configs.py --passes fwd --C 1160 --reps 20 --out "$OUT/oddc_all" 2>&1 \
           | tee "$OUT/oddc_all/sweep.log" | grep -E "best|C= 1160" ;;
    onedoc) # the picks with one document (no masked programs) vs the usual mix: the cost of the masked path
         mkdir -p "$OUT/onedoc"
         python3 benchmarks/tools/sweep_configs.py --picks --C 512,2048 --reps 20 --mean-doc 100000000 --out "$OUT/onedoc" 2>&1 \
           | tee "$OUT/onedoc/sweep.log" | grep best ;;
    kerneltimes) python3 benchmarks/tools/kernel_times.py --C 128,512,2048 --out "$OUT" 2>&1 | tee "$OUT/kernel_times.log" | tail -8 ;;
    gputestsfast) python3 -m pytest -q -m gpu tests -p no:cacheprovider -k "not every_config" 2>&1 | tee "$OUT/pytest_gpu.log" | tail -25 ;;
    sweep) python3 benchmarks/tools/sweep_configs.py --out "$OUT" 2>&1 | tee "$OUT/sweep.log" | tail -40 ;;
    sweepsmall) # every backward candidate at the small C (waves: C = 128 leaves under two waves of 4-leaf programs)
         mkdir -p "$OUT/sweepsmall"
         python3 benchmarks/tools/sweep_configs.py --passes bwd --C ${SWEEP_C:-128,256} --reps 20 --out "$OUT/sweepsmall" 2>&1 \
           | tee "$OUT/sweepsmall/sweep.log" | grep -E "best|C=" | tail -30 ;;
    sweepbwd) python3 benchmarks/tools/sweep_configs.py --passes bwd --out "$OUT" 2>&1 | tee "$OUT/sweep_bwd.log" | tail -30 ;;
    ncu) # ncu counters of the picks at NCU_C (default 128,512), no bias unless NCU_BIAS=yes; NCU_MIX: a document mix
         NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
         "$NCU" --clock-control none -k 'regex:cake_conv_(fwd|bwd)_kernel' \
           --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
           --section LaunchStats --section WarpStateStats --section SchedulerStats --section InstructionStats \
           python3 benchmarks/tools/ncu_profile.py --C ${NCU_C:-128,512} --bias ${NCU_BIAS:-no} ${NCU_MIX:+--doc-mix $NCU_MIX} > "$OUT/ncu${NCU_MIX:+_${NCU_MIX//[:]/_}}.txt" 2>&1
         grep -E "cake_conv|DRAM Throughput|Memory Throughput|L2 Cache Throughput|Achieved Occupancy|Registers Per|Stall Long|Warp Cycles Per Issued|Theoretical Occ|Duration|Issued Warp|No Eligible|Executed Ipc|forward|backward|documents" "$OUT/ncu${NCU_MIX:+_${NCU_MIX//[:]/_}}.txt" | head -150 ;;
    benchwarm) # compile every kernel the grid needs in 8 processes at once (Triton's disk cache is shared), so
         # the timed run that follows does not spend ~20 s per new (C, bias, S % 16) compiling (session 3 ran out of time)
         mkdir -p "$OUT/warm"; i=0
         for cs in ${WARM_GROUPS:-512 128,8192 256,4096 1024,2560 1160 1280,2048 1344 1536}; do
           python3 $BENCH --providers ours --rows "$cs" --reps 1 --warmup 1 \
             --no-check --no-plot --copy-bytes 67108864 ${WARM_ARGS:-} --out "$OUT/warm/$i" > "$OUT/warm/$i.log" 2>&1 &
           i=$((i + 1))
         done
         wait; echo "warm-up: $(cat "$OUT"/warm/*/bench_cake_causal_conv1d_det.csv 2>/dev/null | grep -c ours) rows compiled and run once" ;;
    bench) python3 $BENCH --out "$OUT" 2>"$OUT/bench_progress.log" | tee "$OUT/bench.log" | tail -60 ;;
    benchsplit) bash "$0" benchours benchpeers ;;  # the whole grid for ours, then the peers on five shapes
    benchours) mkdir -p "$OUT/bench_ours"
         python3 $BENCH --providers ours --out "$OUT/bench_ours" 2>"$OUT/bench_ours/progress.log" | tee "$OUT/bench_ours/bench.log" | tail -60 ;;
    benchpeers) wait_dao; mkdir -p "$OUT/bench_peers"  # ours and the peers, same inputs, same run (FLA autotunes ~20 s per new C)
         python3 $BENCH --providers ours,fla,dao --bias no --rows 250340x128,250340x512,250340x1024,250340x2048,250340x8192 \
           --out "$OUT/bench_peers" 2>"$OUT/bench_peers/progress.log" | tee "$OUT/bench_peers/bench.log" | tail -30 ;;
    bitsbg) # in the background (the next steps compile on the other cores): the GPU tests of the kernels' bits
         (timeout ${BITS_TIMEOUT:-900} python3 -m pytest -q -m gpu tests/test_gpu.py -k "${BITS_K:-dweight_tree or every_config}" -p no:cacheprovider -n ${BITS_N:-4} --tb=short -rf \
           > "$OUT/pytest_gpu_bits.log" 2>&1; echo "bits tests: $(tail -1 "$OUT/pytest_gpu_bits.log")") & ;;
    fla) bash "$0" flatests flaexample ;;
    flatests) # issue 18: the FLA drop-in's GPU tests (carry .fla: the wheels are installed above). FLA 0.6.0 ships no
         # tuned configurations, so its kernels autotune on first use: give this step a call of its own (session 9:
         # 5 tests in 450 s). -v: a line per test as it ends, kept when the call's limit cuts the run
         mkdir -p "$OUT/fla"
         python3 -m pytest -v -m gpu tests/test_integrations_fla.py -p no:cacheprovider -rP --durations=0 2>&1 \
           | tee "$OUT/fla/pytest_gpu_fla.log" | grep -E "PASSED|FAILED|ERROR|passed|failed" ;;
    flaexample) # issue 18: examples/train_fla_model.py, swapped and unswapped (its own call after flatests)
         mkdir -p "$OUT/fla"
         python3 examples/train_fla_model.py --steps 300 --out "$OUT/fla" 2>&1 | tee "$OUT/fla/example.log" | tail -15 ;;
    multigpu) bash tests/multigpu/run.sh "${NGPU:-2}" 2>&1 | tee "$OUT/multigpu.log" | tail -30 ;;
    waitbg) wait ;;
    benchquick) python3 $BENCH --quick --out "$OUT" 2>"$OUT/bench_progress.log" | tee "$OUT/bench.log" | tail -40 ;;
    *) echo "unknown step $step" ;;
  esac
done
