set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/old .exp/oldwhl/*.whl 2>&1 | tail -2
mkdir -p /tmp/run && cp -r benchmarks .exp /tmp/run/ && cd /tmp/run
for v in new old new old; do
  if [ $v = old ]; then PP=/tmp/old:/tmp/site; else PP=/tmp/site; fi
  echo "== $v"
  PYTHONPATH=$PP timeout 55 python3 benchmarks/train_throughput.py --nprocs 2,4 --device cpu --threads-per-rank 4 --steps 40 --models many 2>&1 | grep -v -i "numpy\|share of each\|^\[rank\|conversion_method"
done 2>&1 | tee $OUT/tt_lend.log
