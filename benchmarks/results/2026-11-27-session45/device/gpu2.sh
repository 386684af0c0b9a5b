python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/deps .whl/*.whl >/dev/null 2>&1
rm -rf /tmp/src_new /tmp/site_new; mkdir -p /tmp/src_new && tar -xf .exp/new.tar -C /tmp/src_new
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site_new /tmp/src_new >/dev/null 2>&1 || echo "install failed"
export PYTHONPATH=/tmp/site_new:/tmp/deps
nvidia-smi --query-gpu=name --format=csv,noheader; nvidia-smi topo -m | head -4
mkdir -p /tmp/run && cd /tmp/run
python3 /tmp/src_new/benchmarks/train_throughput.py --nprocs 1,2 --device cuda --steps 30 --models cnn,large --ddp-backend nccl --json $OUT/train_nccl_2gpu.json 2>&1 | grep -v Warn | tail -12
python3 /tmp/src_new/benchmarks/train_throughput.py --nprocs 1,2 --device cuda --steps 30 --models cnn,large --json $OUT/train_gloo_2gpu.json 2>&1 | grep -v Warn | tail -12
for n in 2; do python3 -m macfleet.launcher.cli launch --nproc $n --device cuda /tmp/src_new/tests/bin/cuda_check.py > /tmp/cc_$n.log 2>&1; echo "cuda_check 1/GPU N=$n rc=$? false=$(grep -o '": false' /tmp/cc_$n.log | wc -l) true=$(grep -o '": true' /tmp/cc_$n.log | wc -l)"; done
