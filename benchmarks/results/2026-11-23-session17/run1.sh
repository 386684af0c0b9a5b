# Device call 1 of session 17: why a 16 MiB all-reduce over sockets costs more than a quarter
# of a 64 MiB one. Sweeps of the ring's knobs around 16 MiB, then py-spy on a loop of 16 MiB
# all-reduces at 2 ranks (on-CPU samples and GIL holders).
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 PATH=/tmp/site/bin:$PATH
REPO=$(pwd)
mkdir -p /tmp/run && cd /tmp/run
quiet() { grep -v -i "warn\|numpy\|conversion_method"; }
bench() {  # name, nproc, extra args... (env set by caller)
  local name=$1 n=$2; shift 2
  echo "== $name N=$n $(env | grep -E '^MACFLEET_|^OMP_NUM' | tr '\n' ' ')"
  timeout 120 python3 -m macfleet.launcher.cli bench allreduce --nproc $n --sizes 16M,64M --budget 0.3 \
    --json /tmp/run/$name-$n.json "$@" 2>&1 | quiet | tail -5
}
export MACFLEET_SHM=0
for n in 2 4 8; do
  bench default $n
  MACFLEET_INLINE_BYTES=1G bench inline $n
  MACFLEET_STREAMS=1 bench streams1 $n
  MACFLEET_STREAMS=2 bench streams2 $n
  MACFLEET_ZERO_COPY_BYTES=1G bench copysend $n
  OMP_NUM_THREADS=1 bench omp1 $n
done
python3 - <<'PY' > $OUT/sweep.json
import glob, json
print(json.dumps({p.split('/')[-1]: json.load(open(p)) for p in sorted(glob.glob('/tmp/run/*.json'))}))
PY
for mode in cpu gil; do
  flag=""; [ $mode = gil ] && flag="--gil"
  LOOP_S=4 timeout 60 py-spy record $flag --subprocesses --threads -r 400 -f raw -o $OUT/spy_$mode.txt -- \
    python3 -m macfleet.launcher.cli launch --nproc 2 $REPO/benchmarks/results/2026-11-23-session17/loop16.py 2>&1 | quiet | tail -5
done
