set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site
mkdir -p /tmp/run && cp -r benchmarks .exp /tmp/run/ && cd /tmp/run
{
for v in "" "OMP_WAIT_POLICY=PASSIVE" "OMP_WAIT_POLICY=PASSIVE GOMP_SPINCOUNT=10000" "OMP_WAIT_POLICY=PASSIVE GOMP_SPINCOUNT=100000"; do
  env $v timeout 100 python3 .exp/spin.py cnn,many,large 4,8 2>&1 | grep "step ms"
done
} 2>&1 | tee $OUT/spin.log
for v in "" "GOMP_SPINCOUNT=10000" "GOMP_SPINCOUNT=100000"; do
  echo "== launch env: ${v:-(agent default: OMP_WAIT_POLICY=PASSIVE)}"
  env $v timeout 150 python3 benchmarks/train_throughput.py --nprocs 1,2,4 --device cpu --threads-per-rank 4 --steps 30 --models cnn,many,large 2>&1 | grep -v -i "numpy\|share of each\|^\[rank"
done 2>&1 | tee $OUT/tt.log
