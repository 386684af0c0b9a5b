python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/deps .whl/*.whl >/dev/null 2>&1
rm -rf /tmp/src_new /tmp/site_new; mkdir -p /tmp/src_new && tar -xf .exp/new.tar -C /tmp/src_new
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site_new /tmp/src_new >/dev/null 2>&1 || echo "install failed"
export PYTHONPATH=/tmp/site_new:/tmp/deps
nproc; python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0))"
mkdir -p /tmp/run && cd /tmp/run
mf() { python3 -m macfleet.launcher.cli "$@"; }
for pb in "" 256; do
  MACFLEET_PIECE_BYTES=$pb mf launch --nproc 2 --device cuda /tmp/src_new/tests/bin/cuda_check.py > /tmp/cc.log 2>&1
  echo "cuda_check N=2 pieces=$pb rc=$? false=$(grep -o '": false' /tmp/cc.log | wc -l) true=$(grep -o '": true' /tmp/cc.log | wc -l) $(grep -o '"oracle_max_diff[^,]*' /tmp/cc.log | cut -d: -f2 | sort -g | sed -n '1p;$p' | tr '\n' ' ')"
  grep -i "error\|Traceback" /tmp/cc.log | head -5
done
for round in 1 2; do
  for pb in 1G 16M 8M; do
    echo "== round $round pieces $pb"
    MACFLEET_PIECE_BYTES=$pb timeout 200 python3 /tmp/src_new/benchmarks/train_throughput.py --device cuda --nprocs 2,4 --models large --steps 30 --json $OUT/large_${pb}_$round.json 2>&1 | grep "^large"
  done
done
