R=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/deps .whl/*.whl >/dev/null 2>&1
rm -rf /tmp/src_new /tmp/site_new; mkdir -p /tmp/src_new && tar -xf .exp/new.tar -C /tmp/src_new
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site_new /tmp/src_new >/dev/null 2>&1 || echo "install failed"
export PYTHONPATH=/tmp/site_new:/tmp/deps
mkdir -p /tmp/run && cd /tmp/run
mf() { python3 -m macfleet.launcher.cli "$@"; }
for n in 4 8; do for s in default 8M; do
  if [ $s = default ]; then unset MACFLEET_SHM_SLOT_BYTES; else export MACFLEET_SHM_SLOT_BYTES=$s; fi
  echo "== N=$n slot $s"; mf launch --nproc $n $R/.exp/shmphase.py 64 2>&1 | grep "rank" | sort | sed 's/.*\] //'
done; done
unset MACFLEET_SHM_SLOT_BYTES
echo "== N=8 OMP 1"; mf launch --nproc 8 --env OMP_NUM_THREADS=1 $R/.exp/shmphase.py 64 2>&1 | grep rank | sort | sed 's/.*\] //'
echo "== N=8 bench 8M"; MACFLEET_SHM_SLOT_BYTES=8M mf bench allreduce --nproc 8 --sizes 16M,64M,256M --budget 0.5 2>&1 | grep -E "^ *[0-9]+(K|M) "
echo "== N=8 bench default"; mf bench allreduce --nproc 8 --sizes 16M,64M,256M --budget 0.5 2>&1 | grep -E "^ *[0-9]+(K|M) "
echo "== N=8 bench OMP1"; mf bench allreduce --nproc 8 --env OMP_NUM_THREADS=1 --sizes 16M,64M,256M --budget 0.5 2>&1 | grep -E "^ *[0-9]+(K|M) "
