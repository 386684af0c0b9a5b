set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . || exit 1
python3 -m pip install -q --no-index --no-deps --target /tmp/pyspy .exp/py_spy*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
REPO=$(pwd); mkdir -p /tmp/run /tmp/pids && cd /tmp/run
mf() { python3 -m macfleet.launcher.cli "$@"; }
for chunk in 4194304 262144; do
  rm -f /tmp/pids/*
  (PIDDIR=/tmp/pids MACFLEET_SHM=0 MACFLEET_CHUNK_BYTES=$chunk MACFLEET_ZERO_COPY_BYTES=$chunk SIZE=16777216 SECS=14 mf launch --nproc 4 $REPO/.exp/loop.py > /tmp/loop_$chunk.log 2>&1 &)
  sleep 6; ls /tmp/pids; head -20 /tmp/loop_$chunk.log
  /tmp/pyspy/bin/py-spy record -p $(cat /tmp/pids/pid1) -d 4 -r 500 --idle --threads -f raw -o $OUT/prof_$chunk.txt > /tmp/pyspy_$chunk.log 2>&1 || tail -3 /tmp/pyspy_$chunk.log
  /tmp/pyspy/bin/py-spy record -p $(cat /tmp/pids/pid1) -d 3 -r 500 --threads -f raw -o $OUT/profcpu_$chunk.txt > /tmp/pyspy2_$chunk.log 2>&1 || tail -3 /tmp/pyspy2_$chunk.log
  sleep 4; tail -2 /tmp/loop_$chunk.log
  echo "-- profile (with idle) chunk=$chunk"; python3 $REPO/.exp/prof.py $OUT/prof_$chunk.txt | head -40
  echo "-- profile (cpu only) chunk=$chunk"; python3 $REPO/.exp/prof.py $OUT/profcpu_$chunk.txt | head -30
done
