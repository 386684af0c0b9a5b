# Device call 1: the session's start (.old = 2c7b889) against this session's code, in turns;
# then the GPU checks. Carry .whl and .old.
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/old .old \
  || exit 1
export PYTHONUNBUFFERED=1
REPO=$(pwd)
mkdir -p /tmp/run && cd /tmp/run
nproc; lscpu | grep -E "Model name|L3"; nvidia-smi -L
new() { PYTHONPATH=/tmp/site python3 -m macfleet.launcher.cli "$@"; }
old() { PYTHONPATH=/tmp/old:/tmp/site python3 -m macfleet.launcher.cli "$@"; }
for round in 1 2; do
  for n in 4 8; do
    for code in old new; do
      $code bench allreduce --nproc $n --sizes 4K,16M,64M --budget 0.5 --json $OUT/ab_shm_${n}_${code}_$round.json | tail -3
      MACFLEET_SHM=0 $code bench allreduce --nproc $n --sizes 4K,16M,64M --budget 0.5 --json $OUT/ab_tcp_${n}_${code}_$round.json | tail -3
    done
  done
done 2>&1 | grep -v -i "warn\|numpy\|conversion_method"
export PYTHONPATH=/tmp/site
mf() { python3 -m macfleet.launcher.cli "$@"; }
for n in 2 4; do mf launch --nproc $n --device cuda $REPO/tests/bin/cuda_check.py 2>&1 | grep -E "CUDA|Error|error" | cut -c1-300; done
mf launch --nproc 2 --device cuda $REPO/examples/mnist/train.py --epochs 1 --train-url /tmp/mnist2 2>&1 | grep -v -i "warn\|numpy\|conversion" | tail -4
mf launch --nproc 2 --device cuda $REPO/examples/mnist/train.py --epochs 1 --amp 2>&1 | grep -v -i "warn\|numpy\|conversion" | tail -3
