# Device call 2 of session 17: two-member rings over sockets, 4 parts (the default) against 2
# (MACFLEET_STREAMS=1), in alternating rounds since this machine's timings drift between runs;
# then py-spy on 16 MiB all-reduces at 2 ranks.
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
REPO=$(pwd)
mkdir -p /tmp/run2 && cd /tmp/run2
quiet() { grep -v -i "warn\|numpy\|conversion_method"; }
export MACFLEET_SHM=0
for round in 1 2 3; do
  for s in auto 1; do
    echo "== round $round streams $s"
    if [ $s = auto ]; then unset MACFLEET_STREAMS; else export MACFLEET_STREAMS=$s; fi
    timeout 120 python3 -m macfleet.launcher.cli bench allreduce --nproc 2 --sizes 8M,16M,32M,64M --budget 0.3 \
      --json /tmp/run2/r$round-s$s.json 2>&1 | quiet | tail -4
  done
done
unset MACFLEET_STREAMS
python3 - <<'PY' > $OUT/ab_streams.json
import glob, json
print(json.dumps({p.split('/')[-1]: json.load(open(p)) for p in sorted(glob.glob('/tmp/run2/*.json'))}))
PY
SPY=$(find /tmp/site -name py-spy -type f | head -1); echo "py-spy at: $SPY"
[ -n "$SPY" ] && chmod +x $SPY && LOOP_S=4 timeout 60 $SPY record --subprocesses --threads --idle -r 300 -f raw \
  -o $OUT/spy_idle.txt -- python3 -m macfleet.launcher.cli launch --nproc 2 $REPO/benchmarks/results/2026-11-23-session17/loop16.py 2>&1 | quiet | tail -4
ls -la $OUT
