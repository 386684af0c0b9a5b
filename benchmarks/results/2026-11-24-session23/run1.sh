#!/usr/bin/env bash
# Session 23, one call: the GPU path after this session's changes (no ring of all ranks with
# shared memory; all-gathers across Macs through the hosts' ring; a message from a later
# collective is an error), then all-reduce and the small collectives on one host at 8 ranks,
# where 72 idle ZeroMQ threads (9 per rank) are gone.
set -u
OUT=${OUT:-/tmp/out}
bash benchmarks/device_run.sh gpu 2>&1 | grep -v "Failed to initialize NumPy\|_conversion_method_template" | tail -60
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
REPO=$(pwd)
cd /tmp/run
python3 -m macfleet.launcher.cli bench allreduce --nproc 8 --sizes 4K,16M,64M --budget 0.5 --json $OUT/allreduce_shm_8.json 2>/dev/null
python3 -m macfleet.launcher.cli bench allreduce --nproc 8 --sizes 16M,64M --budget 0.5 --shared-tensors --json $OUT/allreduce_shared_8.json 2>/dev/null
python3 $REPO/benchmarks/collectives.py --nprocs 4,8 --sizes 256,64K,1M --budget 0.3 --json $OUT/collectives.json 2>/dev/null
