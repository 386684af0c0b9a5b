set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
REPO=$(pwd)
mkdir -p /tmp/run && cp -r .exp benchmarks /tmp/run/ && cd /tmp/run
python3 -c "import macfleet.backends as b; print(b.CudaDevice.lend_grad_bytes, b.Device.lend_grad_bytes)"
for n in 2 4; do timeout 150 python3 -m macfleet.launcher.cli launch --nproc $n --device cuda .exp/lendab.py 320 4 large,deep,cnn cuda 2>&1 | grep "rank 0"; done 2>&1 | tee $OUT/lendab_cuda.log
timeout 300 python3 benchmarks/train_throughput.py --nprocs 1,2,4 --device cuda --models cnn,large --steps 30 --json $OUT/train_cuda.json > $OUT/train_cuda.log 2>&1; echo "exit $?"; tail -30 $OUT/train_cuda.log
