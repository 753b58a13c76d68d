#!/usr/bin/env bash
# The steps of a run on the GPU machine: the peers' set-up, the benchmarks, the GPU tests, the kernel tools.
#   bash benchmarks/device_run.sh STEP [STEP ...]          (the steps run in the order given)
# Everything is written under $OUT (default ./device_out), which comes back from the machine: at most 8 files,
# 2 folders deep, so a step that writes many packs them into one file. The result files are named as
# benchmarks/results/ keeps them, <gpu>_<what>.* (GPU_TAG, from nvidia-smi: h200; NGPU ranks: h200x2).
# Carry .fla (FLA's wheels and Dao's source package) for the steps that use a peer.
#
# Peers and warm-up
#   daobuild   start the build of Dao's causal-conv1d (a peer) in the background, detached (tools/build_dao.sh: from
#              .fla/causal_conv1d-1.7.0.tar.gz, sm_90 only, bf16/fp32 kernels only; ~1-2 min; a prebuilt
#              .fla/dao_prebuilt_sm90.tgz takes seconds). The steps that use Dao wait for it (DAO_TIMEOUT, 600 s)
#   waitdao    wait for that build now; on success put it on PYTHONPATH, on failure copy its log to $OUT/daobuild.log
#   warmbg     in the background: compile ours' kernels of summary, hostcost and mixes (parallel processes; Triton's
#              disk cache is shared), then FLA's autotuning of the same C alone on the GPU (cached on disk)
# Benchmarks (each waits for the background work above, then packs its folder into $OUT/<step>.tgz and prints its
# short table last)
#   summary    the README's table, one run: ours, FLA, Dao in both modes (dao, dao_det); seed mix and uniform 1-64;
#              S = 250,340, C = 128, 512, 2048 (SUMMARY_ROWS); GPU time of fwd and fwd+bwd; eager loop at the seed
#              mix, C = 128 and 512; host cost; SUMMARY_REPS (15) timed calls       -> summary.tgz: <gpu>_summary.*
#   mixes      GPU time of fwd and fwd+bwd (MIX_PASSES), ours, FLA and Dao in both modes (MIX_PROVIDERS), document
#              mixes seed, uniform 1-8 / 1-64 / 1-1024, all of length 1 (MIXES) x S = 250,340, C = 128, 256, 512,
#              2048 (MIX_ROWS)                                                        -> mixes.tgz: <gpu>_mixes.*
#   hostcost   host cost per call at S = 4096, C = 256 (ours, FLA, Dao in both modes, the trivial Function, silu) and
#              the GPU time and eager loop of fwd+bwd at the seed mix, S = 250,340, C = 128 and 512 (HOST_ROWS)
#                                                                                     -> hostcost.tgz: <gpu>_hostcost.*
#   widths     GPU time of fwd and fwd+bwd at W = 2, 3, 4, 5, 7, 8 (WIDTHS) x SiLU and none (WIDTH_ACTS), ours, FLA,
#              Dao in both modes (W = 2..4 only), seed mix and uniform 1-64 (WIDTH_MIXES), S = 250,340, C = 512 and
#              2048 (WIDTH_ROWS), no bias, WIDTH_REPS (15) timed calls; ours' and FLA's kernels of every (W,
#              activation) compiled first in parallel processes (beside Dao's build) -> widths.tgz: <gpu>_widths.*
#   grid       the seed grid: the benchmark with its defaults (every C of the grid, with and without bias, ours, FLA,
#              Dao; GRID_ARGS adds options, e.g. "--providers ours"), ours' kernels compiled first in parallel
#              processes                                                              -> grid.tgz: <gpu>_grid_seed.*
#   kcpbench   torchrun on NGPU (2) GPUs: the KCP benchmark, every layout, --tokens 65536*NGPU (S_local = 65,536:
#              SPEC 7's shape) and the seed workload (S_local = 65,536 / NGPU)
#                                                                    -> kcpbench.tgz: <gpu>x<NGPU>_kcp.*, _kcp_seed.*
#   mixab      an A/B of code versions: ours of each .variants/<name> (git archives of cakeconv; carry .variants) and
#              of this tree on the document mixes, every version compiled first, then two alternating rounds
#                                                                                     -> mixab.tgz
# Tests
#   gputests   every GPU test (pytest -m gpu) but the multi-GPU tier, the FLA file and the specialization file's
#              coverage check, XDIST (6) workers over the GPUs, until GPU_TESTS_S (480 s); the tests it did not reach
#              are listed in $OUT/gputests_unfinished.txt; then the specialization file serially (its kernels cached
#              by then), until SPEC_TESTS_S (100 s; 0: not run). GPU_TESTS (tests) narrows step 1. GPU_TESTS_REST=FILE (node ids, e.g. an earlier run's unfinished
#              list copied into the tree) runs those instead      -> <gpu>_pytest_gpu.log (_rest.log), _specialization.log
#   flatests   the FLA drop-in's GPU tests, tests/test_integrations_fla.py (carry .fla; FLA autotunes every kernel on
#              first use: a run of its own)                                           -> <gpu>_pytest_gpu_fla.log
#   flaexample examples/train_fla_model.py, swapped and unswapped (carry .fla)        -> <gpu>_train_fla_model.{json,log}
#   integrations the GPU tests of the Dao, mamba_ssm (the real Mamba2 layer: .fla/mamba_ssm-*.tar.gz) and transformers
#              integrations and of FLA's context under KCP, once Dao's
#              build is ready (two of them compare with it, and its nvcc jobs take every core), each test at most
#              TEST_TIMEOUT_S (300 s), all until INTEGRATION_TESTS_S (420 s); then
#              benchmarks/bench_model_swap.py (SWAP_ARGS, until SWAP_S, 240 s) (carry .fla)
#                                                                                     -> integrations.tgz
#   modelstep  benchmarks/bench_model_step.py, once Dao's build is ready: training steps of FLA's KDA layer and
#              KDAForCausalLM and of mamba_ssm's Mamba2 layer (fused path) with the library's conv, cakeconv and no
#              conv, each mamba_ssm mode in its own process, determinism over repeats; mamba_ssm's source unpacked
#              into /tmp/mamba from .fla/, shared/peers/ or ../shared/peers/mamba_ssm-2.3.2.post1.tar.gz;
#              MODELSTEP_ARGS adds options (e.g. "--parts kda"), all within MODELSTEP_S (570 s) (carry .fla)
#                                                                    -> modelstep.tgz: <gpu>_model_step.{json,log}, ...
#   coldstart  benchmarks/bench_first_step.py, once Dao's build is ready: the first fwd+bwd from a cold start, one fresh
#              process and empty Triton cache per library (cakeconv, cakeconv after `python -m cakeconv warmup`, FLA,
#              Dao in both modes), the first call at a new C and a new row stride, the steady state, a second process
#              on the warm cache; COLDSTART_ARGS adds options, all within COLDSTART_S (420 s); then the warm-up's GPU
#              test, tests/test_warmup.py -m gpu, until WARMUP_TESTS_S (120 s) (carry .fla)
#                                        -> <gpu>_first_step.{json,log}, <gpu>_first_step_table.txt, <gpu>_pytest_gpu_warmup.log
#   multigpu   the multi-GPU test tier, tests/multigpu/run.sh NGPU                   -> <gpu>x<NGPU>_multigpu_tier.log
# Kernel tools (the three steps add to one file, <gpu>_ncu_kernel_times.tgz)
#   ncu        Nsight Compute counters of the main kernels with the tuner's picks, no bias (NCU_BIAS), one run per
#              NCU_RUNS item MIX@C (default: seed@128 uniform:1-8@512)                -> ncu/ncu_<mix>_C<C>.txt
#   kerneltimes every kernel of the forward and backward calls and the gaps between them (tools/kernel_times.py),
#              C = 128, 256, 512, 2048 (KT_C), no bias, mixes seed and uniform 1-8 (KT_MIXES)  -> kt/kernel_times.*
#   sweep      every launch configuration at the small C (tools/sweep_configs.py, C = 128, 256: SWEEP_C; seed mix, no
#              bias; SWEEP_ARGS adds options, e.g. --extra), compiled first in parallel shards  -> sweep/sweep*.
#
# One H200, the README's table:  bash benchmarks/device_run.sh daobuild summary                  (carry .fla)
#   with more:                   bash benchmarks/device_run.sh daobuild warmbg summary hostcost mixes
#   every width:                 bash benchmarks/device_run.sh daobuild widths                   (carry .fla)
#   real layers and models:      bash benchmarks/device_run.sh daobuild modelstep                (carry .fla)
# Two H200s:                     NGPU=2 bash benchmarks/device_run.sh kcpbench
# Variables: BENCH_ARGS is appended to the single-GPU benchmark's command lines (BENCH_ARGS=--dry-run tries the
# benchmark steps on a CPU, with S = 1531 in the rows); KCP_ARGS to the KCP benchmark's; BENCH_COMMIT is the commit
# every result row records when the tree has no .git.
set -u
OUT=${OUT:-./device_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
BENCH=benchmarks/bench_cake_causal_conv1d_det.py
BENCH_ARGS=${BENCH_ARGS:-}
KCP_ARGS=${KCP_ARGS:-}
if [[ " $BENCH_ARGS " == *" --dry-run "* ]]; then S0=1531; else S0=250340; fi
SUMMARY_ROWS=${SUMMARY_ROWS:-${S0}x128,${S0}x512,${S0}x2048}
SUMMARY_REPS=${SUMMARY_REPS:-15}
HOST_ROWS=${HOST_ROWS:-${S0}x128,${S0}x512}
MIXES=${MIXES:-seed,uniform:1-8,uniform:1-64,uniform:1-1024,ones}
MIX_ROWS=${MIX_ROWS:-${S0}x128,${S0}x256,${S0}x512,${S0}x2048}
MIX_PASSES=${MIX_PASSES:-fwd,fwdbwd}
MIX_REPS=${MIX_REPS:-15}
WIDTHS=${WIDTHS:-2,3,4,5,7,8}
WIDTH_ACTS=${WIDTH_ACTS:-silu,none}
WIDTH_MIXES=${WIDTH_MIXES:-seed,uniform:1-64}
WIDTH_ROWS=${WIDTH_ROWS:-${S0}x512,${S0}x2048}
WIDTH_REPS=${WIDTH_REPS:-15}
NGPU=${NGPU:-2}
DAO_DIR=${DAO_DIR:-/tmp/dao}
DAO_SRC=$DAO_DIR/causal_conv1d-1.7.0
if [ -z "${BENCH_COMMIT:-}" ]; then BENCH_COMMIT=$(git rev-parse --short=12 HEAD 2>/dev/null || true); fi
export BENCH_COMMIT
if ls .fla/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/fla .fla/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/fla
fi
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/env.txt"
  GPU_TAG=${GPU_TAG:-$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oiE '\b[a-z][0-9]{2,4}\b' | head -1 | tr 'A-Z' 'a-z')}
  GPU_TAG=${GPU_TAG:-gpu}
