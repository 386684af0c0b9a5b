#!/usr/bin/env bash
# old (HEAD before doorbells) against new (working tree), on the device machine
set -u
OUT=${OUT:-/tmp/out}
REPO=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site_new . || exit 1
mkdir -p /tmp/old && tar -xf .exp/old.tar -C /tmp/old && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site_old /tmp/old || exit 1
export PYTHONUNBUFFERED=1
mkdir -p /tmp/run && cd /tmp/run
nproc; lscpu | grep -E "Model name"
part=${1:-wake}
for round in 1 2; do
for v in old new; do
  export PYTHONPATH=/tmp/site_$v:/tmp/site
  if [ "$part" = wake ]; then
    echo "== $v round $round"
    python3 -m macfleet.launcher.cli launch --nproc 2 $REPO/.exp/wake2.py 2>&1 | grep waited | cut -c1-140
    [ $round = 1 ] && python3 -m macfleet.launcher.cli launch --nproc 4 $REPO/.exp/idlecpu.py 2>&1 | grep waited
    python3 $REPO/benchmarks/train_throughput.py --nprocs 2,4 --device cpu --threads-per-rank 4 --steps 60 --models cnn \
      --json $OUT/cnn_${v}_$round.json 2>&1 | tail -12
  else
    python3 $REPO/benchmarks/train_throughput.py --nprocs 4 --device cpu --threads-per-rank 4 --steps 30 --models large \
      --json $OUT/large_${v}_$round.json 2>&1 | tail -6
  fi
done
done
