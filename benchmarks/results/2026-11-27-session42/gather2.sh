R=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site . >/dev/null 2>&1
export PYTHONPATH=/tmp/site
mkdir -p /tmp/run && cd /tmp/run
mf() { python3 -m macfleet.launcher.cli "$@"; }
for n in 2 4 8; do
  for g in 1 65536 262144; do
    echo "== N=$n gather=$g"
    MACFLEET_SHM_GATHER_BYTES=$g mf bench allreduce --nproc $n --sizes 4K,64K,128K,256K --budget 0.5 --json $OUT/g_${n}_$g.json 2>&1 | grep -E "^ *[0-9]+(K|M)"
  done
done
for rep in 1 2; do for g in 1 65536; do
  echo "== bn N=4 gather=$g"
  MACFLEET_SHM_GATHER_BYTES=$g python3 $R/benchmarks/train_throughput.py --nprocs 4 --models bn --threads-per-rank 4 --steps 40 --json $OUT/bn_${g}_$rep.json 2>&1 | grep -E "^bn|model"
done; done
for n in 2 4; do mf launch --nproc $n --device cuda $R/tests/bin/cuda_check.py 2>&1 | tail -4; done
