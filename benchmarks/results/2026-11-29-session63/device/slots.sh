#!/usr/bin/env bash
# Session 63, second run: benchmarks/roofline.py with the slots' passes counted, beside the
# all-reduce through shared memory against gloo, twice over. Usage there: bash THIS
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
for round in 1 2; do
  python3 $REPO/benchmarks/roofline.py --nprocs 2,4,8 --json $RES/roofline_$round.json
  for n in 8 4 2; do
    mf bench allreduce --nproc $n --sizes 16M,64M,256M --budget 1 --json $RES/shm_${n}_$round.json
  done
done
tar -C $RES -cf $OUT/slots.tar .
