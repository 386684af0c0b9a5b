#!/usr/bin/env bash
# Session 59, part 7 (64 cores): where a rank of the large model's DataParallel job spends its step, N=4 of 4 threads.
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . \
  || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
REPO=$(pwd)
mkdir -p /tmp/run && cd /tmp/run
python3 -m pip install -q --no-index --no-deps --target /tmp/pyspy $REPO/.whl/prof/*.whl; SPY=/tmp/pyspy/bin/py-spy; ls -la $SPY
mf() { python3 -m macfleet.launcher.cli "$@"; }
mf launch --nproc 4 $REPO/.exp/large_loop.py bare 100 2>&1 | grep "rank 0" | tail -2
mf launch --nproc 4 $REPO/.exp/large_loop.py dp 450 > $OUT/dp.log 2>&1 &
sleep 20
pids=$(ps -eo pid,args | grep "bootstrap.*large_loop" | grep -v grep | awk '{print $1}' | head -2)
echo "ranks: $pids"
n=0; for p in $pids; do $SPY record -p $p -d 10 -r 200 --threads --idle -f raw -o $OUT/idle_$n.txt > $OUT/pyspy_$n.log 2>&1 & n=$((n+1)); done
sleep 11
p=$(echo $pids | awk '{print $1}')
$SPY record -p $p -d 8 -r 200 --threads --gil -f raw -o $OUT/gil_0.txt > $OUT/pyspy_gil.log 2>&1
wait
grep "rank 0" $OUT/dp.log | tail -3
ls -la $OUT
