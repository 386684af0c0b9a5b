python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/deps .whl/*.whl >/dev/null 2>&1
rm -rf /tmp/src_new /tmp/site_new; mkdir -p /tmp/src_new && tar -xf .exp/new.tar -C /tmp/src_new
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site_new /tmp/src_new >/dev/null 2>&1 || echo "install failed"
export PYTHONPATH=/tmp/site_new:/tmp/deps
R=$(pwd)
mkdir -p /tmp/run && cd /tmp/run
for round in 1 2 3; do
  for mode in overlap defer; do
    if [ $mode = defer ]; then export MACFLEET_X_DEFER=1; else unset MACFLEET_X_DEFER; fi
    echo "== round $round $mode"
    python3 /tmp/src_new/benchmarks/train_throughput.py --nprocs 4 --device cpu --threads-per-rank 4 --steps 30 --models large --json $OUT/${mode}_$round.json 2>&1 | grep -E "^large"
  done
done
