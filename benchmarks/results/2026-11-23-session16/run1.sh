# Device call 1 of session 16: the GPU checks (now with torch.compile of the wrapper, inductor
# on CUDA), the example on CUDA, and training throughput on CPU (DataParallel's forward changed:
# its bookkeeping goes through a check for torch.compile's tracing).
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
REPO=$(pwd)
mkdir -p /tmp/run && cd /tmp/run
quiet() { grep -v -i "warn\|numpy\|conversion_method"; }
for n in 2 4; do
  timeout 300 python3 -m macfleet.launcher.cli launch --nproc $n --device cuda $REPO/tests/bin/cuda_check.py 2>&1 \
    | quiet | tee $OUT/cuda_check_$n.log | grep -E "CUDA|Error|failed" | head -8
done
timeout 120 python3 -m macfleet.launcher.cli launch --nproc 2 --device cuda $REPO/examples/mnist/train.py --epochs 1 \
  --train-url /tmp/mnist2 2>&1 | quiet | tail -2
timeout 240 python3 $REPO/benchmarks/train_throughput.py --nprocs 1,2,4 --device cpu --threads-per-rank 4 --steps 30 \
  --models cnn,large --json $OUT/train_cpu_4threads.json 2>&1 | quiet | tail -12
