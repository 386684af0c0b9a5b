set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site_old .whl/*.whl && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site_old .exp/old || exit 1
export PYTHONUNBUFFERED=1
REPO=$(pwd)
mkdir -p /tmp/run && cd /tmp/run
nproc; lscpu | grep -E "Model name"
if [ "${PART:-ab}" = ab ]; then
for n in 2 4; do PYTHONPATH=/tmp/site python3 -m macfleet.launcher.cli launch --nproc $n --device cuda $REPO/tests/bin/cuda_check.py 2>&1 | grep -E "CUDA|rror" | head -8; done
for r in 1 2; do for v in old new; do
  site=/tmp/site; [ $v = old ] && site=/tmp/site_old
  for n in 8 2; do
    PYTHONPATH=$site python3 -m macfleet.launcher.cli bench allreduce --nproc $n --sizes 4K,1M,16M --budget 0.5 --json $OUT/ab_${v}_${n}_r$r.json 2>&1 | grep -E "^ +(4K|1M|16M)" | sed "s/^/$v n=$n r$r /"
  done
done; done
fi
if [ "${PART:-ab}" = train ]; then
for v in new old; do
  site=/tmp/site; [ $v = old ] && site=/tmp/site_old
  PYTHONPATH=$site python3 $REPO/benchmarks/train_throughput.py --nprocs ${NS:-1,4} --device cpu --models large,deep --threads-per-rank 4 --steps 40 \
    --json $OUT/train_${v}.json 2>&1 | grep -v Warning | sed "s/^/$v /"
done
fi
