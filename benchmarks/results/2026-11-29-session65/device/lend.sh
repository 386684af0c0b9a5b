#!/usr/bin/env bash
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . \
  || exit 1
rm -rf /tmp/site_old && cp -r /tmp/site /tmp/site_old && cp .exp/old/macfleet/*.py /tmp/site_old/macfleet/
rm -rf /tmp/site_nolend && cp -r /tmp/site /tmp/site_nolend && sed -i 's/^LEND_BYTES = 1 << 20/LEND_BYTES = 0/' /tmp/site_nolend/macfleet/buckets.py
grep -n "^LEND_BYTES" /tmp/site_nolend/macfleet/buckets.py /tmp/site/macfleet/buckets.py
export PYTHONUNBUFFERED=1
REPO=$(pwd); mkdir -p /tmp/run && cd /tmp/run
t0=$(date +%s)
for r in 1 2; do for v in new nolend old; do
  S=/tmp/site; [ $v = old ] && S=/tmp/site_old; [ $v = nolend ] && S=/tmp/site_nolend
  echo "== $v round $r $(( $(date +%s) - t0 )) s"
  PYTHONPATH=$S timeout 200 python3 $REPO/benchmarks/train_throughput.py --nprocs 4 --device cpu --threads-per-rank 4 \
    --steps 40 --models many,cnn --json $OUT/lend_${v}_$r.json 2>&1 | grep -E "^(many|cnn) "
done; done
echo "== done $(( $(date +%s) - t0 )) s"
