#!/usr/bin/env bash
# Session 63: over TCP at 16 MiB, the ring's chunk and inline adds against the default, in turns.
# Usage there: bash THIS
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . \
  || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 MACFLEET_SHM=0
mkdir -p /tmp/run && cd /tmp/run
mf() { python3 -m macfleet.launcher.cli "$@"; }
variant() { case $1 in default) echo "";; chunk1M) echo "--env MACFLEET_CHUNK_BYTES=1048576";;
  inline) echo "--env MACFLEET_INLINE_BYTES=4194304";; esac; }
for r in 1 2 3; do for v in default chunk1M inline; do
  echo "== N=4 $v round $r"
  mf bench allreduce --nproc 4 --sizes 16M,64M --budget 1 $(variant $v) 2>&1 | grep -E "^ +(16M|64M)"
done; done
for r in 1 2; do for v in default chunk1M inline; do
  echo "== N=8 $v round $r"
  mf bench allreduce --nproc 8 --sizes 16M --budget 1 $(variant $v) 2>&1 | grep -E "^ +16M"
done; done
