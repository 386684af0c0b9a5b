# Device call 4 (experiment, code in .exp, not committed): the communication thread's OpenMP
# team size during DataParallel's overlap, large model, 4 ranks of 4 threads. Carry .whl, .exp.
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site .exp || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
REPO=$(pwd)
mkdir -p /tmp/run /tmp/json && cd /tmp/run
for round in 1 2; do for k in 4 2 1; do
  echo "== comm threads $k, round $round"
  MACFLEET_COMM_THREADS=$k timeout 120 python3 $REPO/benchmarks/train_throughput.py --nprocs 4 --device cpu \
    --threads-per-rank 4 --steps 30 --models large --json /tmp/json/comm${k}_$round.json 2>&1 | grep -E "^large"
done; done
python3 -c "import json, glob, os; print(json.dumps({os.path.basename(p)[:-5]: json.load(open(p)) for p in sorted(glob.glob('/tmp/json/*.json'))}))" > $OUT/comm_threads.json