fi
GPU_TAG=${GPU_TAG:-cpu}
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
quiet() {  # the timed steps start with no background work of this script left (warm-ups, Dao's build)
  wait; wait_dao
}
pack() {  # $OUT/$1/ -> $OUT/$1.tgz (one file comes back instead of many)
  [ -d "$OUT/$1" ] && tar -czf "$OUT/$1.tgz" -C "$OUT" "$1" && rm -rf "${OUT:?}/$1"
}
unpack() {  # the reverse, so that several steps add to one file
  mkdir -p "$OUT/$1"; [ -f "$OUT/$1.tgz" ] && tar -xzf "$OUT/$1.tgz" -C "$OUT" && rm -f "$OUT/$1.tgz"
}
bench_step() {  # bench_step STEP NAME OPTIONS...: the single-GPU benchmark into $OUT/STEP/NAME.*, packed; its table last
  local step=$1 name=$2; shift 2
  quiet; mkdir -p "$OUT/$step"
  python3 $BENCH "$@" $BENCH_ARGS --out "$OUT/$step" --name "$name" 2>"$OUT/$step/progress.log" > "$OUT/$step/bench.log"
  local r=$?; echo "$step: exit $r"; [ $r -ne 0 ] && tail -5 "$OUT/$step/progress.log"
  pack "$step"
  tar -xzOf "$OUT/$step.tgz" "$step/${name}_table.txt" 2>/dev/null | grep -v "^# wrote\|^$" | cut -c1-300
}
warm_ours() {  # warm_ours FOLDER ROWS...: ours' kernels of each SxC (or C) row compiled in a background process each
  local d=$1; shift; mkdir -p "$d"  # (WARM_ARGS: more options, e.g. a width and an activation)
  for r in "$@"; do
    python3 $BENCH --providers ${WARM_PROVIDERS:-ours} --rows "$r" --doc-mix "$MIXES" --bias ${WARM_BIAS:-no} \
      --passes fwd,bwd,fwdbwd --reps 1 --warmup 1 --no-check --no-plot --max-sets 2 --copy-bytes 67108864 \
      ${WARM_ARGS:-} $BENCH_ARGS --out "$d/$r" > "$d/$r.log" 2>&1 &
  done
}
KT_PACK=${GPU_TAG}_ncu_kernel_times
use_dao

