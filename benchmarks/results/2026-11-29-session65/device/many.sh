#!/usr/bin/env bash
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . \
  || exit 1
rm -rf /tmp/site_old && cp -r /tmp/site /tmp/site_old && cp .exp/old/macfleet/*.py /tmp/site_old/macfleet/
export PYTHONUNBUFFERED=1
REPO=$(pwd); mkdir -p /tmp/run && cd /tmp/run
t0=$(date +%s)
for v in new old new; do
  if [ $v = old ]; then S=/tmp/site_old; else S=/tmp/site; fi
  echo "== train_throughput $v $(( $(date +%s) - t0 )) s"
  PYTHONPATH=$S timeout 280 python3 $REPO/benchmarks/train_throughput.py --nprocs 2,4 --device cpu --threads-per-rank 4 \
    --steps 30 --models many,cnn --json $OUT/many_${v}_$(date +%s).json 2>&1 | grep -E "^(many|cnn|model) "
done
echo "== done $(( $(date +%s) - t0 )) s"
