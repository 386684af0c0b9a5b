# Device call 5 of session 17: mid sizes over sockets at 4 and 8 ranks, where macfleet was
# 0.6-0.7x gloo at 1 MiB in every session: the ring on one part (default), the one-pass
# latency path up to 4 MiB (MACFLEET_SMALL_BYTES), and the ring on both directions from
# smaller tensors (MACFLEET_MIN_PART_BYTES=65536).
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 MACFLEET_SHM=0
mkdir -p /tmp/run5 && cd /tmp/run5
quiet() { grep -v -i "warn\|numpy\|conversion_method"; }
bench() {  # name nproc args...
  local name=$1 n=$2; shift 2
  echo "== $name N=$n"
  timeout 200 python3 -m macfleet.launcher.cli bench allreduce --nproc $n --budget 0.3 --json /tmp/run5/$name-$n.json \
    --sizes 256K,512K,1M,2M,4M "$@" 2>&1 | quiet | tail -5
}
for round in 1 2; do
  for n in 4 8; do
    bench default-r$round $n
    MACFLEET_SMALL_BYTES=4194304 bench onepass-r$round $n
    MACFLEET_MIN_PART_BYTES=65536 bench twoparts-r$round $n
  done
done
python3 - <<'PY' > $OUT/midsizes.json
import glob, json
print(json.dumps({p.split('/')[-1]: json.load(open(p)) for p in sorted(glob.glob('/tmp/run5/*.json'))}, indent=1))
PY
