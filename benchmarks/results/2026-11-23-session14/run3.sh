# Device call 3: training throughput of this session's code (carry .whl).
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
REPO=$(pwd)
mkdir -p /tmp/run && cd /tmp/run
timeout 330 python3 $REPO/benchmarks/train_throughput.py --nprocs 1,2,4 --device cpu --threads-per-rank 4 --steps 30 \
  --models cnn,large --json $OUT/train_cpu_4threads.json 2>&1 | grep -v -i "warn\|numpy\|conversion_method" | tail -14
timeout 200 python3 $REPO/benchmarks/train_throughput.py --nprocs 1,2,4 --device cuda --steps 30 --models cnn,large \
  --json $OUT/train_cuda.json 2>&1 | grep -v -i "warn\|numpy\|conversion_method" | tail -14
