#!/usr/bin/env bash
# Session 8's first device call (2 H200s), the code of issues 15 and 18 as it is on main:
#   phase 1, side by side: GPU tests (tier 4) on GPU 0 (3 xdist workers), the FLA drop-in's GPU tests and
#   training example on GPU 1, the multi-GPU tier (tests/multigpu/run.sh 2) on both (correctness only);
#   phase 2, alone: the KCP benchmark on 2 GPUs (seed workload and --tokens 131072).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/env.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.device_count())" | tee -a $OUT/env.txt
python3 -m pip install -q --no-index --no-deps --target /tmp/fla .fla/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/fla
(CUDA_VISIBLE_DEVICES=0 timeout 380 python3 -m pytest -q -m gpu tests -p no:cacheprovider -n 3 --tb=short \
   --ignore=tests/multigpu --ignore=tests/test_integrations_fla.py > $OUT/pytest_gpu.log 2>&1; echo "pytest rc $? at $(( $(date +%s) - T0 )) s" >> $OUT/pytest_gpu.log) &
(mkdir -p $OUT/fla; export CUDA_VISIBLE_DEVICES=1
 timeout 200 python3 -m pytest -q -m gpu tests/test_integrations_fla.py -p no:cacheprovider -rP > $OUT/fla/pytest_gpu_fla.log 2>&1; echo "rc $?" >> $OUT/fla/pytest_gpu_fla.log
 timeout 200 python3 examples/train_fla_model.py --steps 300 --out $OUT/fla > $OUT/fla/example.log 2>&1; echo "rc $? at $(( $(date +%s) - T0 )) s" >> $OUT/fla/example.log) &
timeout 380 bash tests/multigpu/run.sh 2 > $OUT/multigpu.log 2>&1; echo "multigpu rc $? at $(( $(date +%s) - T0 )) s" >> $OUT/multigpu.log
wait
tar -czf $OUT/fla.tgz -C $OUT fla && rm -rf $OUT/fla
mkdir -p $OUT/kcpbench
for run in seed tokens131072; do
  extra=""; [ "$run" != seed ] && extra="--tokens 131072"
  timeout 100 python3 -m torch.distributed.run --standalone --nproc-per-node 2 \
    benchmarks/bench_cake_causal_conv1d_det_kcp.py $extra --out $OUT/kcpbench/$run > $OUT/kcpbench/$run.log 2>&1
  echo "kcpbench $run: exit $? at $(( $(date +%s) - T0 )) s"
done
tar -czf $OUT/kcpbench.tgz -C $OUT kcpbench && rm -rf $OUT/kcpbench
echo "== GPU tests"; tail -4 $OUT/pytest_gpu.log
echo "== FLA"; tar -xzOf $OUT/fla.tgz fla/pytest_gpu_fla.log | tail -3; tar -xzOf $OUT/fla.tgz fla/example.log | tail -8
echo "== multi-GPU tier"; grep -E "^  [a-z_]+ +(PASS|FAIL|SKIP)|RESULT|^---|PROBLEM|multi-GPU tier on|rc " $OUT/multigpu.log | tail -40
echo "== KCP bench"; for run in seed tokens131072; do tar -xzOf $OUT/kcpbench.tgz kcpbench/$run/bench_cake_causal_conv1d_det_kcp_p2_table.txt 2>/dev/null | grep -v "^# local\|^# time\|^$" | tail -25; done
