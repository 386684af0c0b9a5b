#!/usr/bin/env bash
# A/B: A = the last commit (.exp/old: `git archive bfe261a`, without tests/ and benchmarks/results/), B = the
# working tree with device/copy_off_thread.diff applied. The large model on the CPU, 4 threads a rank.
set -u
OUT=${OUT:-/tmp/out}
MODELS=${MODELS:-large,deep}; STEPS=${STEPS:-30}; NPROCS=${NPROCS:-1,2,4}; ROUNDS=${ROUNDS:-2}
for v in A B; do
  src=.; [ $v = A ] && src=.exp/old
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site$v .whl/*.whl \
    && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site$v $src \
    || exit 1
done
export PYTHONUNBUFFERED=1
REPO=$(pwd)
mkdir -p /tmp/run && cd /tmp/run
nproc; lscpu | grep -E "Model name|Thread|Core|L3"
t0=$(date +%s)
for r in $(seq 1 $ROUNDS); do for v in A B; do
  [ $r = 2 ] && [ $v = A ] && continue  # round 2 goes B first: each version once first
  echo "== $v round $r $(( $(date +%s) - t0 )) s"
  PYTHONPATH=/tmp/site$v python3 $REPO/benchmarks/train_throughput.py --nprocs $NPROCS --device cpu --threads-per-rank 4 \
    --steps $STEPS --models $MODELS --json $OUT/${v}_r$r.json 2>&1 | grep -E "^(large|deep|cnn) "
done; [ $r = 2 ] && { echo "== A round 2"; PYTHONPATH=/tmp/siteA python3 $REPO/benchmarks/train_throughput.py --nprocs $NPROCS --device cpu --threads-per-rank 4 \
    --steps $STEPS --models $MODELS --json $OUT/A_r2.json 2>&1 | grep -E "^(large|deep|cnn) "; }; done
echo "done $(( $(date +%s) - t0 )) s"
