set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site_old .whl/*.whl && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site_old .exp/old || exit 1
export PYTHONUNBUFFERED=1
mkdir -p /tmp/run && cd /tmp/run
nproc
B="python3 -m macfleet.launcher.cli bench allreduce"
for r in 1 2 3; do for v in old new; do
  site=/tmp/site; [ $v = old ] && site=/tmp/site_old
  MACFLEET_SHM=0 PYTHONPATH=$site $B --nproc 2 --sizes 4K,64K,256K,1M --budget 0.5 --json $OUT/pair_${v}_r$r.json 2>&1 | grep -E "^ +[0-9]" | sed "s/^/$v r$r /"
done; done
for r in 1 2; do for sb in 0 8388608; do
  env_sb=""; [ $sb != 0 ] && env_sb="MACFLEET_SMALL_BYTES=$sb"
  env $env_sb MACFLEET_SHM=0 PYTHONPATH=/tmp/site $B --nproc 2 --sizes 1M,2M,4M,8M --budget 0.5 --json $OUT/cross_${sb}_r$r.json 2>&1 | grep -E "^ +[0-9]" | sed "s/^/small=$sb r$r /"
done; done
