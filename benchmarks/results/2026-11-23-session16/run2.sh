# Device call 2 of session 16 (run from a scratch folder): the session's HEAD (.old) against a
# change that left gradient copies into the buckets to the communication thread, in turns.
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site_old .whl/*.whl \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site_old ./.old || exit 1
export PYTHONUNBUFFERED=1
REPO=$(pwd)
cd /tmp
quiet() { grep -v -i "warn\|numpy\|conversion_method"; }
for round in 1 2; do
  for code in old new; do
    if [ $code = old ]; then export PYTHONPATH=/tmp/site_old; B=$REPO/.old/benchmarks; else export PYTHONPATH=/tmp/site; B=$REPO/benchmarks; fi
    echo "== $code round $round"
    timeout 130 python3 $B/train_throughput.py --nprocs 1,2,4 --device cpu --threads-per-rank 4 --steps 30 \
      --models large --json $OUT/ab_${code}_$round.json 2>&1 | quiet | grep -E "macfleet|ddp"
  done
done
