# Device call 3 of session 15: the all-reduce tables on this session's code (the data path is
# unchanged; the ring's handshake and address handling changed), N=2, 4, 8, three paths.
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
mkdir -p /tmp/run && cd /tmp/run
mf() { python3 -m macfleet.launcher.cli "$@"; }
for n in 2 4 8; do
  mf bench allreduce --nproc $n --sizes 4K,1M,16M,64M,256M --budget 0.5 --json /tmp/shm_$n.json > /dev/null 2>&1
  mf bench allreduce --nproc $n --sizes 16M,64M,256M --budget 0.5 --shared-tensors --json /tmp/shared_$n.json > /dev/null 2>&1
  MACFLEET_SHM=0 mf bench allreduce --nproc $n --sizes 4K,1M,16M,64M,256M --budget 0.5 --json /tmp/tcp_$n.json > /dev/null 2>&1
done
python3 - "$OUT/allreduce.json" <<'PY'
import glob, json, os, sys
merged = {os.path.basename(p)[:-5]: json.load(open(p)) for p in sorted(glob.glob("/tmp/*_[248].json"))}
json.dump(merged, open(sys.argv[1], "w"))
print(sorted(merged))
PY
