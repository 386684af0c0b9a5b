# Device call 4 of session 17: the all-reduce tables again, the libraries taking turns in blocks
# of 8 calls (each block after an untimed call), every path and rank count.
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
mkdir -p /tmp/run4 && cd /tmp/run4
lscpu | grep -E "Model name|cache|^CPU\(s\)|NUMA" > $OUT/lscpu.txt
quiet() { grep -v -i "warn\|numpy\|conversion_method"; }
bench() {  # name nproc args...
  local name=$1 n=$2; shift 2
  echo "== $name N=$n"
  timeout 200 python3 -m macfleet.launcher.cli bench allreduce --nproc $n --budget 0.5 --json /tmp/run4/$name-$n.json "$@" \
    2>&1 | quiet | tail -6
}
for n in 2 4 8; do
  bench shm $n --sizes 4K,1M,16M,64M,256M
  bench shared $n --sizes 16M,64M,256M --shared-tensors
  MACFLEET_SHM=0 bench tcp $n --sizes 4K,1M,16M,64M,256M
done
python3 - <<'PY' > $OUT/allreduce.json
import glob, json
print(json.dumps({p.split('/')[-1]: json.load(open(p)) for p in sorted(glob.glob('/tmp/run4/*.json'))}, indent=1))
PY
