#!/usr/bin/env bash
# Over TCP at 4 ranks: more parts (MACFLEET_STREAMS) with and without single-thread adds, in turns with the default.
set -u
OUT=${OUT:-/tmp/out}
[ -d /tmp/site/macfleet ] || { python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site . || exit 1; }
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 MACFLEET_SHM=0
mkdir -p /tmp/run && cd /tmp/run
mf() { python3 -m macfleet.launcher.cli "$@"; }
variant() { case $1 in default) echo "";; s2) echo "--env MACFLEET_STREAMS=2";;
  s2inline) echo "--env MACFLEET_STREAMS=2 --env MACFLEET_INLINE_BYTES=4194304";;
  s3inline) echo "--env MACFLEET_STREAMS=3 --env MACFLEET_INLINE_BYTES=4194304";; esac; }
t0=$(date +%s)
for r in 1 2 3; do for v in default s2 s2inline s3inline; do
  echo "== N=4 $v round $r $(( $(date +%s) - t0 )) s"
  mf bench allreduce --nproc 4 --sizes 16M,64M --budget 1 $(variant $v) 2>&1 | grep -E "^ +(16M|64M)|rror"
done; done
for r in 1 2; do for v in default s2inline; do
  echo "== N=8 $v round $r $(( $(date +%s) - t0 )) s"
  mf bench allreduce --nproc 8 --sizes 16M --budget 1 $(variant $v) 2>&1 | grep -E "^ +16M|rror"
done; done
