python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/deps .whl/*.whl >/dev/null 2>&1
for v in base new; do
  rm -rf /tmp/src_$v /tmp/site_$v; mkdir -p /tmp/src_$v && tar -xf .exp/$v.tar -C /tmp/src_$v
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site_$v /tmp/src_$v >/dev/null 2>&1 || echo "install $v failed"
done
R=$(pwd)
mkdir -p /tmp/run && cd /tmp/run
for round in 1 2; do
  for v in base new; do
    for n in 2 4; do
      echo "== round $round $v N=$n"
      PYTHONPATH=/tmp/site_$v:/tmp/deps python3 -m macfleet.launcher.cli launch --nproc $n --device cuda --timeline /tmp/t.json $R/.exp/large_mps.py 2>&1 | grep -v "^\[rank\|timeline:" | tail -1
      python3 $R/.exp/tl_spread.py /tmp/t.json | tail -1
    done
  done
done
PYTHONPATH=/tmp/site_new:/tmp/deps python3 -m macfleet.launcher.cli launch --nproc 2 --device cuda /tmp/src_new/tests/bin/cuda_check.py > /tmp/cc.log 2>&1; echo "cuda_check new N=2 rc=$? false=$(grep -o '": false' /tmp/cc.log | wc -l) true=$(grep -o '": true' /tmp/cc.log | wc -l)"; grep -o '"oracle_max_diff[^,]*training_thread[^,]*' /tmp/cc.log | head -8
