# session 48, device: the all-reduce against gloo on the final code (host buffers now made outside
# inference mode, one context manager a collective): no change expected from session 44
python3 -m pip install -q --no-index --no-deps --no-build-isolation --break-system-packages .whl/*.whl . >/tmp/pip.log 2>&1 || { echo install failed; tail -5 /tmp/pip.log; }
mkdir -p /tmp/run && cd /tmp/run
for n in 2 4 8; do
  macfleet bench allreduce --nproc $n --sizes 4K,1M,16M,64M,256M --json $OUT/shm_$n.json 2>&1 | tail -6
  MACFLEET_SHM=0 macfleet bench allreduce --nproc $n --sizes 4K,1M,16M,64M,256M --json $OUT/tcp_$n.json 2>&1 | tail -6
done
