#!/usr/bin/env bash
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . \
  || exit 1
rm -rf /tmp/site2 && cp -r /tmp/site /tmp/site2 && cp .exp/instr/macfleet/collectives.py /tmp/site2/macfleet/collectives.py
export PYTHONUNBUFFERED=1
REPO=$(pwd)
mkdir -p /tmp/run && cd /tmp/run
lscpu | grep -E "Model name|^CPU\(s\)|L3"
for n in 2 4; do
  for r in 1 2; do
    PYTHONPATH=/tmp/site2 STEPS=600 timeout 200 python3 -m macfleet.launcher.cli launch --nproc $n $REPO/.exp/dev/cnnbreak.py 2>&1 | grep -v "^\[rank [1-9]"
  done
done
