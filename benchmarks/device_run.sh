#!/usr/bin/env bash
# One call on the GPU machine: environment, GPU tests, kernel sweep and/or benchmark.
#   bash benchmarks/device_run.sh [tests|gputests|gputestsx|gputestsfast] [ab] [oddc] [onedoc] [kerneltimes] [sweep|sweepbwd|sweepsmall] [ncu]
#                                 [bitsbg] [benchwarm] [waitbg] [bench|benchsplit|benchpeers|benchours|benchquick]
#   abbench (= abwarmbg waitbg abtimed): AB_ROWS (SxC list) through the benchmark for each .variants/<name> and this tree
# Writes logs and results under $OUT (set by the device tool; defaults to ./device_out).
set -u
OUT=${OUT:-./device_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1
AB_ROWS=${AB_ROWS:-250340x128,250340x512,250340x1024,250340x1160,250340x2048}  # abwarmbg / abtimed shapes (SxC list)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if ls .fla/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/fla .fla/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/fla
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/env.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/env.txt"
for step in "$@"; do
  case "$step" in
    tests) python3 -m pytest -q tests -p no:cacheprovider 2>&1 | tee "$OUT/pytest.log" | tail -25 ;;
    gputests) python3 -m pytest -q -m gpu tests -p no:cacheprovider 2>&1 | tee "$OUT/pytest_gpu.log" | tail -25 ;;
    gpumodule) python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider 2>&1 | tee "$OUT/pytest_gpu_module.log" | tail -8 ;;
    gpuconfigs) python3 -m pytest -q -m gpu tests/test_gpu.py -k every_config -p no:cacheprovider 2>&1 | tee "$OUT/pytest_gpu_configs.log" | tail -8 ;;
    gpunew) python3 -m pytest -q tests/test_cuda_graphs.py tests/kcp/test_kcp_nccl_one_rank.py -p no:cacheprovider 2>&1 | tee "$OUT/pytest_gpu_new.log" | tail -15 ;;
    gputestsx) # every GPU test, 8 pytest-xdist workers (compiles in parallel; 14 ran the GPU out of memory)
         python3 -m pytest -q -m gpu tests -p no:cacheprovider -n ${XDIST:-8} 2>&1 | tee "$OUT/pytest_gpu.log" | tail -25 ;;
    ab)  # the tuner's picks of each code version in .variants/<name> (git archives; carry .variants), then this tree
         for v in $(ls .variants 2>/dev/null) this; do
           if [ "$v" = this ]; then pp=$PWD; else pp=$PWD/.variants/$v; fi
           mkdir -p "$OUT/ab_$v"; echo "== $v"
           PYTHONPATH=$pp:$PYTHONPATH python3 benchmarks/sweep_configs.py --picks --C 128,512,2048,8192 --reps 20 \
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
             PYTHONPATH=$pp:$PYTHONPATH python3 benchmarks/bench_cake_causal_conv1d_det.py --providers ours --rows "$r" \
               --passes fwd,bwd --reps 1 --warmup 1 --no-check --no-plot --max-sets 2 --copy-bytes 67108864 \
               --out "$OUT/abwarm/${v}_$r" > "$OUT/abwarm/${v}_$r.log" 2>&1 &
           done
         done ;;
    abtimed)
         for round in 1 2; do
           for v in $(ls .variants 2>/dev/null) this; do
             if [ "$v" = this ]; then pp=$PWD; else pp=$PWD/.variants/$v; fi
             d="$OUT/abbench/${v}_$round"; mkdir -p "$d"
             PYTHONPATH=$pp:$PYTHONPATH python3 benchmarks/bench_cake_causal_conv1d_det.py --providers ours --rows "$AB_ROWS" \
               --passes fwd,bwd --no-check --no-plot --out "$d" 2>"$d/progress.log" > "$d/bench.log"
             echo "== $v round $round"; grep -E "^== |^ *[0-9]+ +[0-9]+ (fwd|bwd)" "$d/bench.log"
           done
         done ;;
    oddc) # row strides that are not a multiple of 128 bytes (C = 1160, 1168) next to 1152 and 1280: the picks
         mkdir -p "$OUT/oddc"
         python3 benchmarks/sweep_configs.py --picks --C 1152,1160,1168,1280 --reps 20 --out "$OUT/oddc" 2>&1 \
           | tee "$OUT/oddc/sweep.log" | grep best
         mkdir -p "$OUT/oddc_all"  # every forward candidate at C = 1160
         python3 benchmarks/sweep_configs.py --passes fwd --C 1160 --reps 20 --out "$OUT/oddc_all" 2>&1 \
           | tee "$OUT/oddc_all/sweep.log" | grep -E "best|C= 1160" ;;
    onedoc) # the picks with one document (no masked programs) vs the usual mix: the cost of the masked path
         mkdir -p "$OUT/onedoc"
         python3 benchmarks/sweep_configs.py --picks --C 512,2048 --reps 20 --mean-doc 100000000 --out "$OUT/onedoc" 2>&1 \
           | tee "$OUT/onedoc/sweep.log" | grep best ;;
    kerneltimes) python3 benchmarks/kernel_times.py --C 128,512,2048 --out "$OUT" 2>&1 | tee "$OUT/kernel_times.log" | tail -8 ;;
    gputestsfast) python3 -m pytest -q -m gpu tests -p no:cacheprovider -k "not every_config" 2>&1 | tee "$OUT/pytest_gpu.log" | tail -25 ;;
    sweep) python3 benchmarks/sweep_configs.py --out "$OUT" 2>&1 | tee "$OUT/sweep.log" | tail -40 ;;
    sweepsmall) # every backward candidate at the small C (waves: C = 128 leaves under two waves of 4-leaf programs)
         mkdir -p "$OUT/sweepsmall"
         python3 benchmarks/sweep_configs.py --passes bwd --C ${SWEEP_C:-128,256} --reps 20 --out "$OUT/sweepsmall" 2>&1 \
           | tee "$OUT/sweepsmall/sweep.log" | grep -E "best|C=" | tail -30 ;;
    sweepbwd) python3 benchmarks/sweep_configs.py --passes bwd --out "$OUT" 2>&1 | tee "$OUT/sweep_bwd.log" | tail -30 ;;
    ncu) # ncu counters of the picks at NCU_C (default 128,512), no bias unless NCU_BIAS=yes
         NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
         "$NCU" --clock-control none -k 'regex:cake_conv_(fwd|bwd)_kernel' \
           --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
           --section LaunchStats --section WarpStateStats --section SchedulerStats --section InstructionStats \
           python3 benchmarks/ncu_profile.py --C ${NCU_C:-128,512} --bias ${NCU_BIAS:-no} > "$OUT/ncu.txt" 2>&1
         grep -E "cake_conv|DRAM Throughput|Memory Throughput|L2 Cache Throughput|Achieved Occupancy|Registers Per|Stall Long|Warp Cycles Per Issued|Theoretical Occ|Duration|Issued Warp|No Eligible|Executed Ipc|forward|backward" "$OUT/ncu.txt" | head -150 ;;
    benchwarm) # compile every kernel the grid needs in 8 processes at once (Triton's disk cache is shared), so
         # the timed run that follows does not spend ~20 s per new (C, bias, S % 16) compiling (session 3 ran out of time)
         mkdir -p "$OUT/warm"; i=0
         for cs in ${WARM_GROUPS:-512 128,8192 256,4096 1024,2560 1160 1280,2048 1344 1536}; do
           python3 benchmarks/bench_cake_causal_conv1d_det.py --providers ours --rows "$cs" --reps 1 --warmup 1 \
             --no-check --no-plot --copy-bytes 67108864 ${WARM_ARGS:-} --out "$OUT/warm/$i" > "$OUT/warm/$i.log" 2>&1 &
           i=$((i + 1))
         done
         wait; echo "warm-up: $(cat "$OUT"/warm/*/bench_cake_causal_conv1d_det.csv 2>/dev/null | grep -c ours) rows compiled and run once" ;;
    bench) python3 benchmarks/bench_cake_causal_conv1d_det.py --out "$OUT" 2>"$OUT/bench_progress.log" | tee "$OUT/bench.log" | tail -60 ;;
    benchsplit) bash "$0" benchours benchpeers ;;  # the whole grid for ours, then the peers on five shapes
    benchours) mkdir -p "$OUT/bench_ours"
         python3 benchmarks/bench_cake_causal_conv1d_det.py --providers ours --out "$OUT/bench_ours" 2>"$OUT/bench_ours/progress.log" | tee "$OUT/bench_ours/bench.log" | tail -60 ;;
    benchpeers) mkdir -p "$OUT/bench_peers"  # ours and FLA, same inputs, same run (FLA autotunes ~20 s per new shape)
         python3 benchmarks/bench_cake_causal_conv1d_det.py --providers ours,fla --bias no --rows 250340x128,250340x512,250340x1024,250340x2048,250340x8192 \
           --out "$OUT/bench_peers" 2>"$OUT/bench_peers/progress.log" | tee "$OUT/bench_peers/bench.log" | tail -30 ;;
    bitsbg) # in the background (the next steps compile on the other cores): the GPU tests of the kernels' bits
         (timeout ${BITS_TIMEOUT:-900} python3 -m pytest -q -m gpu tests/test_gpu.py -k "${BITS_K:-dweight_tree or every_config}" -p no:cacheprovider -n ${BITS_N:-4} --tb=short -rf \
           > "$OUT/pytest_gpu_bits.log" 2>&1; echo "bits tests: $(tail -1 "$OUT/pytest_gpu_bits.log")") & ;;
    waitbg) wait ;;
    benchquick) python3 benchmarks/bench_cake_causal_conv1d_det.py --quick --out "$OUT" 2>"$OUT/bench_progress.log" | tee "$OUT/bench.log" | tail -40 ;;
    *) echo "unknown step $step" ;;
  esac
done
