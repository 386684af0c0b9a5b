#!/usr/bin/env bash
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
rm -rf /tmp/exp && mkdir -p /tmp/exp && tar -xf .exp/exp.tar -C /tmp/exp && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site_exp /tmp/exp 2>/dev/null || exit 1
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site_exp:/tmp/site
mkdir -p /tmp/run && cd /tmp/run
for round in 1 2; do for m in ${MODES:-old every last fastonly}; do
  echo "== $m N=4 round $round"
  X_MODE=$m python3 -m macfleet.launcher.cli bench allreduce --nproc 4 --sizes ${SIZES:-4K,16M,64M} --budget 0.7 \
    --json $OUT/mode_${m}_$round.json 2>&1 | grep -E "^ +[0-9]+(K|M) [|]"
done; done
