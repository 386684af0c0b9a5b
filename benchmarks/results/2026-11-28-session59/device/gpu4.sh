#!/usr/bin/env bash
# Session 59, part 1 (4 H200, 64 cores): the default memory share with one rank per GPU and with
# ranks sharing one GPU; the MNIST example on 4 GPUs; training throughput with one process per GPU.
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . \
  || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
REPO=$(pwd)
mkdir -p /tmp/run && cd /tmp/run
mf() { python3 -m macfleet.launcher.cli "$@"; }
{ nproc; lscpu | grep -E "Model name|L3|NUMA node\(s\)|Socket"; nvidia-smi -L; nvidia-smi topo -m | head -6
  python3 -c "import torch; print(torch.__version__, torch.cuda.device_count())"; } 2>&1 | tee $OUT/machine.txt
t0=$(date +%s)
{ echo "== 4 ranks, one per GPU"; mf launch --nproc 4 --device cuda $REPO/tests/bin/cuda_check.py
  echo "== 2 ranks sharing GPU 0"; CUDA_VISIBLE_DEVICES=0 mf launch --nproc 2 --device cuda $REPO/tests/bin/cuda_check.py
  echo "== 8 ranks, two per GPU"; mf launch --nproc 8 --device cuda $REPO/tests/bin/cuda_check.py
} > $OUT/cuda_check.log 2>&1
echo "cuda_check done $(( $(date +%s) - t0 )) s"; grep -c '"memory_share_by_ranks_on_gpu": true' $OUT/cuda_check.log
mf launch --nproc 4 --device cuda $REPO/examples/mnist/train.py --epochs 1 > $OUT/mnist4gpu.log 2>&1; tail -3 $OUT/mnist4gpu.log
echo "mnist done $(( $(date +%s) - t0 )) s"
python3 $REPO/benchmarks/train_throughput.py --nprocs 1,2,4 --device cuda --steps 30 --models cnn,large \
  --json $OUT/train_gloo_4gpu.json 2>&1 | tail -9
python3 $REPO/benchmarks/train_throughput.py --nprocs 1,2,4 --device cuda --steps 30 --models cnn,large \
  --ddp-backend nccl --json $OUT/train_nccl_4gpu.json 2>&1 | tail -9
echo "all done $(( $(date +%s) - t0 )) s"
