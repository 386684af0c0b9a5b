# Device call 3 of session 18: the shared-memory slot per rank between the measured ones. At 8
# ranks 4 MiB (default) beat 16 MiB and 1 MiB (session 8); 2 and 8 MiB were never tried. At 4
# ranks 16 MiB (default) beat 4 MiB; 8 MiB never tried. Private tensors (the path short of 3x).
# Two rounds, slot sizes in turn.
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/pyzmq*.whl \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
mkdir -p /tmp/run3 && cd /tmp/run3
MF="python3 -m macfleet.launcher.cli"  # not a shell function: timeout runs programs only
for round in 1 2; do
  for slot in 4 8 2; do
    echo "== round $round N=8 slot ${slot}M"
    MACFLEET_SHM_SLOT_BYTES=$((slot << 20)) timeout 150 $MF bench allreduce --nproc 8 --sizes 16M,64M,256M --budget 0.5 \
      --json /tmp/run3/r${round}_n8_s${slot}.json 2>/dev/null | tail -3
  done
  for slot in 16 8; do
    echo "== round $round N=4 slot ${slot}M"
    MACFLEET_SHM_SLOT_BYTES=$((slot << 20)) timeout 150 $MF bench allreduce --nproc 4 --sizes 64M,256M --budget 0.5 \
      --json /tmp/run3/r${round}_n4_s${slot}.json 2>/dev/null | tail -2
  done
done
python3 - <<'PY' > $OUT/run3_slots.json
import glob, json
print(json.dumps({p.split('/')[-1]: json.load(open(p)) for p in sorted(glob.glob('/tmp/run3/*.json'))}, indent=1))
PY
