# session 50, device: buckets averaged in parts (16 MiB, and 8 MiB), against whole buckets (HEAD
# before the change), CUDA, ranks sharing the GPU; then cuda_check at 2 ranks. ROUND names the output.
python3 -m pip install -q --no-index --no-deps --no-build-isolation --break-system-packages .whl/*.whl . >/tmp/pip.log 2>&1 || { echo install failed; tail -5 /tmp/pip.log; }
for v in base p8; do
  [ -d /tmp/$v ] || python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/$v .exp/ab50/$v >/tmp/pip_$v.log 2>&1 || { echo install $v failed; tail -5 /tmp/pip_$v.log; }
done
R=$(pwd); mkdir -p /tmp/run && cd /tmp/run
python3 -c "import macfleet.buckets as b; print('installed parts', b.PART_BYTES)"
PYTHONPATH=/tmp/base python3 -c "import macfleet.buckets as b, macfleet; print('base', macfleet.__file__, hasattr(b, 'PART_BYTES'))"
for v in base new p8; do
  if [ $v = new ]; then P=; else P=/tmp/$v; fi
  echo "== $v"
  PYTHONPATH=$P timeout 200 python3 $R/benchmarks/train_throughput.py --nprocs 2,4 --device cuda --models large --steps 40 --json $OUT/train_${v}_${ROUND}.json 2>&1 | grep -v -i warn | tail -6
done
