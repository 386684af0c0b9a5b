set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site
mkdir -p /tmp/run && cp -r benchmarks .exp /tmp/run/ && cd /tmp/run
nproc; python3 -c "import torch; print(torch.__version__)"
for n in 2 4; do for v in "" "MACFLEET_INLINE_BYTES=64M"; do
  env $v timeout 150 python3 -m macfleet.launcher.cli launch --nproc $n .exp/noex.py 400 4 many 2>&1 | grep "rank 0" | grep -v "share of"
done; done 2>&1 | tee $OUT/noex_many.log
for v in "" "MACFLEET_INLINE_BYTES=64M"; do
  env $v timeout 150 python3 -m macfleet.launcher.cli launch --nproc 4 .exp/noex.py 80 4 large 2>&1 | grep "rank 0" | grep -v "share of"
done 2>&1 | tee $OUT/noex_large.log
