python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/deps .whl/*.whl >/dev/null 2>&1
rm -rf /tmp/src_new /tmp/site_new; mkdir -p /tmp/src_new && tar -xf .exp/new.tar -C /tmp/src_new
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site_new /tmp/src_new >/dev/null 2>&1 || echo "install failed"
export PYTHONPATH=/tmp/site_new:/tmp/deps
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p /tmp/run && cd /tmp/run
for round in 1 2 3; do
  for pb in 1G 16M; do
    echo "== round $round pieces $pb"
    MACFLEET_PIECE_BYTES=$pb timeout 150 python3 /tmp/src_new/benchmarks/train_throughput.py --device cuda --nprocs 2 --models large --steps 30 --json $OUT/gpu2_${pb}_$round.json 2>&1 | grep "^large.*macf"
  done
done
