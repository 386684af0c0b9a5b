# session 50, device, second call on the warm machine: the A/B again in reverse order, then a
# timeline of 2 ranks for the whole-bucket code and the parts code.
R=$(pwd); mkdir -p /tmp/run && cd /tmp/run
for v in p8 new base; do
  if [ $v = new ]; then P=; else P=/tmp/$v; fi
  echo "== $v"
  PYTHONPATH=$P timeout 200 python3 $R/benchmarks/train_throughput.py --nprocs 2,4 --device cuda --models large --steps 40 --json $OUT/train_${v}_2.json 2>&1 | grep -v -i warn | tail -6
done
for v in base new; do
  if [ $v = new ]; then P=; else P=/tmp/$v; fi
  PYTHONPATH=$P MACFLEET_LAUNCH_TIMELINE=$OUT/tl_$v.json timeout 100 python3 $R/benchmarks/train_throughput.py --nprocs 2 --device cuda --models large --steps 20 2>&1 | grep -v -i warn | tail -3
done
ls -la $OUT
