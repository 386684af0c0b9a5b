# run from the repository root on the device machine, with .whl/ and .exp/old (git archive 11205d8) carried
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
cp -r /tmp/site /tmp/site_old
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site . || exit 1
(cd .exp/old && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site_old .) || exit 1
REPO=$(pwd); mkdir -p /tmp/run && cd /tmp/run
export PYTHONUNBUFFERED=1 MACFLEET_SHM=0
nproc
for k in 1 2; do
  for v in old new; do
    site=/tmp/site; [ $v = old ] && site=/tmp/site_old
    PYTHONPATH=$site timeout 280 python3 $REPO/benchmarks/collectives.py --nprocs 2,3,4,8 --sizes 256,4K,64K,1M --budget 0.3 --json $OUT/bcast_${v}_$k.json > $OUT/bcast_${v}_$k.txt 2>&1 || tail -20 $OUT/bcast_${v}_$k.txt
  done
done
for f in $OUT/bcast_*.txt; do echo "== $f"; grep -E "^broadcast|^all_gather" $f; done
