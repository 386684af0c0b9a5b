# Device call 4 of session 18: the slot size also sets the piece size of the in-place path
# (tensors from macfleet.host_tensor: DataParallel's buckets on one Mac). At 8 ranks, 8 MiB
# (the candidate default after run3) against 4 MiB (the old one), two rounds in turn.
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/pyzmq*.whl \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
mkdir -p /tmp/run4 && cd /tmp/run4
MF="python3 -m macfleet.launcher.cli"  # not a shell function: timeout runs programs only
for round in 1 2; do
  for slot in 4 8; do
    echo "== round $round N=8 shared tensors slot ${slot}M"
    MACFLEET_SHM_SLOT_BYTES=$((slot << 20)) timeout 150 $MF bench allreduce --nproc 8 --sizes 16M,64M,256M --budget 0.5 \
      --shared-tensors --json /tmp/run4/r${round}_n8_shared_s${slot}.json 2>/dev/null | tail -3
  done
done
python3 - <<'PY' > $OUT/run4_shared_slots.json
import glob, json
print(json.dumps({p.split('/')[-1]: json.load(open(p)) for p in sorted(glob.glob('/tmp/run4/*.json'))}, indent=1))
PY
