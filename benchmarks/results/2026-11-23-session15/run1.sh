# Device call 1 of session 15: the GPU path with this session's DataParallel (buckets laid out
# again after a model changes), MNIST on CUDA, and training throughput (no regression).
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
REPO=$(pwd)
mkdir -p /tmp/run && cd /tmp/run
mf() { python3 -m macfleet.launcher.cli "$@"; }
quiet() { grep -v -i "warn\|numpy\|conversion_method"; }
for n in 2 4; do timeout 120 python3 -m macfleet.launcher.cli launch --nproc $n --device cuda $REPO/tests/bin/cuda_check.py 2>&1 | quiet | grep -E "CUDA|Error|failed" | head -6; done
timeout 120 python3 -m macfleet.launcher.cli launch --nproc 2 --device cuda $REPO/examples/mnist/train.py --epochs 1 --train-url /tmp/mnist2 2>&1 | quiet | tail -3
timeout 300 python3 $REPO/benchmarks/train_throughput.py --nprocs 1,2,4 --device cpu --threads-per-rank 4 --steps 30 \
  --models cnn,large --json $OUT/train_cpu_4threads.json 2>&1 | quiet | tail -14
timeout 150 python3 $REPO/benchmarks/train_throughput.py --nprocs 2,4 --device cuda --steps 30 --models cnn,large \
  --json $OUT/train_cuda.json 2>&1 | quiet | tail -10
