#!/usr/bin/env bash
# all-reduce: old (504814b, before doorbells) against new (HEAD), in turns
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
for v in old new; do
  rm -rf /tmp/t_$v && mkdir -p /tmp/t_$v && tar -xf .exp/$v.tar -C /tmp/t_$v && \
    python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site2_$v /tmp/t_$v 2>/dev/null || exit 1
done
export PYTHONUNBUFFERED=1
mkdir -p /tmp/run && cd /tmp/run
for round in 1 2; do for n in ${NS:-4 8}; do for v in old new; do
  echo "== $v N=$n round $round"
  PYTHONPATH=/tmp/site2_$v:/tmp/site python3 -m macfleet.launcher.cli bench allreduce --nproc $n --sizes ${SIZES:-4K,16M,64M} --budget 0.7 \
    --json $OUT/ab_${v}_${n}_$round.json 2>&1 | grep -E "^ +[0-9]+(K|M) [|]"
done; done; done
