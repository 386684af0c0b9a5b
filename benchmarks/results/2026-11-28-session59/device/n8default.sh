#!/usr/bin/env bash
# Session 59, part 5 (64 cores): N=8 and N=4 with the new default slots, private and shared tensors, twice.
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . \
  || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
mkdir -p /tmp/run && cd /tmp/run
mf() { python3 -m macfleet.launcher.cli "$@"; }
python3 -c "from macfleet.shm import default_slot_bytes as d, shared_cache_bytes as c; import os; print('slots', [d(n, c(), os.cpu_count())>>20 for n in (2,4,8)], 'MiB')"
for round in 1 2; do echo "== round $round N=8"
  mf bench allreduce --nproc 8 --sizes 16M,64M,256M --budget 0.5 --json $OUT/n8_new_r$round.json 2>&1 | tail -4; done
echo "== N=8 shared tensors"; mf bench allreduce --nproc 8 --sizes 16M,64M,256M --budget 0.5 --shared-tensors --json $OUT/n8_new_shared.json 2>&1 | tail -4
echo "== N=4"; mf bench allreduce --nproc 4 --sizes 16M,64M,256M --budget 0.5 --json $OUT/n4_new.json 2>&1 | tail -4
