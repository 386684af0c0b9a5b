set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
REPO=$(pwd)
mkdir -p /tmp/run && cp -r .exp /tmp/run/ && cd /tmp/run
nproc; python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0))"
for n in 2 4; do timeout 200 python3 -m macfleet.launcher.cli launch --nproc $n --device cuda $REPO/tests/bin/cuda_check.py; echo "exit $?"; done > $OUT/gpu.log 2>&1
python3 .exp/summ.py $OUT/gpu.log; grep -c "CUDA {" $OUT/gpu.log; grep "^exit" $OUT/gpu.log
for n in 4 2; do timeout 200 python3 -m macfleet.launcher.cli launch --nproc $n .exp/thresh.py 240 4 16,32,64,128,256,512,1024 2>&1 | grep "rank 0"; done 2>&1 | tee $OUT/thresh.log
