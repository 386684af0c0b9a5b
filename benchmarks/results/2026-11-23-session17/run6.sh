# Device call 6 of session 17: does DataParallel's communication thread contend with backward
# for cores? The large model at 4 ranks of 4 threads, its bucket thread's OpenMP team capped
# at 1 or 2 threads (MACFLEET_EXP_COMM_THREADS, an uncommitted experiment) against the default
# (4), in alternating rounds.
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
REPO=$(pwd)
mkdir -p /tmp/run6 && cd /tmp/run6
quiet() { grep -v -i "warn\|numpy\|conversion_method"; }
for round in 1 2; do
  for k in default 2 1; do
    echo "== round $round comm threads $k"
    if [ $k = default ]; then unset MACFLEET_EXP_COMM_THREADS; else export MACFLEET_EXP_COMM_THREADS=$k; fi
    timeout 150 python3 $REPO/benchmarks/train_throughput.py --nprocs 4 --device cpu --threads-per-rank 4 --steps 20 \
      --models large --json /tmp/run6/r$round-$k.json 2>&1 | quiet | tail -3
  done
done
python3 - <<'PY' > $OUT/comm_threads.json
import glob, json
print(json.dumps({p.split('/')[-1]: json.load(open(p)) for p in sorted(glob.glob('/tmp/run6/*.json'))}, indent=1))
PY
