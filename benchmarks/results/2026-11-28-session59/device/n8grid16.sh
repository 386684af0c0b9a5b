#!/usr/bin/env bash
# Session 59, part 6 (16 cores): N=8 private tensors, slots of 4 (default), 8 and 16 MiB, twice, interleaved; one thread a rank at 4 MiB.
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . \
  || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
mkdir -p /tmp/run && cd /tmp/run
mf() { python3 -m macfleet.launcher.cli "$@"; }
nproc; lscpu | grep -E "Model name|L3"
python3 -c "from macfleet.shm import default_slot_bytes as d, shared_cache_bytes as c; import os; print('slots', [d(n, c(), os.cpu_count())>>20 for n in (2,4,8)], 'MiB')"
for round in 1 2; do for s in 4194304 8388608 16777216; do echo "== round $round slot $s"
  MACFLEET_SHM_SLOT_BYTES=$s mf bench allreduce --nproc 8 --sizes 16M,64M,256M --budget 0.5 --json $OUT/n8_16c_r${round}_slot$s.json 2>&1 | tail -3; done; done
echo "== one thread a rank, 4 MiB"; OMP_NUM_THREADS=1 mf bench allreduce --nproc 8 --sizes 16M,64M,256M --budget 0.5 --json $OUT/n8_16c_1thread.json 2>&1 | tail -3
