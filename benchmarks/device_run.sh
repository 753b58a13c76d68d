#!/usr/bin/env bash
# The GPU machine's run: set up the peers, run named benchmarks, run the GPU tests.
#   bash benchmarks/device_run.sh STEP [STEP ...]        (in the order given; carry .fla for the peers)
# Everything is written under $OUT (default ./device_out), which comes back from the machine (few files: each
# benchmark step packs its folder into $OUT/<step>.tgz and prints its table last). Result files are named as
# benchmarks/results/ keeps them: <gpu>_<what>.* (h200; NGPU ranks: h200x2).
#
#   peers      FLA 0.6.0 from the wheels in .fla/ (onto PYTHONPATH); Dao's causal-conv1d 1.7.0 built in the background
#              from .fla/causal_conv1d-1.7.0.tar.gz (tools/build_dao.sh: sm_90, bf16/fp32 kernels; a prebuilt
#              .fla/dao_prebuilt_sm90.tgz takes seconds); mamba_ssm 2.3.2's source unpacked from .fla/ into /tmp/mamba.
#              The steps below wait for Dao's build (DAO_TIMEOUT, 600 s); without `peers` they run without the peers.
# Benchmarks (cakeconv's kernels of the step compiled first by `python -m cakeconv warmup`, in parallel processes)
#   summary    the README's table: cakeconv, FLA, Dao in both modes (dao, dao_det); seed mix and uniform 1-64,
#              S = 250,340, C = 128, 512, 2048; fwd and fwd+bwd; eager loop (seed, C = 128, 512); host cost
#   mixes      the document mixes (seed, uniform 1-8 / 1-64 / 1-1024, ones) x C = 128, 256, 512, 2048; fwd, fwd+bwd
#   widths     W = 2, 3, 4, 5, 7, 8 x SiLU / none, seed and uniform 1-64, C = 512 and 2048; fwd, fwd+bwd (WIDTHS: a subset)
#   grid       the seed grid: every C of benchmarks/README.md's grid, with and without bias (GRID_ARGS adds options)
#   kcp        torchrun on NGPU (2) GPUs: KCP against the local op, every layout, S_local = 65,536, C = 4,096,
#              and the seed workload
#   modelstep  FLA's KDA layer and KDAForCausalLM, mamba_ssm's Mamba2 layer: the library's conv, cakeconv, no conv
#              (MODELSTEP_ARGS adds options, e.g. "--parts kda")
#   firststep  the first training step from a cold start, one fresh process and empty Triton cache per library
#              (COLDSTART_ARGS adds options); then the GPU tests of tests/test_warmup.py and tests/test_compile_ahead.py
#   hostcost   host time per call of the eager 16-call chain, rung by rung (tools/host_rungs.py --device cuda);
#              HOSTCOST_BASE: another tree's folder holding its cakeconv/, timed in alternation with this one
#              (before/after a change); HOSTCOST_ROUNDS (3) alternations; HOSTCOST_ARGS replaces the tool's options
# Tests
#   tests      the GPU tests (pytest -m gpu, CAKECONV_COMPILE_THREADS=1; GPU_TESTS: files or node ids; default every file but the multi-GPU tier
#              and tests/test_integrations_fla.py, whose FLA kernels autotune on first use: give it a run of its
#              own), XDIST (6) workers spread over the GPUs, until GPU_TESTS_S (540 s), then the specialization
#              coverage check; mamba_ssm's test finds its source package through `peers`; what the limit cut off
#              is listed in $OUT/<gpu>_pytest_gpu_unfinished.txt
#   multigpu   the multi-GPU test tier, tests/multigpu/run.sh NGPU
#
# Examples:  bash benchmarks/device_run.sh peers summary          NGPU=2 bash benchmarks/device_run.sh kcp
#            GPU_TESTS="tests/test_integrations_dao.py tests/test_integrations_mamba_ssm.py" \
#              bash benchmarks/device_run.sh peers tests
# OP_S: a time limit (s) for each `benchmarks.op` command, so that its step still packs what it wrote (rows so far in
# <name>.partial.jsonl). BENCH_ARGS is appended to every `benchmarks.op` command (BENCH_ARGS=--dry-run tries the op steps on a CPU);
# BENCH_COMMIT, when set, is the commit the rows record; else HEAD of the host's .git, with -dirty when the tree sent
# differs from it in cakeconv/ or benchmarks/ (a host's .git can lag the tree: name the tree's commit then).
set -u
OUT=${OUT:-./device_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
BENCH_ARGS=${BENCH_ARGS:-}
if [[ " $BENCH_ARGS " == *" --dry-run "* ]]; then S0=1531; else S0=250340; fi
NGPU=${NGPU:-2}
DAO_DIR=${DAO_DIR:-/tmp/dao}
DAO_SRC=$DAO_DIR/causal_conv1d-1.7.0
MAMBA_SDIST=mamba_ssm-2.3.2.post1.tar.gz
GPU_TAG=cpu
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/env.txt"
  GPU_TAG=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oiE '\b[a-z][0-9]{2,4}\b' | head -1 | tr 'A-Z' 'a-z')
  GPU_TAG=${GPU_TAG:-gpu}