for step in "$@"; do
  case "$step" in
    daobuild) # Dao's causal-conv1d, detached (setsid) so that it also outlives this run on a warm machine
         if [ -f "$DAO_SRC/DONE" ]; then echo "dao: already built in $DAO_SRC"; use_dao
         else
           DAO_WAITED=0
           mkdir -p "$DAO_DIR"; rm -f "$DAO_SRC/FAILED" "$DAO_DIR/FAILED"; : > "$DAO_DIR/build.log"
           if command -v setsid >/dev/null; then OUT=$OUT setsid -f bash benchmarks/tools/build_dao.sh </dev/null >/dev/null 2>&1
           else (OUT=$OUT nohup bash benchmarks/tools/build_dao.sh </dev/null >/dev/null 2>&1 &) fi
           echo "dao: build started in the background ($DAO_DIR/build.log)"
         fi ;;
    waitdao) wait_dao ;;
    warmbg) # ours' kernels compiled in parallel processes, then FLA's autotuning of the same C alone on the GPU (its
         # results are cached on disk, keyed by C; alone, so that no other process disturbs the configurations it times)
         rows=$(echo ${SUMMARY_ROWS//,/ } ${HOST_ROWS//,/ } ${MIX_ROWS//,/ } | tr ' ' '\n' | sort -u | tr '\n' ' ')
         (
           warm_ours /tmp/warm $rows
           python3 $BENCH --providers ours --passes none --host-cost --host-steps 1 --host-warmup 1 --no-plot \
             --copy-bytes 67108864 $BENCH_ARGS --out /tmp/warm/host > /tmp/warm/host.log 2>&1 &
           wait
           python3 $BENCH --providers fla --rows "$(echo $rows | tr ' ' ',')" --doc-mix seed --bias no --passes fwd,fwdbwd \
             --reps 1 --warmup 1 --no-check --no-plot --max-sets 2 --copy-bytes 67108864 \
             --host-cost --host-steps 1 --host-warmup 1 $BENCH_ARGS --out /tmp/warm/fla > /tmp/warm/fla.log 2>&1
           echo "warm-up done: $(ls /tmp/warm/*/*_table.txt 2>/dev/null | wc -l) runs"
         ) &
         echo "warm-up started in the background" ;;
    summary) bench_step summary "${GPU_TAG}_summary" --providers ours,fla,dao,dao_det --doc-mix seed,uniform:1-64 \
           --rows "$SUMMARY_ROWS" --bias no --passes fwd,fwdbwd --eager --eager-c 128,512 --eager-mix seed --host-cost \
           --reps "$SUMMARY_REPS" ;;
    mixes) bench_step mixes "${GPU_TAG}_mixes" --providers ${MIX_PROVIDERS:-ours,fla,dao,dao_det} --doc-mix "$MIXES" \
           --rows "$MIX_ROWS" --bias no --passes "$MIX_PASSES" --reps "$MIX_REPS" ;;
    hostcost) bench_step hostcost "${GPU_TAG}_hostcost" --providers ours,fla,dao,dao_det --doc-mix seed \
           --rows "$HOST_ROWS" \
           --bias no --passes fwdbwd --eager --host-cost ;;
    widths) # first, in parallel processes, one per (W, activation), while Dao's build (if any) goes on: ours' kernels at
         # the step's rows and mixes, and FLA's at S / 10 (its kernels take S, C and the strides as integers: S / 10
         # has the same specializations, not divisible by 16, and a tenth of the memory), FLA_CACHE_RESULTS=0 so that
         # its autotuning choices, timed under that load, stay out of its disk cache: the timed run autotunes alone
         wait; rm -rf /tmp/widthwarm
         fla_rows=$(echo "$WIDTH_ROWS" | tr ',' '\n' | sed "s/^[0-9]*x/$((S0 / 10))x/" | paste -sd, -)
         for w in ${WIDTHS//,/ }; do
           for a in ${WIDTH_ACTS//,/ }; do
             WARM_ARGS="--width $w --activation $a" MIXES=$WIDTH_MIXES \
               warm_ours "/tmp/widthwarm/ours_${w}_$a" "$WIDTH_ROWS"
             FLA_CACHE_RESULTS=0 python3 $BENCH --providers fla --rows "$fla_rows" --doc-mix seed --width "$w" \
               --activation "$a" --bias no --passes fwd,fwdbwd --reps 1 --warmup 1 --no-check --no-plot --max-sets 2 \
               --copy-bytes 67108864 $BENCH_ARGS --out "/tmp/widthwarm/fla_${w}_$a" > "/tmp/widthwarm/fla_${w}_$a.log" 2>&1 &
           done
         done
         wait; echo "widths: kernels compiled ($(find /tmp/widthwarm -name '*_table.txt' | wc -l) processes finished)"
         bench_step widths "${GPU_TAG}_widths" --providers ${WIDTH_PROVIDERS:-ours,fla,dao,dao_det} \
           --doc-mix "$WIDTH_MIXES" --rows "$WIDTH_ROWS" --width "$WIDTHS" --activation "$WIDTH_ACTS" --bias no \
           --passes fwd,fwdbwd --reps "$WIDTH_REPS" ;;
    grid) # ours' kernels of every (C, bias) of the grid compiled first, 8 processes at once (Triton's disk cache is
         # shared), so that the timed run does not spend ~20 s compiling per new shape
         quiet
         WARM_BIAS=both MIXES=seed warm_ours /tmp/gridwarm ${WARM_GROUPS:-512 128,8192 256,4096 1024,2560 1160 1280,2048 1344 1536}
         wait; echo "grid: kernels compiled ($(ls /tmp/gridwarm/*/*_table.txt 2>/dev/null | wc -l) processes)"
         bench_step grid "${GPU_TAG}_grid_seed" ${GRID_ARGS:-} ;;
    kcpbench) quiet; mkdir -p "$OUT/kcpbench"; tag=${GPU_TAG}x${NGPU}
         for run in kcp kcp_seed; do
           extra=""; [ "$run" = kcp ] && extra="--tokens $((65536 * NGPU))"
           timeout ${KCP_TIMEOUT:-300} python3 -m torch.distributed.run --standalone --nproc-per-node "$NGPU" \
             benchmarks/bench_cake_causal_conv1d_det_kcp.py $extra $KCP_ARGS --out "$OUT/kcpbench" --name "${tag}_$run" \
             > "$OUT/kcpbench/${tag}_$run.log" 2>&1
           r=$?; echo "kcpbench $run: exit $r"; [ $r -ne 0 ] && grep -v "^\[kcp bench\]\|^W[0-9]" "$OUT/kcpbench/${tag}_$run.log" | tail -15
         done
         pack kcpbench
         for run in kcp kcp_seed; do
           tar -xzOf "$OUT/kcpbench.tgz" "kcpbench/${tag}_${run}_table.txt" 2>/dev/null | grep -v "^# local\|^# time\|^$"
         done ;;
    mixab) # every version's kernels compiled first (parallel processes), then two alternating timed rounds; one table
         # per version and round
         mkdir -p "$OUT/mixab"
         for v in $(ls .variants 2>/dev/null) this; do
           if [ "$v" = this ]; then pp=$PWD; else pp=$PWD/.variants/$v; fi
           PYTHONPATH=$pp:$PYTHONPATH warm_ours "/tmp/mixabwarm/$v" ${MIX_ROWS//,/ }
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
    gputests) # (1) in XDIST workers spread over the GPUs (tests/conftest.py), --dist load, so the specialization cases
         # compile in parallel into the shared Triton cache; a line per test (-v) so that a run cut by its limit still
         # names its failures; (2) the specialization file alone and serially (its coverage check reads what its other
         # tests recorded in the same process)
         args="-m gpu -p no:cacheprovider --ignore=tests/multigpu --ignore=tests/test_integrations_fla.py"
         log="$OUT/${GPU_TAG}_pytest_gpu.log"; tests=${GPU_TESTS:-tests}
         if [ -n "${GPU_TESTS_REST:-}" ]; then log="$OUT/${GPU_TAG}_pytest_gpu_rest.log"; tests=$(cat "$GPU_TESTS_REST"); fi
         python3 -m pytest --collect-only -q $args -k "not every_integer_argument" $tests 2>/dev/null | grep :: | sort > /tmp/gpu_all.txt
         CAKECONV_TEST_GPUS=$(nvidia-smi -L | wc -l) timeout ${GPU_TESTS_S:-480} python3 -m pytest -v -rf $args \
           -n ${XDIST:-6} --dist load -k "not every_integer_argument" --durations=15 $tests > "$log" 2>&1
         echo "GPU tests: rc $?"; grep -E "FAILED|ERROR| passed| failed" "$log" | tail -20
         grep -oE "(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) tests/[^ ]+" "$log" | awk '{print $2}' | sort -u > /tmp/gpu_done.txt
         comm -23 /tmp/gpu_all.txt /tmp/gpu_done.txt > "$OUT/gputests_unfinished.txt"
         echo "unfinished: $(wc -l < "$OUT/gputests_unfinished.txt") (listed in \$OUT/gputests_unfinished.txt)"
         [ -s "$OUT/gputests_unfinished.txt" ] || rm -f "$OUT/gputests_unfinished.txt"
         [ "${SPEC_TESTS_S:-100}" = 0 ] && { echo "specialization file: not run (SPEC_TESTS_S=0)"; continue; }
         CAKECONV_TEST_GPUS=$(nvidia-smi -L | wc -l) timeout ${SPEC_TESTS_S:-100} python3 -m pytest -v -rf -m gpu \
           tests/test_gpu_specialization.py -p no:cacheprovider > "$OUT/${GPU_TAG}_pytest_gpu_specialization.log" 2>&1
         echo "specialization file: rc $?"; grep -E "FAILED|ERROR| passed| failed" "$OUT/${GPU_TAG}_pytest_gpu_specialization.log" | tail -10 ;;
    flatests) python3 -m pytest -v -m gpu tests/test_integrations_fla.py -p no:cacheprovider -rP --durations=0 2>&1 \
           | tee "$OUT/${GPU_TAG}_pytest_gpu_fla.log" | grep -E "PASSED|FAILED|ERROR|passed|failed" ;;
    flaexample) mkdir -p "$OUT/fla"
         python3 examples/train_fla_model.py --steps 300 --out "$OUT/fla" 2>&1 | tail -15
         for ext in json log; do mv "$OUT/fla/train_fla_model.$ext" "$OUT/${GPU_TAG}_train_fla_model.$ext" 2>/dev/null; done
         rm -rf "${OUT:?}/fla" ;;
    integrations) mkdir -p "$OUT/integrations"
         files=$(ls tests/test_integrations_dao.py tests/test_integrations_transformers.py tests/kcp/test_kcp_fla_context.py \
           tests/test_integrations_mamba_ssm.py 2>/dev/null)
         # the real Mamba2 layer's GPU test unpacks mamba_ssm's source package (carried in .fla/)
         for f in .fla/mamba_ssm-2.3.2.post1.tar.gz shared/peers/mamba_ssm-2.3.2.post1.tar.gz; do
           [ -f "$f" ] && { export MAMBA_SSM_SDIST=$PWD/$f; break; }; done
         # a test over TEST_TIMEOUT_S fails with its traceback instead of silencing the report (pytest-timeout)
         per_test=$(python3 -c "import pytest_timeout" 2>/dev/null && echo "--timeout ${TEST_TIMEOUT_S:-300}")
         wait_dao
         if [ -n "$files" ]; then
           log="$OUT/integrations/${GPU_TAG}_pytest_gpu_integrations.log"
           timeout ${INTEGRATION_TESTS_S:-420} python3 -m pytest -v -rf --tb=short -m gpu $files -p no:cacheprovider \
             -n ${XDIST_INT:-3} --durations=0 $per_test > "$log" 2>&1
           echo "integration tests: rc $?"; grep -E "FAILED|ERROR|SKIPPED| passed| failed|Timeout" "$log" | tail -12
         fi
         if [ -f benchmarks/bench_model_swap.py ]; then
           timeout ${SWAP_S:-240} python3 benchmarks/bench_model_swap.py --out "$OUT/integrations" --name "${GPU_TAG}_model_swap" \
             ${SWAP_ARGS:-} > "$OUT/integrations/${GPU_TAG}_model_swap.log" 2>&1
           echo "bench_model_swap: rc $?"; tail -15 "$OUT/integrations/${GPU_TAG}_model_swap.log"
         fi
         pack integrations ;;
    modelstep) # FLA's KDA layer and model, mamba_ssm's Mamba2 layer: the library's conv, cakeconv, no conv (Dao's build
         # waited for; mamba_ssm needs no build: its __init__, which imports Mamba1's extension, is never run)
         quiet; mkdir -p "$OUT/modelstep"; msrc=""
         for c in .fla/mamba_ssm-2.3.2.post1.tar.gz shared/peers/mamba_ssm-2.3.2.post1.tar.gz \
                  ../shared/peers/mamba_ssm-2.3.2.post1.tar.gz; do
           [ -z "$msrc" ] && [ -f "$c" ] && msrc=$c
         done
         rm -rf /tmp/mamba; mkdir -p /tmp/mamba
         if [ -n "$msrc" ]; then tar -xzf "$msrc" -C /tmp/mamba
         else echo "modelstep: no mamba_ssm-2.3.2.post1.tar.gz (copy it into .fla/ and carry .fla): the Mamba2 rows are skipped"; fi
         limit=${MODELSTEP_S:-570}
         timeout "$limit" python3 benchmarks/bench_model_step.py --mamba-src /tmp/mamba/mamba_ssm-2.3.2.post1 \
           --time-limit $((limit - 15)) ${MODELSTEP_ARGS:-} --out "$OUT/modelstep" --name "${GPU_TAG}_model_step" \
           > "$OUT/modelstep/${GPU_TAG}_model_step.log" 2> "$OUT/modelstep/progress.log"
         r=$?; echo "modelstep: rc $r"; [ $r -ne 0 ] && tail -15 "$OUT/modelstep/progress.log"
         pack modelstep
         tar -xzOf "$OUT/modelstep.tgz" "modelstep/${GPU_TAG}_model_step_table.txt" 2>/dev/null | cut -c1-260 ;;
    coldstart) # the benchmark's processes run one after the other with nothing else on the GPU (quiet); --time-limit
         # leaves it the time to write its JSON and table before COLDSTART_S ends
         quiet; limit=${COLDSTART_S:-420}
         timeout "$limit" python3 benchmarks/bench_first_step.py --time-limit $((limit - 15)) ${COLDSTART_ARGS:-} \
           --out "$OUT" --name "${GPU_TAG}_first_step" > "$OUT/${GPU_TAG}_first_step.log" 2>&1
         r=$?; echo "coldstart: rc $r"; [ $r -ne 0 ] && tail -15 "$OUT/${GPU_TAG}_first_step.log"
         cut -c1-300 "$OUT/${GPU_TAG}_first_step_table.txt" 2>/dev/null
         timeout ${WARMUP_TESTS_S:-120} python3 -m pytest -v -rf -m gpu tests/test_warmup.py -p no:cacheprovider \
           > "$OUT/${GPU_TAG}_pytest_gpu_warmup.log" 2>&1
         echo "warm-up GPU test: rc $?"; grep -E "PASSED|FAILED|ERROR| passed| failed" "$OUT/${GPU_TAG}_pytest_gpu_warmup.log" | tail -5 ;;
    multigpu) bash tests/multigpu/run.sh "$NGPU" 2>&1 | tee "$OUT/${GPU_TAG}x${NGPU}_multigpu_tier.log" | tail -30 ;;
    ncu) unpack "$KT_PACK"; mkdir -p "$OUT/$KT_PACK/ncu"
         NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
         for item in ${NCU_RUNS:-seed@128 uniform:1-8@512}; do
           f="$OUT/$KT_PACK/ncu/ncu_${item%@*}_C${item#*@}.txt"; f=${f//:/_}
           "$NCU" --clock-control none -k 'regex:cake_conv_(fwd|bwd)_kernel' \
             --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
             --section LaunchStats --section WarpStateStats --section SchedulerStats --section InstructionStats \
             python3 benchmarks/tools/ncu_profile.py --C "${item#*@}" --bias ${NCU_BIAS:-no} --doc-mix "${item%@*}" > "$f" 2>&1
           echo "== ncu ${item%@*}, C = ${item#*@}: rc $?"
           grep -E "cake_conv|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Duration|Issued Warp|No Eligible" "$f" | head -40
         done
         pack "$KT_PACK" ;;
    kerneltimes) unpack "$KT_PACK"; mkdir -p "$OUT/$KT_PACK/kt"
         python3 benchmarks/tools/kernel_times.py --C ${KT_C:-128,256,512,2048} --bias no --doc-mix ${KT_MIXES:-seed,uniform:1-8} \
           --out "$OUT/$KT_PACK/kt" > "$OUT/$KT_PACK/kt/kernel_times.log" 2>&1
         echo "kernel_times: rc $?"; tail -8 "$OUT/$KT_PACK/kt/kernel_times.log"
         pack "$KT_PACK" ;;
    sweep) unpack "$KT_PACK"; d="$OUT/$KT_PACK/sweep"; mkdir -p "$d" /tmp/sweepwarm
         sweep_c=${SWEEP_C:-128,256}
         for p in fwd bwd; do
           for k in 0 1 2 3; do  # compile warm-up: every configuration once, in 4 shards per pass
             python3 benchmarks/tools/sweep_configs.py --C "$sweep_c" --passes $p --doc-mix seed --bias no --reps 1 \
               --shard $k/4 ${SWEEP_ARGS:-} > /tmp/sweepwarm/${p}_$k.log 2>&1 &
           done
         done
         wait
         python3 benchmarks/tools/sweep_configs.py --C "$sweep_c" --doc-mix seed --bias no --reps ${SWEEP_REPS:-20} \
           ${SWEEP_ARGS:-} --out "$d" > "$d/sweep.log" 2>&1
         echo "sweep: rc $?"; grep -A40 "^# best" "$d/sweep.log"
         pack "$KT_PACK" ;;
    *) echo "unknown step $step (the header of benchmarks/device_run.sh lists them)" ;;
  esac
done
