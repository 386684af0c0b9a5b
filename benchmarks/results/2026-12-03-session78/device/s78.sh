#!/usr/bin/env bash
set -u
part=${1:-gpu}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
REPO=$(pwd)
mkdir -p /tmp/run && cd /tmp/run
mf() { python3 -m macfleet.launcher.cli "$@"; }
nproc; lscpu | grep -E "Model name"; python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0))"
if [ "$part" = gpu ]; then
  echo "=== cuda_check 2"; mf launch --nproc 2 --device cuda $REPO/tests/bin/cuda_check.py 2>&1 | tail -3
  echo "=== mnist cuda 2 ckpt"; rm -rf /tmp/m2; mf launch --nproc 2 --device cuda $REPO/examples/mnist/train.py --epochs 2 --train-url /tmp/m2 --checkpoint-every 40 2>&1 | tail -4
  echo "=== mnist cuda 2 resume to 3"; mf launch --nproc 2 --device cuda $REPO/examples/mnist/train.py --epochs 3 --train-url /tmp/m2 --checkpoint-every 40 --resume 2>&1 | tail -4
  python3 -c "import json; print([round(e['loss'],4) for e in json.load(open('/tmp/m2/metrics.json'))['epochs']])"
  for n in 2 4 8; do echo "=== shm $n"; mf bench allreduce --nproc $n --sizes 4K,16M,64M --budget 0.5 --json $OUT/shm_$n.json 2>&1 | tail -4; done
fi
if [ "$part" = tcp ]; then
  for n in 2 4 8; do echo "=== tcp $n"; MACFLEET_SHM=0 mf bench allreduce --nproc $n --sizes 4K,16M,64M --budget 0.5 --json $OUT/tcp_$n.json 2>&1 | tail -4; done
fi
