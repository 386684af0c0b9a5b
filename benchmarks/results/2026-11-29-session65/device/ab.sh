#!/usr/bin/env bash
# A/B of the old (HEAD) and the new (working tree) macfleet on the CNN probe, in turns
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . \
  || exit 1
rm -rf /tmp/site_old && cp -r /tmp/site /tmp/site_old && cp .exp/old/macfleet/*.py /tmp/site_old/macfleet/
export PYTHONUNBUFFERED=1
REPO=$(pwd)
mkdir -p /tmp/run && cd /tmp/run
for n in ${NS:-2 4}; do
  for r in 1 2; do
    for v in old new; do
      if [ $v = old ]; then S=/tmp/site_old; else S=/tmp/site; fi
      echo "== N=$n round $r $v"
      PYTHONPATH=$S STEPS=${STEPS:-600} timeout 200 python3 -m macfleet.launcher.cli launch --nproc $n $REPO/.exp/dev/cnnbreak.py 2>&1 | grep -E "  (mf|ddp|bare) |tail"
    done
  done
done
