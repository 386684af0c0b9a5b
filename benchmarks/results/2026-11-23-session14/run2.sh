# Device call 2: all-reduce tables of this session's code, N = 2, 4, 8 (carry .whl).
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
mkdir -p /tmp/run /tmp/json && cd /tmp/run
mf() { python3 -m macfleet.launcher.cli "$@"; }
for n in 2 4 8; do
  mf bench allreduce --nproc $n --sizes 4K,1M,16M,64M,256M --budget 0.5 --json /tmp/json/shm_$n.json
  mf bench allreduce --nproc $n --sizes 16M,64M,256M --budget 0.5 --shared-tensors --json /tmp/json/shared_$n.json
  MACFLEET_SHM=0 mf bench allreduce --nproc $n --sizes 4K,1M,16M,64M,256M --budget 0.5 --json /tmp/json/tcp_$n.json
done 2>&1 | grep -v -i "warn\|numpy\|conversion_method"
python3 -c "import json, glob, os; print(json.dumps({os.path.basename(p)[:-5]: json.load(open(p)) for p in sorted(glob.glob('/tmp/json/*.json'))}))" > $OUT/allreduce.json
