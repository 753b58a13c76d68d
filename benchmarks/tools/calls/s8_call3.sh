#!/usr/bin/env bash
# Session 8's third device call (2 H200s), side by side (correctness only, no timings but FLA's example):
#   GPU tests (tier 4) on GPU 0, 4 xdist workers;  the FLA drop-in's GPU tests and example on GPU 1;
#   the multi-GPU tier's part 2 (a rank that fails inside a KCP call; NCCL, both GPUs), then its part 1b.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/env.txt
python3 -m pip install -q --no-index --no-deps --target /tmp/fla .fla/*.whl && FLAPATH=/tmp/fla
(CUDA_VISIBLE_DEVICES=0 timeout 430 python3 -m pytest -q -m gpu tests -p no:cacheprovider -n 4 --tb=short -rf \
   --ignore=tests/multigpu --ignore=tests/test_integrations_fla.py > $OUT/pytest_gpu.log 2>&1; echo "pytest rc $? at $(( $(date +%s) - T0 )) s" >> $OUT/pytest_gpu.log) &
(mkdir -p $OUT/fla; export CUDA_VISIBLE_DEVICES=1 PYTHONPATH=$PYTHONPATH:$FLAPATH
 timeout 300 python3 -m pytest -q -m gpu tests/test_integrations_fla.py -p no:cacheprovider -rA --tb=short > $OUT/fla/pytest_gpu_fla.log 2>&1; echo "rc $? at $(( $(date +%s) - T0 )) s" >> $OUT/fla/pytest_gpu_fla.log
 timeout $(( 440 - ($(date +%s) - T0) )) python3 examples/train_fla_model.py --steps 200 --out $OUT/fla > $OUT/fla/example.log 2>&1; echo "rc $? at $(( $(date +%s) - T0 )) s" >> $OUT/fla/example.log) &
timeout 250 python3 tests/multigpu/kcp_failure.py > $OUT/multigpu_part2.log 2>&1; echo "part 2 rc $? at $(( $(date +%s) - T0 )) s" >> $OUT/multigpu_part2.log
timeout 150 python3 -m torch.distributed.run --standalone --nproc-per-node 4 tests/multigpu/kcp_nccl.py --only subgroup --procs-per-gpu 2 > $OUT/multigpu_part1b.log 2>&1; echo "part 1b rc $? at $(( $(date +%s) - T0 )) s" >> $OUT/multigpu_part1b.log
wait
tar -czf $OUT/fla.tgz -C $OUT fla && rm -rf $OUT/fla
echo "== part 2"; grep -E "^---|PROBLEM|RESULT|rc " $OUT/multigpu_part2.log
echo "== part 1b"; grep -E "^  [a-z_]+ +(PASS|FAIL|SKIP)|RESULT|rc " $OUT/multigpu_part1b.log
echo "== GPU tests"; grep -E "^FAILED|passed|failed|rc " $OUT/pytest_gpu.log | tail -8
echo "== FLA"; tar -xzOf $OUT/fla.tgz fla/pytest_gpu_fla.log | grep -E "^(PASSED|FAILED|ERROR)|passed|failed|rc " | tail -20; tar -xzOf $OUT/fla.tgz fla/example.log | tail -6
