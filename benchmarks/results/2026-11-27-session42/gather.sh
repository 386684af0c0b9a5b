R=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site . >/dev/null 2>&1
export PYTHONPATH=/tmp/site
mkdir -p /tmp/run && cd /tmp/run
mf() { python3 -m macfleet.launcher.cli "$@"; }
for n in 2 4 8; do
  for g in 1 8192 65536; do
    echo "== N=$n gather=$g"
    MACFLEET_SHM_GATHER_BYTES=$g mf launch --nproc $n $R/.exp/lat2.py 2>&1 | grep N=
    MACFLEET_SHM_GATHER_BYTES=$g mf bench allreduce --nproc $n --sizes 4K,16K,64K --budget 0.5 --json $OUT/g_${n}_$g.json 2>&1 | grep -E "^ *[0-9]+(K|M)"
  done
done
