#!/usr/bin/env bash
# Session 59, part 2 (64 cores): the large model's scaling on the CPU, and N=8 all-reduces, on a host with room.
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . \
  || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
REPO=$(pwd)
mkdir -p /tmp/run && cd /tmp/run
mf() { python3 -m macfleet.launcher.cli "$@"; }
t0=$(date +%s)
python3 $REPO/benchmarks/train_throughput.py --nprocs 1,2,4 --device cpu --threads-per-rank 4 --steps 40 \
  --models large --json $OUT/train_cpu64_4threads.json 2>&1 | tail -10
echo "train done $(( $(date +%s) - t0 )) s"
mf bench allreduce --nproc 8 --sizes 16M,64M,256M --budget 1 --json $OUT/allreduce_shm_8.json 2>&1 | tail -5
mf bench allreduce --nproc 8 --sizes 16M,64M,256M --budget 1 --shared-tensors --json $OUT/allreduce_shared_8.json 2>&1 | tail -5
MACFLEET_SHM=0 mf bench allreduce --nproc 8 --sizes 16M,64M,256M --budget 1 --json $OUT/allreduce_tcp_8.json 2>&1 | tail -5
echo "all done $(( $(date +%s) - t0 )) s"
