R=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/deps .whl/*.whl >/dev/null 2>&1
for t in base gather new; do
  mkdir -p /tmp/src_$t && tar -xf .exp/$t.tar -C /tmp/src_$t
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site_$t /tmp/src_$t >/dev/null 2>&1 || echo "install $t failed"
done
mkdir -p /tmp/run && cd /tmp/run
bn() { PYTHONPATH=/tmp/site_$1:/tmp/deps python3 /tmp/src_$1/benchmarks/train_throughput.py "${@:2}" 2>&1 | grep -E "^bn" ; }
for t in base gather new new gather base; do echo "== cpu N=4 $t"; bn $t --nprocs 4 --models bn --threads-per-rank 4 --steps 40 --json $OUT/bn_cpu_$t.json; done
for t in base new; do echo "== cuda N=2 $t"; bn $t --nprocs 2 --models bn --device cuda --steps 40; done
cd /tmp/run && PYTHONPATH=/tmp/site_new:/tmp/deps python3 -m macfleet.launcher.cli launch --nproc 2 --device cuda /tmp/src_new/tests/bin/cuda_check.py 2>&1 | grep -o '"oracle_max_diff_sync_batch_norm[^,]*' | head -4
