#!/usr/bin/env bash
# A/B/C: pieces of the in-place all-reduce claimed by whichever rank is free (MACFLEET_X_CLAIM_BYTES,
# an uncommitted switch in the working tree), against the static shares. The large model, 4 threads a
# rank, rounds A B C C B A; then bench --shared-tensors at 4 ranks (no late rank) for A and B.
set -u
OUT=${OUT:-/tmp/out}
rm -rf /tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site . || exit 1
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
REPO=$(pwd)
mkdir -p /tmp/run && cd /tmp/run
claim() { case $1 in A) echo 0;; B) echo 4194304;; C) echo 2097152;; esac; }
t0=$(date +%s)
for v in A B C C B A; do
  r=1; [ -e $OUT/${v}_r1.json ] && r=2
  echo "== $v round $r $(( $(date +%s) - t0 )) s"
  MACFLEET_X_CLAIM_BYTES=$(claim $v) python3 $REPO/benchmarks/train_throughput.py --nprocs 2,4 --device cpu \
    --threads-per-rank 4 --steps 30 --models large --json $OUT/${v}_r$r.json 2>&1 | grep -E "^large +[24] (macf|ddp)"
done
for v in A B; do
  echo "== bench $v $(( $(date +%s) - t0 )) s"
  MACFLEET_X_CLAIM_BYTES=$(claim $v) python3 -m macfleet.launcher.cli bench allreduce --nproc 4 --shared-tensors \
    --sizes 16M,64M --budget 1 2>&1 | grep -E "^ +(16M|64M)"
done
echo "done $(( $(date +%s) - t0 )) s"
