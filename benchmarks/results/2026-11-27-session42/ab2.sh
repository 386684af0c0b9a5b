R=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/deps .whl/*.whl >/dev/null 2>&1
for t in base gather new; do
  rm -rf /tmp/src_$t /tmp/site_$t; mkdir -p /tmp/src_$t && tar -xf .exp/$t.tar -C /tmp/src_$t
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site_$t /tmp/src_$t >/dev/null 2>&1 || echo "install $t failed"
done
mkdir -p /tmp/run && cd /tmp/run
bn() { PYTHONPATH=/tmp/site_$1:/tmp/deps python3 /tmp/src_$1/benchmarks/train_throughput.py "${@:2}" 2>&1 | grep -E "^bn|Error|error" ; }
for t in gather new new gather; do echo "== cpu N=4 $t"; bn $t --nprocs 4 --models bn --threads-per-rank 4 --steps 40; done
for t in base new new base; do echo "== cuda N=2 $t"; bn $t --nprocs 2 --models bn --device cuda --steps 40; done
echo "== cuda N=4 new"; bn new --nprocs 4 --models bn --device cuda --steps 40
for n in 2 4; do PYTHONPATH=/tmp/site_new:/tmp/deps python3 -m macfleet.launcher.cli launch --nproc $n --device cuda /tmp/src_new/tests/bin/cuda_check.py 2>&1 | grep -o '"oracle_max_diff_sync_batch_norm[^,]*\|Error.*' | sort | uniq -c; done
