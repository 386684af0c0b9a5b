#!/usr/bin/env bash
# The CNN probe, old (98e9b37) and new in turns, then train_throughput (new, old, new)
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . \
  || exit 1
rm -rf /tmp/site_old && cp -r /tmp/site /tmp/site_old && cp .exp/old/macfleet/*.py /tmp/site_old/macfleet/
export PYTHONUNBUFFERED=1
REPO=$(pwd)
mkdir -p /tmp/run && cd /tmp/run
t0=$(date +%s)
for n in 2 4; do
  for r in 1 2; do
    for v in old new; do
      if [ $v = old ]; then S=/tmp/site_old; else S=/tmp/site; fi
      echo "== probe N=$n round $r $v $(( $(date +%s) - t0 )) s"
      PYTHONPATH=$S STEPS=600 timeout 200 python3 -m macfleet.launcher.cli launch --nproc $n $REPO/.exp/dev/cnnbreak.py 2>&1 | grep -E "  (mf|ddp|bare) |tail"
    done
  done
done
for v in new old new; do
  if [ $v = old ]; then S=/tmp/site_old; else S=/tmp/site; fi
  echo "== train_throughput $v $(( $(date +%s) - t0 )) s"
  PYTHONPATH=$S timeout 300 python3 $REPO/benchmarks/train_throughput.py --nprocs 2,4 --device cpu --threads-per-rank 4 \
    --steps 30 --models large,cnn --json $OUT/tt_${v}_$(date +%s).json 2>&1 | grep -E "^(large|cnn|model) "
done
echo "== done $(( $(date +%s) - t0 )) s"
