# run from the repository root on the device machine, with .whl/ (pyzmq, msgpack wheels) and
# .exp/old = `git archive 9bcb413 | tar -x -C .exp/old` (the code before this session's change) carried along
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
cp -r /tmp/site /tmp/site_old
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site . || exit 1
(cd .exp/old && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site_old .) || exit 1
REPO=$(pwd); mkdir -p /tmp/run && cd /tmp/run
export PYTHONUNBUFFERED=1 MACFLEET_SHM=0
for k in 1 2; do
  for v in old new; do
    site=/tmp/site; [ $v = old ] && site=/tmp/site_old
    PYTHONPATH=$site python3 $REPO/benchmarks/collectives.py --nprocs 2,4,8 --sizes 256,64K,1M,4M,16M --budget 0.3 --json $OUT/bcast_${v}_$k.json > $OUT/bcast_${v}_$k.txt 2>&1 || tail -20 $OUT/bcast_${v}_$k.txt
  done
done
for f in $OUT/bcast_*.txt; do echo "== $f"; grep broadcast $f; done
