# session 54, device: the training benchmark against DDP (gloo) on the final DataParallel, whose
# forward now notes its first three training forwards' inputs (macfleet.batches); as session 52's all52.sh
R=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-build-isolation --break-system-packages --force-reinstall .whl/*.whl . >/tmp/pip.log 2>&1 || { echo install failed; tail -3 /tmp/pip.log; }
nproc; python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0))"
mkdir -p /tmp/run && cd /tmp/run
timeout 150 python3 $R/benchmarks/train_throughput.py --nprocs 1,2,4 --device cpu --threads-per-rank 4 --models cnn,large --steps 30 --json $OUT/train_cpu.json 2>&1 | grep -v -i warn | tail -16
timeout 100 python3 $R/benchmarks/train_throughput.py --nprocs 2,4 --device cuda --models cnn,large --steps 30 --json $OUT/train_cuda.json 2>&1 | grep -v -i warn | tail -13
