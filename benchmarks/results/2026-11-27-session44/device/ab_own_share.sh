R=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/deps .whl/*.whl >/dev/null 2>&1
for t in base new; do
  rm -rf /tmp/src_$t /tmp/site_$t; mkdir -p /tmp/src_$t && tar -xf .exp/$t.tar -C /tmp/src_$t
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site_$t /tmp/src_$t >/dev/null 2>&1 || echo "install $t failed"
done
nproc; lscpu | grep -iE "Model name|cache"
for d in /sys/devices/system/cpu/cpu0/cache/index*; do echo "$d level=$(cat $d/level) type=$(cat $d/type) size=$(cat $d/size) shared=$(cat $d/shared_cpu_list)"; done
mkdir -p /tmp/run && cd /tmp/run
mf() { v=$1; shift; PYTHONPATH=/tmp/site_$v:/tmp/deps python3 -m macfleet.launcher.cli "$@"; }
for r in 1 2; do for n in 2 4 8; do for v in base new; do
  echo "== r$r N=$n $v"; mf $v bench allreduce --nproc $n --sizes 16M,64M,256M --budget 0.3 --json $OUT/ab_${n}_${v}_$r.json 2>&1 | grep -E "^ *[0-9]+(K|M) "
done; done; done
