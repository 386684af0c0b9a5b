# session 49, device: the GPU path with this session's changes (copies, float64 SyncBatchNorm, a model on two devices)
python3 -m pip install -q --no-index --no-deps --no-build-isolation --break-system-packages .whl/*.whl . >/tmp/pip.log 2>&1 || { echo install failed; tail -5 /tmp/pip.log; }
R=$(pwd); mkdir -p /tmp/run && cd /tmp/run
python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0))"
for n in 2 3; do for shm in 1 0; do
  echo "--- gpu_idioms N=$n SHM=$shm"
  MACFLEET_SHM=$shm timeout 150 macfleet launch --nproc $n --device cuda $R/benchmarks/results/2026-11-27-session49/device/gpu_idioms.py 2>&1 | grep -E "IDIOMS|Error" | head -4
done; done
for n in 2 4; do
  timeout 200 macfleet launch --nproc $n --device cuda $R/tests/bin/cuda_check.py > /tmp/cc.log 2>&1
  echo "cuda_check N=$n rc=$? false=$(grep -o '": false' /tmp/cc.log | wc -l) true=$(grep -o '": true' /tmp/cc.log | wc -l) oracle $(grep -o '"oracle_max_diff[^,]*' /tmp/cc.log | cut -d: -f2 | sort -g | sed -n '1p;$p' | tr '\n' ' ')"
  grep -o '"oracle_max_diff_copy[^,]*\|"copy_trained[^,]*' /tmp/cc.log | sort | uniq -c
  grep -i "error\|Traceback" /tmp/cc.log | head -5
  cp /tmp/cc.log $OUT/cuda_check_$n.log
done
timeout 150 macfleet launch --nproc 2 --device cuda $R/examples/mnist/train.py --epochs 1 2>&1 | grep -E "epoch|macfleet:" | tail -3
