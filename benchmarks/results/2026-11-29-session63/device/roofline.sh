#!/usr/bin/env bash
# Session 63 on the device machine: the machine's ceilings (benchmarks/roofline.py) and the
# all-reduce against gloo, in one run, twice over, so each ratio sits beside its ceiling.
# Usage there, from the repo root with the pyzmq wheel in .whl/: bash THIS
set -u
OUT=${OUT:-/tmp/out}
RES=/tmp/res; mkdir -p $RES  # every JSON, one tar into $OUT at the end
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . \
  || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
REPO=$(pwd)
mkdir -p /tmp/run && cd /tmp/run  # not the repo root, whose macfleet/ folder would shadow the install
mf() { python3 -m macfleet.launcher.cli "$@"; }
nproc; lscpu | grep -E "Model name|Thread|Core|Socket|L3|NUMA node"
for round in 1 2; do
  python3 $REPO/benchmarks/roofline.py --nprocs 2,4,8 --json $RES/roofline_$round.json
  for n in 8 4; do
    mf bench allreduce --nproc $n --sizes 16M,64M,256M --budget 1 --json $RES/shm_${n}_$round.json
    MACFLEET_SHM=0 mf bench allreduce --nproc $n --sizes 16M,64M,256M --budget 1 --json $RES/tcp_${n}_$round.json
  done
done
tar -C $RES -cf $OUT/roofline.tar .
