# Device call 7 of session 17: private tensors through shared memory at 8 ranks ran 40-50%
# slower in run 4 than in session 15, gloo the same. The machine, or the new turns? The old
# worker (85f6b22's, back to back, printing its rows) and the new one, alternating.
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
REPO=$(pwd)
cd /tmp
for round in 1 2; do
  echo "== round $round old"
  timeout 100 python3 -m macfleet.launcher.cli launch --nproc 8 $REPO/benchmarks/results/2026-11-23-session17/old_bench.py --sizes 64M,256M --budget 0.5 \
    2>&1 | grep OLD
  echo "== round $round new"
  timeout 100 python3 -m macfleet.launcher.cli bench allreduce --nproc 8 --sizes 64M,256M --budget 0.5 2>&1 | grep -E "^ +[0-9]"
done
