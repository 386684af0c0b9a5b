set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
REPO=$(pwd)
mkdir -p /tmp/run && cd /tmp/run
nproc; lscpu | grep -E "Model name"
mf() { python3 -m macfleet.launcher.cli "$@"; }
S=4K,1M,16M,64M,256M
if [ "${PART}" = allreduce ]; then
for n in ${NPROCS:-2 4 8}; do
  mf bench allreduce --nproc $n --sizes $S --budget 0.5 --json $OUT/allreduce_shm_$n.json 2>&1 | grep -E "^ +[0-9]" | sed "s/^/shm n=$n /"
  mf bench allreduce --nproc $n --sizes 16M,64M,256M --budget 0.5 --shared-tensors --json $OUT/allreduce_shared_$n.json 2>&1 | grep -E "^ +[0-9]" | sed "s/^/shared n=$n /"
  MACFLEET_SHM=0 mf bench allreduce --nproc $n --sizes $S --budget 0.5 --json $OUT/allreduce_tcp_$n.json 2>&1 | grep -E "^ +[0-9]" | sed "s/^/tcp n=$n /"
done
fi
if [ "${PART}" = gpu ]; then
for n in 2 4; do mf launch --nproc $n --device cuda $REPO/tests/bin/cuda_check.py 2>&1 | grep -E "CUDA|rror|false" | head -8; done
mf launch --nproc 2 --device cuda --log-dir /tmp/logs --show-ranks 0 $REPO/examples/mnist/train.py --epochs 1 --train-url /tmp/m2 2>&1 | tail -4
ls /tmp/logs; tail -2 /tmp/logs/rank-1.log
python3 $REPO/benchmarks/train_throughput.py --nprocs 1,2,4 --device cuda --steps 30 --models cnn,large --json $OUT/train_cuda.json 2>&1 | grep -v Warn | tail -8
python3 $REPO/benchmarks/train_throughput.py --nprocs 1,2,4 --device cpu --threads-per-rank 4 --steps 30 --models large,cnn --json $OUT/train_cpu_4threads.json 2>&1 | grep -v Warn | tail -11
fi
