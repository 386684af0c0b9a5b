# session 57, device: the CNN against DDP (gloo) with 300 timed steps instead of 30, two rounds, CPU and CUDA
R=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-build-isolation --break-system-packages --force-reinstall .whl/*.whl . >/tmp/pip.log 2>&1 || { echo install failed; tail -3 /tmp/pip.log; }
nproc; python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0))"
mkdir -p /tmp/run && cd /tmp/run
for round in 1 2; do
  echo "== round $round cpu"
  timeout 200 python3 $R/benchmarks/train_throughput.py --nprocs 1,2,4 --device cpu --threads-per-rank 4 --models cnn --steps 300 --json $OUT/cnn_cpu_$round.json 2>&1 | grep -v -i warn | tail -10
  echo "== round $round cuda"
  timeout 200 python3 $R/benchmarks/train_throughput.py --nprocs 1,2,4 --device cuda --models cnn --steps 300 --json $OUT/cnn_cuda_$round.json 2>&1 | grep -v -i warn | tail -10
done
echo "== timeline cuda N=2"
timeout 120 python3 -m macfleet.launcher.cli launch --nproc 2 --device cuda --timeline $OUT/cnn_cuda_tl.json $R/benchmarks/train_throughput.py --rank-mode --models cnn --steps 100 --device cuda --out /tmp/run/tl.json 2>&1 | grep -v -i warn | tail -3
