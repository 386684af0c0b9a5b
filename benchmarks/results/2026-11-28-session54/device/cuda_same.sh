# session 54, device: cuda_same.py again, its inputs now moved before the forward and printed from there
python3 -m pip install -q --no-index --no-deps --no-build-isolation --break-system-packages --force-reinstall .whl/*.whl . >/tmp/pip.log 2>&1 || { echo install failed; tail -3 /tmp/pip.log; }
D=$(pwd)/benchmarks/results/2026-11-28-session54/device
mkdir -p /tmp/run && cd /tmp/run
for mode in stream split; do
  timeout 100 python3 -m macfleet.launcher.cli launch --nproc 2 --device cuda $D/cuda_same.py $mode > $OUT/cuda_same_$mode.log 2>&1; echo "cuda_same $mode rc=$?"
  grep -c "train on the same batches" $OUT/cuda_same_$mode.log; grep "trained on" $OUT/cuda_same_$mode.log
done
