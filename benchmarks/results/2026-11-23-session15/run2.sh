# Device call 2 of session 15: the GPU checks again (run1's used a shell function under
# timeout), then the session's start (.old, 409f3dc) against this code, in turns, on the cnn
# model at N=2 and 4 on CPU, where per-step overhead of DataParallel's forward shows most.
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site_old .whl/*.whl \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site_old ./.old || exit 1
export PYTHONUNBUFFERED=1
REPO=$(pwd)
mkdir -p /tmp/run && cd /tmp/run
quiet() { grep -v -i "warn\|numpy\|conversion_method"; }
export PYTHONPATH=/tmp/site
for n in 2 4; do timeout 120 python3 -m macfleet.launcher.cli launch --nproc $n --device cuda $REPO/tests/bin/cuda_check.py 2>&1 | quiet | grep -E "CUDA|Error|failed" | head -6; done
timeout 120 python3 -m macfleet.launcher.cli launch --nproc 2 --device cuda $REPO/examples/mnist/train.py --epochs 1 --train-url /tmp/mnist2 2>&1 | quiet | tail -2
for round in 1 2; do
  for code in old new; do
    if [ $code = old ]; then export PYTHONPATH=/tmp/site_old; B=$REPO/.old/benchmarks; else export PYTHONPATH=/tmp/site; B=$REPO/benchmarks; fi
    echo "== $code round $round"
    timeout 100 python3 $B/train_throughput.py --nprocs 2,4 --device cpu --threads-per-rank 4 --steps 40 \
      --models cnn --json $OUT/ab_${code}_$round.json 2>&1 | quiet | grep macfleet
  done
done
