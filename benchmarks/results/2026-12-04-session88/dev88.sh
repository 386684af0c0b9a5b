#!/usr/bin/env bash
# Session 88 device check: the GPU path on this code, and the other-jobs note on a host with an NVIDIA GPU.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
REPO=$(pwd)
mkdir -p /tmp/run && cd /tmp/run
mf() { python3 -m macfleet.launcher.cli "$@"; }
ls /proc/driver/nvidia/gpus/ 2>&1
python3 -c "from macfleet.workers.other_jobs import gpus_here; print('gpus_here', gpus_here())"
# two jobs side by side on the GPU: the first hangs (2 ranks, auto), the second (1 rank at 0.6) says what they ask for
mf launch --nproc 2 $REPO/tests/bin/behave.py -1 hang > $OUT/first.log 2>&1 &
first=$!
for i in $(seq 1 60); do grep -q "ready pid=" $OUT/first.log && break; sleep 1; done
mf launch --nproc 1 --memory-fraction 0.6 $REPO/tests/bin/behave.py -1 none 2>&1 | grep "other macfleet job" | tee $OUT/second.txt
kill -INT $first; wait $first; echo "first exited $?"
for n in 2 4; do mf launch --nproc $n --device cuda $REPO/tests/bin/cuda_check.py; done 2>&1 | tail -12
mf launch --nproc 2 --device cuda $REPO/examples/mnist/train.py --epochs 1 2>&1 | tail -3
