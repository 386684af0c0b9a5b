set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/old .exp/oldwhl/*.whl 2>&1 | tail -2
mkdir -p /tmp/run && cp -r benchmarks .exp /tmp/run/ && cd /tmp/run
for round in 1 2; do for n in 4 2; do for v in old new; do
  if [ $v = old ]; then PP=/tmp/old:/tmp/site; else PP=/tmp/site; fi
  echo "== round $round N=$n $v"
  PYTHONPATH=$PP timeout 150 python3 -m macfleet.launcher.cli launch --nproc $n .exp/noex.py 400 4 many 2>&1 | grep "rank 0" | grep -v "share of" | grep -v "N="
done; done; done 2>&1 | tee $OUT/ab_last.log
