python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/deps .whl/*.whl >/dev/null 2>&1
rm -rf /tmp/src_new /tmp/site_new; mkdir -p /tmp/src_new && tar -xf .exp/new.tar -C /tmp/src_new
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site_new /tmp/src_new >/dev/null 2>&1 || echo "install failed"
export PYTHONPATH=/tmp/site_new:/tmp/deps
R=$(pwd)
mkdir -p /tmp/run && cd /tmp/run
mf() { python3 -m macfleet.launcher.cli "$@"; }
for n in 2; do mf launch --nproc $n --device cuda /tmp/src_new/tests/bin/cuda_check.py > /tmp/cc_$n.log 2>&1; echo "cuda_check N=$n rc=$? false=$(grep -o '": false' /tmp/cc_$n.log | wc -l) true=$(grep -o '": true' /tmp/cc_$n.log | wc -l)"; done
mf launch --nproc 2 --device cuda --timeline $OUT/mnist_cuda.json /tmp/src_new/examples/mnist/train.py --epochs 1 2>&1 | tail -3
python3 -c "import json; d=json.load(open('$OUT/mnist_cuda.json')); print('mnist events', len(d))"
for n in 2 4; do
  mf launch --nproc $n --device cuda --timeline $OUT/large_cuda_$n.json $R/.exp/large_tl.py 2>&1 | tail -2
  python3 $R/.exp/tl_summary.py $OUT/large_cuda_$n.json | grep "rank 0"
done
mf launch --nproc 4 --device cpu --timeline $OUT/large_cpu_4.json $R/.exp/large_tl.py 2>&1 | tail -2
python3 $R/.exp/tl_summary.py $OUT/large_cpu_4.json | grep "rank 0"
