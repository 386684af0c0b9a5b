#!/usr/bin/env bash
# The large model's wait after backward, split into "behind" (waiting for the rank whose backward
# ends last) and "tail" (that rank's own wait): train_throughput.py on the CPU, 4 threads a rank,
# two rounds; then one round at 3 threads a rank (a core a rank left to the exchange).
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . \
  || exit 1
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
REPO=$(pwd)
mkdir -p /tmp/run && cd /tmp/run
lscpu | grep -E "Model name|^CPU\(s\)|L3" > $OUT/lscpu.txt
t0=$(date +%s)
for r in 1 2; do
  echo "== round $r, 4 threads $(( $(date +%s) - t0 )) s"
  python3 $REPO/benchmarks/train_throughput.py --nprocs 1,2,4 --device cpu --threads-per-rank 4 --steps 30 \
    --models large,cnn --json $OUT/t4_r$r.json 2>&1 | grep -E "^(large|cnn|model) "
done
echo "== 3 threads $(( $(date +%s) - t0 )) s"
python3 $REPO/benchmarks/train_throughput.py --nprocs 1,4 --device cpu --threads-per-rank 3 --steps 30 \
  --models large --json $OUT/t3.json 2>&1 | grep -E "^(large|model) "
echo "done $(( $(date +%s) - t0 )) s"
