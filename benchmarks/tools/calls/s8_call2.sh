#!/usr/bin/env bash
# Session 8's second device call (2 H200s), after the halo-read fix: the multi-GPU tier alone (every part),
# then the KCP benchmark on 2 GPUs (the seed workload and --tokens 131072). Nothing runs beside either.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/env.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.device_count())" | tee -a $OUT/env.txt
timeout 360 bash tests/multigpu/run.sh 2 > $OUT/multigpu.log 2>&1; echo "multigpu rc $? at $(( $(date +%s) - T0 )) s" | tee -a $OUT/multigpu.log
mkdir -p $OUT/kcpbench
for run in tokens131072 seed; do
  extra=""; [ "$run" != seed ] && extra="--tokens 131072"
  timeout 110 python3 -m torch.distributed.run --standalone --nproc-per-node 2 \
    benchmarks/bench_cake_causal_conv1d_det_kcp.py $extra --out $OUT/kcpbench/$run > $OUT/kcpbench/$run.log 2>&1
  echo "kcpbench $run: exit $? at $(( $(date +%s) - T0 )) s"
done
tar -czf $OUT/kcpbench.tgz -C $OUT kcpbench && rm -rf $OUT/kcpbench
echo "== multi-GPU tier"; grep -E "^  [a-z_]+ +(PASS|FAIL|SKIP)|RESULT|^---|PROBLEM|multi-GPU tier on|rc " $OUT/multigpu.log | tail -40
echo "== KCP bench"; for run in tokens131072 seed; do tar -xzOf $OUT/kcpbench.tgz kcpbench/$run/bench_cake_causal_conv1d_det_kcp_p2_table.txt 2>/dev/null | grep -v "^# local\|^# time\|^$" | tail -25; done
