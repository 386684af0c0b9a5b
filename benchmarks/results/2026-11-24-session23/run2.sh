#!/usr/bin/env bash
# Session 23, after review: the ring over sockets (MACFLEET_SHM=0), where the transport's
# receive check changed, side by side against gloo, this code and 2b99bca's (.old), in turns.
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/pyzmq*.whl \
  && cp -r /tmp/site /tmp/site_old \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site_old ./.old \
  || exit 1
mkdir -p /tmp/run && cd /tmp/run
for round in 1 2; do for v in new old; do
  site=/tmp/site; [ $v = old ] && site=/tmp/site_old
  for n in 2 4; do
    PYTHONPATH=$site MACFLEET_SHM=0 python3 -m macfleet.launcher.cli bench allreduce --nproc $n \
      --sizes 4K,1M,16M,64M --budget 0.5 --json $OUT/tcp_${v}_${n}_r$round.json 2>/dev/null | tail -5
  done
done; done
