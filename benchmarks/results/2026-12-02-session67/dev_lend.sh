set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site
mkdir -p /tmp/run && cp -r benchmarks .exp /tmp/run/ && cd /tmp/run
for round in 1 2; do for n in 4 2; do
  timeout 150 python3 -m macfleet.launcher.cli launch --nproc $n .exp/lend.py 400 4 many 2>&1 | grep "rank 0" | grep -v "share of"
done; done 2>&1 | tee $OUT/lend.log
