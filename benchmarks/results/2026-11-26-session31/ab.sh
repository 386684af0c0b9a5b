set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/old .whl/*.whl >/dev/null 2>&1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/old ./.exp/old >/dev/null 2>&1
python3 -m pip install -q --no-index --no-deps --target /tmp/new .whl/*.whl >/dev/null 2>&1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/new . >/dev/null 2>&1
mkdir -p /tmp/ab && cd /tmp
for round in 1 2; do for v in old new; do for n in 2 4; do for shm in 1 0; do
  PYTHONPATH=/tmp/$v MACFLEET_SHM=$shm python3 -m macfleet.launcher.cli bench allreduce --nproc $n --sizes 4K,64K,1M --budget 0.5 --json /tmp/ab/ab_${v}_${n}_shm${shm}_$round.json >/dev/null 2>&1 || echo "fail $v $n $shm"
done; done; done; done
tar -C /tmp -cf $OUT/ab.tar ab
