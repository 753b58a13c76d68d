#!/usr/bin/env bash
# Session 7's device call (2 H200s): GPU tests (tier 4) on GPU 0 beside the host-cost probe on GPU 1,
# then the 2-GPU KCP probe. Results: benchmarks/results/*_s7_*.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/env.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.device_count())" | tee -a $OUT/env.txt
(CUDA_VISIBLE_DEVICES=0 timeout 420 python3 -m pytest -q -m gpu tests -p no:cacheprovider -n 8 --tb=short --ignore=tests/multigpu --ignore=tests/test_integrations_fla.py > $OUT/pytest_gpu.log 2>&1; echo "pytest rc $?" >> $OUT/pytest_gpu.log) &
PT=$!
sleep 1
CUDA_VISIBLE_DEVICES=1 timeout 200 python3 benchmarks/tools/host_probe.py > $OUT/host_probe.log 2>&1; echo "host probe rc $?" >> $OUT/host_probe.log
wait $PT
timeout 150 torchrun --nproc-per-node 2 benchmarks/tools/kcp_probe.py > $OUT/kcp_probe.log 2>&1; echo "kcp probe rc $?" >> $OUT/kcp_probe.log
tail -30 $OUT/pytest_gpu.log
cat $OUT/host_probe.log | tail -20
grep -v "^\[" $OUT/kcp_probe.log | tail -30
