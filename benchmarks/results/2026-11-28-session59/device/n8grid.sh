#!/usr/bin/env bash
# Session 59, part 3 (64 cores): N=8 private tensors through shared memory, by threads per rank and slot size.
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . \
  || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
mkdir -p /tmp/run && cd /tmp/run
mf() { python3 -m macfleet.launcher.cli "$@"; }
t0=$(date +%s)
for t in 1 2 4; do echo "== N=8 OMP_NUM_THREADS=$t"
  OMP_NUM_THREADS=$t mf bench allreduce --nproc 8 --sizes 64M,256M --budget 0.5 --json $OUT/n8_threads$t.json 2>&1 | tail -3; done
for s in 16777216 1048576; do echo "== N=8 slot $s"
  MACFLEET_SHM_SLOT_BYTES=$s mf bench allreduce --nproc 8 --sizes 64M,256M --budget 0.5 --json $OUT/n8_slot$s.json 2>&1 | tail -3; done
echo "== N=4 default"; mf bench allreduce --nproc 4 --sizes 64M,256M --budget 0.5 --json $OUT/n4.json 2>&1 | tail -3
echo "== N=2 default"; mf bench allreduce --nproc 2 --sizes 64M,256M --budget 0.5 --json $OUT/n2.json 2>&1 | tail -3
echo "all done $(( $(date +%s) - t0 )) s"
