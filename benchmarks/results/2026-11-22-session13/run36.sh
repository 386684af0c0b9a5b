set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
REPO=$(pwd)
mkdir -p /tmp/run && cd /tmp/run
nproc; nvidia-smi -L
mf() { python3 -m macfleet.launcher.cli "$@"; }
mf launch --nproc 2 --device cuda $REPO/tests/bin/cuda_check.py 2>&1 | grep -E "CUDA" | cut -c1-200
mf launch --nproc 2 --device cuda $REPO/examples/mnist/train.py --epochs 1 --train-url /tmp/m2 2>&1 | tail -3
python3 $REPO/benchmarks/train_throughput.py --nprocs 1,2 --device cuda --steps 30 --models cnn,large --ddp-backend nccl --json $OUT/train_nccl_2gpu.json 2>&1 | grep -v Warn | tail -8
python3 $REPO/benchmarks/train_throughput.py --nprocs 1,2 --device cuda --steps 30 --models cnn,large --json $OUT/train_gloo_2gpu.json 2>&1 | grep -v Warn | tail -8
