python3 -m pip install -q --no-index --no-deps --no-build-isolation --break-system-packages .whl/*.whl . >/tmp/pip.log 2>&1 || { echo install failed; tail -5 /tmp/pip.log; }
R=$(pwd); mkdir -p /tmp/run && cd /tmp/run
nproc; lscpu | grep -i "thread\|core\|socket\|model name"
for round in 1 2; do
  for v in none own; do
    echo "== round $round pin=$v"
    X_PIN=$([ $v = none ] && echo "" || echo $v) timeout 200 python3 $R/.exp/pin/bench_pin.py --nprocs 1,4 --device cpu --threads-per-rank 4 --models large --steps 30 --json $OUT/r${round}_$v.json 2>&1 | grep -v -i warn | tail -7
  done
done
