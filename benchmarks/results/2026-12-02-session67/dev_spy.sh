set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2; python3 -m pip install -q --no-index --no-deps --target /tmp/spy .exp/spy/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site
SPY=$(find /tmp/spy -name py-spy -type f | head -1); ls -la $SPY
mkdir -p /tmp/run && cp -r benchmarks .exp /tmp/run/ && cd /tmp/run
cat /proc/sys/kernel/yama/ptrace_scope 2>/dev/null
for n in 4; do for mode in noex mf bare; do
  rm -f /tmp/pid0
  timeout 120 python3 -m macfleet.launcher.cli launch --nproc $n .exp/one.py 1200 4 many $mode > /tmp/one.log 2>&1 &
  for i in $(seq 60); do [ -s /tmp/pid0 ] && break; sleep 0.5; done
  sleep 6
  $SPY record -p $(cat /tmp/pid0) -d 8 -r 400 --native -f raw -o $OUT/${mode}_$n.raw 2>&1 | tail -1
  wait
  grep "backward median" /tmp/one.log
done; done 2>&1 | tee $OUT/spy.log
