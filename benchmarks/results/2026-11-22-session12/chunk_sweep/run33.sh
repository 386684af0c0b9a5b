set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . || exit 1
export PYTHONUNBUFFERED=1
mkdir -p /tmp/run && cd /tmp/run
B="python3 -m macfleet.launcher.cli bench allreduce"
for r in 1 2; do
for n in 4 2; do
  for c in 4194304 1048576 524288 262144; do
    for zc in 1048576 $c; do
      [ $r = 2 ] && [ $zc != $c ] && [ $c != 4194304 ] && continue
      MACFLEET_SHM=0 MACFLEET_CHUNK_BYTES=$c MACFLEET_ZERO_COPY_BYTES=$zc PYTHONPATH=/tmp/site $B --nproc $n --sizes 1M,16M,64M --budget 0.4 --json $OUT/sweep_n${n}_c${c}_z${zc}_r$r.json 2>&1 | grep -E "^ +(1M|16M|64M)" | sed "s/^/r$r n=$n chunk=$c zc=$zc /"
    done
  done
done
done
