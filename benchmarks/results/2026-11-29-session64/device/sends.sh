#!/usr/bin/env bash
# A/B over TCP: A = the last commit (.exp/old), B = the working tree (a send tries before it polls;
# frames say whether more follow). Rounds A B B A at 2 and 4 ranks; then B with 1 MiB chunks at 4 ranks.
set -u
OUT=${OUT:-/tmp/out}
for v in A B; do
  src=.; [ $v = A ] && src=.exp/old
  rm -rf /tmp/site$v
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site$v .whl/*.whl \
    && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site$v $src || exit 1
done
export PYTHONUNBUFFERED=1 MACFLEET_SHM=0
mkdir -p /tmp/run && cd /tmp/run
t0=$(date +%s)
for v in A B B A; do
  for n in 2 4; do
    echo "== $v N=$n $(( $(date +%s) - t0 )) s"
    PYTHONPATH=/tmp/site$v python3 -m macfleet.launcher.cli bench allreduce --nproc $n --sizes 4K,1M,16M --budget 0.6 \
      2>&1 | grep -E "^ +(4K|1M|16M)"
  done
done
echo "== B chunk 1M N=4 $(( $(date +%s) - t0 )) s"
PYTHONPATH=/tmp/siteB python3 -m macfleet.launcher.cli bench allreduce --nproc 4 --sizes 16M --budget 0.6 \
  --env MACFLEET_CHUNK_BYTES=1048576 2>&1 | grep -E "^ +16M"
echo "done $(( $(date +%s) - t0 )) s"
