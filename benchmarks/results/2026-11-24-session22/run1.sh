#!/usr/bin/env bash
# Session 22 on the device machine: broadcast and all-gather through shared memory (against
# the ring over sockets they took before, which MACFLEET_SHM=0 still takes, and against gloo),
# and the SyncBatchNorm model's training step with this code and with 715d4c5's (.old/).
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . \
  && cp -r /tmp/site /tmp/site_old && rm -rf /tmp/site_old/macfleet* \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site_old ./.old \
  || exit 1
export PYTHONUNBUFFERED=1
REPO=$(pwd)
mkdir -p /tmp/run && cd /tmp/run
nproc; python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0))"
PYTHONPATH=/tmp/site_old python3 -c "import macfleet.shm as s; print('old has shm all_gather:', hasattr(s.LocalGroup, 'all_gather'))"
PYTHONPATH=/tmp/site python3 -c "import macfleet.shm as s; print('new has shm all_gather:', hasattr(s.LocalGroup, 'all_gather'))"
collectives() {
  PYTHONPATH=/tmp/site python3 $REPO/benchmarks/collectives.py --nprocs 2,4,8 --json $OUT/collectives_shm_$1.json
  PYTHONPATH=/tmp/site MACFLEET_SHM=0 python3 $REPO/benchmarks/collectives.py --nprocs 2,4,8 --json $OUT/collectives_tcp_$1.json
}
collectives 1
# 715d4c5's SyncBatchNorm fails alone beside a gloo group on the CPU (fixed in fd78274): no N=1 for it
PYTHONPATH=/tmp/site python3 $REPO/benchmarks/train_throughput.py --nprocs 1,2,4,8 --device cpu --threads-per-rank 2 \
  --models bn --steps 20 --json $OUT/train_bn_cpu_new.json
PYTHONPATH=/tmp/site_old python3 $REPO/benchmarks/train_throughput.py --nprocs 2,4,8 --device cpu --threads-per-rank 2 \
  --models bn --steps 20 --json $OUT/train_bn_cpu_old.json
collectives 2
