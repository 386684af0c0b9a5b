# Device call 1 of session 18: scaling and wait with cores left for communication. With
# --threads-per-rank 4 at N=4 the ranks' compute takes all 16 cores, and the averaging must
# take cores from backward; on a Mac the GPU computes and the CPU's cores are free for it.
# --threads-per-rank 3 leaves 4 cores free at N=4 (and the N=1 base is 3 threads too).
# Two rounds, K=4 and K=3 in alternating order; then K=2 once.
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/pyzmq*.whl \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
REPO=$(pwd)
mkdir -p /tmp/run1 && cd /tmp/run1
quiet() { grep -v -i "warn\|numpy\|conversion_method"; }
go() {  # round, threads, models
  echo "== round $1 threads-per-rank $2 models $3"
  timeout 200 python3 $REPO/benchmarks/train_throughput.py --nprocs 1,2,4 --device cpu --threads-per-rank $2 \
    --steps 20 --models $3 --json /tmp/run1/r$1-k$2.json 2>&1 | quiet | tail -14
}
go 1 4 large,deep
go 1 3 large,deep
go 2 3 large,deep
go 2 4 large,deep
go 3 2 large
python3 - <<'PY' > $OUT/run1_threads.json
import glob, json
print(json.dumps({p.split('/')[-1]: json.load(open(p)) for p in sorted(glob.glob('/tmp/run1/*.json'))}, indent=1))
PY
