python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/deps .whl/*.whl >/dev/null 2>&1
for t in base new; do
  rm -rf /tmp/src_$t /tmp/site_$t; mkdir -p /tmp/src_$t && tar -xf .exp/$t.tar -C /tmp/src_$t
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site_$t /tmp/src_$t >/dev/null 2>&1 || echo "install $t failed"
done
mkdir -p /tmp/run && cd /tmp/run
mf() { v=$1; shift; PYTHONPATH=/tmp/site_$v:/tmp/deps python3 -m macfleet.launcher.cli "$@"; }
export MACFLEET_SHM=0
for n in 2 2 4 8; do for v in base new; do
  echo "== tcp N=$n $v"; mf $v bench allreduce --nproc $n --sizes 4K,64K,1M,4M,16M --budget 0.4 --json $OUT/tcp_${n}_$v.json 2>&1 | grep -E "^ *[0-9]+(K|M) "
done; done
