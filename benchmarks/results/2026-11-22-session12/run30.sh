set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site_old .whl/*.whl && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site_old .exp/old || exit 1
export PYTHONUNBUFFERED=1
REPO=$(pwd)
mkdir -p /tmp/run && cd /tmp/run
nproc; lscpu | grep -E "Model name"
L="python3 -m macfleet.launcher.cli launch"
if [ "${PART:-ab}" = ab ]; then
for n in 2 4; do PYTHONPATH=/tmp/site $L --nproc $n --device cuda $REPO/tests/bin/cuda_check.py 2>&1 | grep -E "CUDA|rror" | head -8; done
PYTHONPATH=/tmp/site $L --nproc 2 --device cuda $REPO/tests/bin/dp_cases.py lazy /dev/null 2>&1 | grep "ConfigError:" | head -1
PYTHONPATH=/tmp/site $L --nproc 2 --device cuda $REPO/examples/mnist/train.py --epochs 1 --train-url /tmp/m2 2>&1 | tail -3
PYTHONPATH=/tmp/site $L --nproc 4 --device cuda $REPO/examples/mnist/train.py --epochs 1 --train-url /tmp/m4 2>&1 | tail -3
for r in 1 2; do for v in new old; do
  site=/tmp/site; [ $v = old ] && site=/tmp/site_old
  for shm in 1 0; do
    MACFLEET_SHM=$shm PYTHONPATH=$site python3 -m macfleet.launcher.cli bench allreduce --nproc 4 --sizes 4K,1M,16M --budget 0.5 --json $OUT/ab_${v}_shm${shm}_r$r.json 2>&1 | grep -E "^ +(4K|1M|16M)" | sed "s/^/$v shm=$shm r$r /"
  done
done; done
fi
if [ "${PART:-ab}" = train ]; then
for r in 1; do for v in new old; do
  site=/tmp/site; [ $v = old ] && site=/tmp/site_old
  PYTHONPATH=$site python3 $REPO/benchmarks/train_throughput.py --nprocs 4 --device cpu --models large,cnn --threads-per-rank 4 --steps 30 \
    --json $OUT/train_${v}_r$r.json 2>&1 | grep -v Warning | sed "s/^/$v r$r /"
done; done
fi
if [ "${AB3:-0}" = 1 ]; then
for r in 1 2 3; do for v in old new; do
  site=/tmp/site; [ $v = old ] && site=/tmp/site_old
  MACFLEET_SHM=0 PYTHONPATH=$site python3 -m macfleet.launcher.cli bench allreduce --nproc 4 --sizes 4K,16M --budget 0.5 --json $OUT/ab3_${v}_shm0_r$r.json 2>&1 | grep -E "^ +(4K|1M|16M)" | sed "s/^/$v shm=0 r$r /"
done; done
fi
