#!/usr/bin/env bash
# Timelines of the large model on the CPU (the launcher's 4 threads a rank at N=4), and what
# happens after the last rank's backward ends (tail.py).
set -u
OUT=${OUT:-/tmp/out}
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
[ -d /tmp/site/macfleet ] || { python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site . || exit 1; }
R=$(pwd)
mkdir -p /tmp/run && cd /tmp/run
for k in 1 2; do
  for n in 4 2; do
    python3 -m macfleet.launcher.cli launch --nproc $n --device cpu --timeline $OUT/large_cpu_${n}_$k.json $R/.exp/s64/large_tl.py 2>&1 | tail -1
    echo "== N=$n run $k"; python3 $R/.exp/s64/tail.py $OUT/large_cpu_${n}_$k.json
  done
done
