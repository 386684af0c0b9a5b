# session 49, device: DataParallel against DDP (gloo) on the final code, CPU (4 threads a rank) and CUDA
python3 -m pip install -q --no-index --no-deps --no-build-isolation --break-system-packages .whl/*.whl . >/tmp/pip.log 2>&1 || { echo install failed; tail -5 /tmp/pip.log; }
R=$(pwd); mkdir -p /tmp/run && cd /tmp/run
timeout 330 python3 $R/benchmarks/train_throughput.py --nprocs 1,2,4 --device cpu --threads-per-rank 4 --models cnn,large --steps 30 --json $OUT/train_cpu.json 2>&1 | grep -v -i warn | tail -14
timeout 230 python3 $R/benchmarks/train_throughput.py --nprocs 2,4 --device cuda --models cnn,large --steps 30 --json $OUT/train_cuda.json 2>&1 | grep -v -i warn | tail -10
