#!/usr/bin/env bash
# A/B of the late rank's share: A = the last commit (.exp/old: `git archive HEAD` of the package), B = the
# working tree, where a rank that reaches an in-place all-reduce over 1 ms after all the others reduces no share
# of it. The large model on the CPU, 4 threads a rank, rounds A B B A; then bench --shared-tensors, A and B.
set -u
OUT=${OUT:-/tmp/out}
for v in A B; do
  src=.; [ $v = A ] && src=.exp/old
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site$v .whl/*.whl \
    && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site$v $src \
    || exit 1
done
export PYTHONUNBUFFERED=1
REPO=$(pwd)
mkdir -p /tmp/run && cd /tmp/run
t0=$(date +%s)
for v in A B B A; do
  r=1; [ -e $OUT/${v}_r1.json ] && r=2
  echo "== $v round $r $(( $(date +%s) - t0 )) s"
  PYTHONPATH=/tmp/site$v python3 $REPO/benchmarks/train_throughput.py --nprocs ${NPROCS:-2,4} --device cpu \
    --threads-per-rank 4 --steps ${STEPS:-30} --models large --json $OUT/${v}_r$r.json 2>&1 | grep -E "^large "
done
for v in A B; do
  echo "== bench $v $(( $(date +%s) - t0 )) s"
  PYTHONPATH=/tmp/site$v python3 -m macfleet.launcher.cli bench allreduce --nproc 4 --shared-tensors \
    --sizes 16M,64M --budget 1 2>&1 | grep -E "^ +(16M|64M)"
done
echo "done $(( $(date +%s) - t0 )) s"
