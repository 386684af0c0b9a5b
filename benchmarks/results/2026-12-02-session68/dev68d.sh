set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
mkdir -p /tmp/run && cp -r .exp /tmp/run/ && cd /tmp/run
for t in 1 2; do for n in 2 4; do timeout 130 python3 -m macfleet.launcher.cli launch --nproc $n .exp/thresh68.py 400 $t 64,256,512,1024 2>&1 | grep "rank 0"; done; done 2>&1 | tee $OUT/thresh_threads.log
