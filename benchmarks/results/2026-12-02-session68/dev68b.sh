set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
mkdir -p /tmp/run && cp -r .exp /tmp/run/ && cd /tmp/run
for n in 4 2; do timeout 150 python3 -m macfleet.launcher.cli launch --nproc $n .exp/thresh.py 800 4 256,512,1024,2048 2>&1 | grep "rank 0"; done 2>&1 | tee $OUT/thresh2.log
for n in 2; do timeout 150 python3 -m macfleet.launcher.cli launch --nproc $n --device cuda .exp/thresh.py 400 4 64,1024,4096,16384 cuda 2>&1 | grep "rank 0"; done 2>&1 | tee $OUT/thresh_cuda.log
