#!/usr/bin/env bash
# Session 59, part 4 (64 cores, 8 threads a rank): N=8 private tensors, slots of 4 (default), 8 and 16 MiB, twice each, interleaved.
set -u
OUT=${OUT:-/tmp/out}
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
mkdir -p /tmp/run && cd /tmp/run
mf() { python3 -m macfleet.launcher.cli "$@"; }
for round in 1 2; do for s in 4194304 8388608 16777216; do echo "== round $round slot $s"
  MACFLEET_SHM_SLOT_BYTES=$s mf bench allreduce --nproc 8 --sizes 16M,64M,256M --budget 0.5 --json $OUT/n8_r${round}_slot$s.json 2>&1 | tail -4; done; done