fi
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/env.txt"

dao_ready() {  # wait for the build `peers` started (if any), then put it on PYTHONPATH
  if [ -f "$DAO_DIR/build.log" ] && [ ! -f "$DAO_SRC/DONE" ]; then
    local t=0
    while [ ! -f "$DAO_SRC/DONE" ] && [ ! -f "$DAO_SRC/FAILED" ] && [ "$t" -lt "${DAO_TIMEOUT:-600}" ]; do sleep 5; t=$((t + 5)); done
    [ -f "$DAO_SRC/DONE" ] || { echo "dao: not ready after $t s: its rows are skipped (\$OUT/daobuild.log)"; cp "$DAO_DIR/build.log" "$OUT/daobuild.log"; }
  fi
  if [ -f "$DAO_SRC/DONE" ] && [[ ":$PYTHONPATH:" != *":$DAO_SRC:"* ]]; then export PYTHONPATH=$PYTHONPATH:$DAO_SRC; fi
}
warm() {  # warm STEP ARGS...: cakeconv's kernels for these problems, compiled in parallel into Triton's cache
  local step=$1; shift; mkdir -p "$OUT/$step"
  python3 -m cakeconv warmup --jobs "${WARM_JOBS:-12}" "$@" > "$OUT/$step/warmup.log" 2>&1
  echo "$step: warm-up rc $? ($(tail -1 "$OUT/$step/warmup.log" | cut -c1-200))"
}
finish() {  # finish STEP RC TABLE...: pack $OUT/STEP into $OUT/STEP.tgz, then print the tables
  local step=$1 rc=$2; shift 2
  echo "$step: rc $rc"; [ "$rc" -ne 0 ] && tail -15 "$OUT/$step/progress.log" 2>/dev/null
  cat "$@" 2>/dev/null | grep -v "^# wrote\|^$" | cut -c1-300 > "/tmp/$step.table"
  tar -czf "$OUT/$step.tgz" -C "$OUT" "$step" && rm -rf "${OUT:?}/$step"
  cat "/tmp/$step.table"
}
op() {  # op STEP NAME OPTIONS...: python -m benchmarks.op into $OUT/STEP
  local step=$1 name=$2; shift 2
  dao_ready; mkdir -p "$OUT/$step"
  timeout "${OP_S:-0}" python3 -m benchmarks.op "$@" $BENCH_ARGS --out "$OUT/$step" --name "$name" \
    > "$OUT/$step/bench.log" 2> "$OUT/$step/progress.log"
  finish "$step" $? "$OUT/$step/${name}_table.txt"
}

