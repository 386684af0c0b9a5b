set -u
OUT=${OUT:-/tmp/out}
for s in site_old site_old2; do [ -d /tmp/$s/macfleet ] || { python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/$s .whl/*.whl && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/$s .exp/old || exit 1; }; done
[ -d /tmp/site/macfleet ] || { python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . || exit 1; }
export PYTHONUNBUFFERED=1
mkdir -p /tmp/run && cd /tmp/run
for r in 1 2 3; do for v in old old2 new; do
  site=/tmp/site_$v; [ $v = new ] && site=/tmp/site
  MACFLEET_SHM=0 PYTHONPATH=$site python3 -m macfleet.launcher.cli bench allreduce --nproc 4 --sizes 16M --budget 0.5 --json $OUT/ab4_${v}_shm0_r$r.json 2>&1 | grep -E "^ +(4K|1M|16M)" | sed "s/^/$v shm=0 r$r /"
done; done
