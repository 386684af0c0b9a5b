#!/usr/bin/env bash
# Session 22, second call: the GPU path (benchmarks/device_run.sh gpu), then the SyncBatchNorm
# model on the GPU against DDP on gloo with torch's SyncBatchNorm, this code and 715d4c5's.
set -u
OUT=${OUT:-/tmp/out}
bash benchmarks/device_run.sh gpu 2>&1 | tail -40
cp -r /tmp/site /tmp/site_old && rm -rf /tmp/site_old/macfleet* \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site_old ./.old \
  || exit 1
REPO=$(pwd)
cd /tmp/run
for v in new old; do
  site=/tmp/site; [ $v = old ] && site=/tmp/site_old
  PYTHONPATH=$site python3 $REPO/benchmarks/train_throughput.py --nprocs 1,2,4 --device cuda --models bn --steps 30 \
    --json $OUT/train_bn_cuda_$v.json
done