for step in "$@"; do
  case "$step" in
    peers) if ls .fla/*.whl >/dev/null 2>&1; then
             python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/fla .fla/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/fla
           fi
           if [ ! -f "$DAO_SRC/DONE" ]; then  # detached, so that it outlives this run on a warm machine
             mkdir -p "$DAO_DIR"; : > "$DAO_DIR/build.log"
             if command -v setsid >/dev/null; then OUT=$OUT setsid -f bash tools/build_dao.sh </dev/null >/dev/null 2>&1
             else (OUT=$OUT nohup bash tools/build_dao.sh </dev/null >/dev/null 2>&1 &) fi
             echo "dao: build started in the background ($DAO_DIR/build.log)"
           fi
           for f in .fla/$MAMBA_SDIST shared/peers/$MAMBA_SDIST ../shared/peers/$MAMBA_SDIST; do
             [ -f "$f" ] && { rm -rf /tmp/mamba; mkdir -p /tmp/mamba; tar -xzf "$f" -C /tmp/mamba; export MAMBA_SSM_SDIST=$PWD/$f; break; }
           done ;;
    summary) warm summary --channels 128,256,512,2048 --bias no
           op summary "${GPU_TAG}_summary" --providers ours,fla,dao,dao_det --doc-mix seed,uniform:1-64 \
             --rows "${S0}x128,${S0}x512,${S0}x2048" --bias no --passes fwd,fwdbwd --eager --eager-c 128,512 \
             --eager-mix seed --host-cost --reps 15 ;;
    mixes) warm mixes --channels 128,256,512,2048 --bias no
           op mixes "${GPU_TAG}_mixes" --providers ours,fla,dao,dao_det --doc-mix seed,uniform:1-8,uniform:1-64,uniform:1-1024,ones \
             --rows "${S0}x128,${S0}x256,${S0}x512,${S0}x2048" --bias no --passes fwd,fwdbwd --reps 15 ;;
    widths) # FLA's kernels of every (W, activation) compiled first, in parallel processes beside cakeconv's warm-up, at
         # S / 10 (the same specializations, a tenth of the memory) and with FLA_CACHE_RESULTS=0, so that its autotuning
         # choices, timed under that load, stay out of its disk cache: the timed run autotunes alone
         # W = 7 and 8 compile for minutes each: compile them ahead on a CPU machine (tools/cache_for_host.py, then
         # TRITON_CACHE_DIR here; benchmarks/README.md), or split the step over calls of 10 minutes with WIDTHS
         # (2,3,4,5,7,8; e.g. 2,3,4,5 then 4,7 then 4,8: W = 4 in each);
         # a subset's files are named <gpu>_widths_w<the widths>
         ws=${WIDTHS:-2,3,4,5,7,8}; name="${GPU_TAG}_widths"; [ "$ws" != 2,3,4,5,7,8 ] && name="${name}_w${ws//,/}"
         mkdir -p /tmp/widthwarm
         for w in ${ws//,/ }; do for a in silu none; do
           FLA_CACHE_RESULTS=0 python3 -m benchmarks.op --providers fla --rows "$((S0 / 10))x512,$((S0 / 10))x2048" \
             --doc-mix seed --width $w --activation $a --bias no --passes fwd,fwdbwd --reps 1 --warmup 1 --no-check \
             --no-plot --max-sets 2 $BENCH_ARGS --out /tmp/widthwarm/fla_${w}_$a > /tmp/widthwarm/fla_${w}_$a.log 2>&1 &
         done; done
         # only the variants of the run's token count (about half: W = 7 and 8 compile for minutes each)
         warm widths --channels 512,2048 --bias no --width "$ws" --activation silu,none --tokens "$S0"; wait
         op widths "$name" --providers ours,fla,dao,dao_det --doc-mix seed,uniform:1-64 \
           --rows "${S0}x512,${S0}x2048" --width "$ws" --activation silu,none --bias no --passes fwd,fwdbwd --reps 15 ;;
    grid) warm grid --channels 128,256,512,1024,1160,1280,1344,1536,2048,2560,4096,8192 --bias both
           op grid "${GPU_TAG}_grid_seed" ${GRID_ARGS:-} ;;
    kcp) dao_ready; mkdir -p "$OUT/kcp"; tag=${GPU_TAG}x${NGPU}; rc=0
         for run in kcp kcp_seed; do
           extra=""; [ "$run" = kcp ] && extra="--tokens $((65536 * NGPU))"
           timeout "${KCP_TIMEOUT:-300}" python3 -m torch.distributed.run --standalone --nproc-per-node "$NGPU" \
             -m benchmarks.kcp $extra ${KCP_ARGS:-} --out "$OUT/kcp" --name "${tag}_$run" > "$OUT/kcp/${tag}_$run.log" 2>&1 || rc=$?
           cp "$OUT/kcp/${tag}_$run.log" "$OUT/kcp/progress.log"
         done
         finish kcp $rc "$OUT/kcp/${tag}_kcp_table.txt" "$OUT/kcp/${tag}_kcp_seed_table.txt" ;;
    modelstep) dao_ready; mkdir -p "$OUT/modelstep"; limit=${MODELSTEP_S:-570}
         [ -d /tmp/mamba ] || echo "modelstep: no mamba_ssm source (run peers with .fla/$MAMBA_SDIST): no Mamba2 rows"
         timeout "$limit" python3 -m benchmarks.model_step --mamba-src /tmp/mamba/mamba_ssm-2.3.2.post1 \
           --time-limit $((limit - 15)) ${MODELSTEP_ARGS:-} --out "$OUT/modelstep" --name "${GPU_TAG}_model_step" \
           > "$OUT/modelstep/${GPU_TAG}_model_step.log" 2> "$OUT/modelstep/progress.log"
         finish modelstep $? "$OUT/modelstep/${GPU_TAG}_model_step_table.txt" ;;
    firststep) dao_ready; mkdir -p "$OUT/firststep"; limit=${COLDSTART_S:-420}
         timeout "$limit" python3 -m benchmarks.first_step --time-limit $((limit - 15)) ${COLDSTART_ARGS:-} \
           --out "$OUT/firststep" --name "${GPU_TAG}_first_step" > "$OUT/firststep/progress.log" 2>&1
         rc=$?
         timeout "${WARMUP_TESTS_S:-240}" python3 -m pytest -v -rf -m gpu tests/test_warmup.py tests/test_compile_ahead.py \
           -p no:cacheprovider \
           > "$OUT/firststep/${GPU_TAG}_pytest_gpu_warmup.log" 2>&1
         echo "warm-up GPU tests: rc $?"
         finish firststep $rc "$OUT/firststep/${GPU_TAG}_first_step_table.txt" ;;
    hostcost) mkdir -p "$OUT/hostcost"; log="$OUT/hostcost/${GPU_TAG}_host_cost.txt"; : > "$log"; rc=0
         for r in $(seq "${HOSTCOST_ROUNDS:-3}"); do
           trees="${HOSTCOST_BASE:-} $PWD"; [ $((r % 2)) -eq 0 ] && trees="$PWD ${HOSTCOST_BASE:-}"  # order alternates
           for tree in $trees; do  # the tool appends this tree after PYTHONPATH: the first wins
             echo "== $(cd "$tree" && pwd) (round $r)" >> "$log"
             PYTHONPATH="$tree:$PYTHONPATH" python3 tools/host_rungs.py --device "${HOSTCOST_DEVICE:-cuda}" \
               ${HOSTCOST_ARGS:---steps 100 --rounds 7} >> "$log" 2>&1 || rc=$?
           done
         done
         grep -E "^==|^# host|^(full|floor|trivial) " "$log" > "$OUT/hostcost/${GPU_TAG}_host_cost_table.txt"
         finish hostcost $rc "$OUT/hostcost/${GPU_TAG}_host_cost_table.txt" ;;
    tests) dao_ready; log="$OUT/${GPU_TAG}_pytest_gpu.log"
         # workers record the integer arguments the specialization cases launched; the coverage check reads them last
         export CAKECONV_SPEC_SEEN_DIR=/tmp/spec_seen; rm -rf "$CAKECONV_SPEC_SEEN_DIR"
         args="-m gpu -p no:cacheprovider --ignore=tests/multigpu"
         per_test=$(python3 -c "import pytest_timeout" 2>/dev/null && echo "--timeout ${TEST_TIMEOUT_S:-300}")
         python3 -m pytest --collect-only -q $args -k "not every_integer_argument" ${GPU_TESTS:-tests --ignore=tests/test_integrations_fla.py} 2>/dev/null \
           | grep :: | sort > /tmp/gpu_all.txt
         # each worker compiles only the kernels its tests launch (CAKECONV_COMPILE_THREADS=1): with the side-by-side
         # compile on, every new problem of every worker would compile all its variants in 16 threads at once;
         # tests/test_compile_ahead.py clears the variable for the processes that test that compile
         CAKECONV_COMPILE_THREADS=${CAKECONV_COMPILE_THREADS:-1} CAKECONV_TEST_GPUS=$(nvidia-smi -L | wc -l) \
           timeout "${GPU_TESTS_S:-540}" python3 -m pytest -v -rf --tb=short \
           $args -k "not every_integer_argument" -n "${XDIST:-6}" --dist load --durations=15 $per_test \
           ${GPU_TESTS:-tests --ignore=tests/test_integrations_fla.py} > "$log" 2>&1
         echo "GPU tests: rc $?"; grep -E "FAILED|ERROR| passed| failed" "$log" | tail -20
         python3 -m pytest -v -rf -m gpu -p no:cacheprovider -k every_integer_argument tests/test_gpu_specialization.py \
           >> "$log" 2>&1
         echo "specialization coverage: rc $? (skipped when no specialization case ran)"
         grep -oE "(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) tests/[^ ]+" "$log" | awk '{print $2}' | sort -u > /tmp/gpu_done.txt
         comm -23 /tmp/gpu_all.txt /tmp/gpu_done.txt > "$OUT/${GPU_TAG}_pytest_gpu_unfinished.txt"
         echo "unfinished: $(wc -l < "$OUT/${GPU_TAG}_pytest_gpu_unfinished.txt")" ;;
    multigpu) bash tests/multigpu/run.sh "$NGPU" 2>&1 | tee "$OUT/${GPU_TAG}x${NGPU}_multigpu_tier.log" | tail -30 ;;
    *) echo "unknown step $step (the header of benchmarks/device_run.sh lists them)" ;;
  esac
done
