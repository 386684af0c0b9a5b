R=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/deps .whl/*.whl >/dev/null 2>&1
rm -rf /tmp/src_new /tmp/site_new; mkdir -p /tmp/src_new && tar -xf .exp/new.tar -C /tmp/src_new
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site_new /tmp/src_new >/dev/null 2>&1 || echo "install failed"
export PYTHONPATH=/tmp/site_new:/tmp/deps
python3 -c "
import os
from macfleet.shm import default_slot_bytes, shared_cache_bytes
print('cache', shared_cache_bytes(), 'slots', [default_slot_bytes(n, shared_cache_bytes(), os.cpu_count()) >> 20 for n in (2, 4, 8)])"
mkdir -p /tmp/run && cd /tmp/run
mf() { python3 -m macfleet.launcher.cli "$@"; }
for n in 2 4 8; do
  echo "== N=$n shm"; mf bench allreduce --nproc $n --sizes 4K,1M,16M,64M,256M --budget 0.5 --json $OUT/f_${n}_shm.json 2>&1 | grep -E "^ *[0-9]+(K|M) |slots"
  echo "== N=$n tcp"; MACFLEET_SHM=0 mf bench allreduce --nproc $n --sizes 4K,1M,16M,64M,256M --budget 0.5 --json $OUT/f_${n}_tcp.json 2>&1 | grep -E "^ *[0-9]+(K|M) "
done
for n in 2 4; do mf launch --nproc $n --device cuda /tmp/src_new/tests/bin/cuda_check.py > /tmp/cc_$n.log 2>&1; echo "cuda_check N=$n rc=$? false=$(grep -o '": false' /tmp/cc_$n.log | wc -l) true=$(grep -o '": true' /tmp/cc_$n.log | wc -l)"; grep -o '"oracle_max_diff[^,]*' /tmp/cc_$n.log | cut -d: -f2 | sort -g | sed -n '1p;$p' | tr '\n' ' '; echo; done
mf launch --nproc 2 --device cuda /tmp/src_new/examples/mnist/train.py --epochs 1 2>&1 | tail -2
