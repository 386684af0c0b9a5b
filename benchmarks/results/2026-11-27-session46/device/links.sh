# .exp/netkit: Debian 12's ip, tc, ssh, ssh-keygen and sshd with their libraries (not glibc's),
# from the project's machine; the device machine (Ubuntu 24.04) has none of them
cp -r .exp/netkit /tmp/netkit
for b in ip tc ssh ssh-keygen sshd; do printf '#!/bin/sh\nLD_LIBRARY_PATH=/tmp/netkit/lib exec /tmp/netkit/bin/%s "$@"\n' $b > /usr/local/bin/$b; chmod +x /usr/local/bin/$b; done
id sshd >/dev/null 2>&1 || useradd -r -M -d /run/sshd -s /usr/sbin/nologin sshd
python3 -m pip install -q --no-index --no-deps --no-build-isolation --break-system-packages .whl/*.whl . >/tmp/pip.log 2>&1 || { echo install failed; tail -5 /tmp/pip.log; }
cat /etc/os-release | head -1; nproc
python3 -c "import macfleet, zmq, msgpack, click, torch; print('imports ok', torch.__version__)"
ip netns add probe && ip netns del probe && echo netns ok
sshd -V 2>&1 | head -1; ssh -V
R=$(pwd); mkdir -p /tmp/run && cd /tmp/run
# three calls, each of one of these (section 2 of the README):
# 1. the all-reduce over 1 and 10 Gbit/s links, two rounds
for round in 1 2; do
  timeout 250 python3 $R/benchmarks/emulated_links.py --json $OUT/links_16cores_$round.json 2>&1 | tail -12
done
# 2. DataParallel against DDP between the two hosts
timeout 420 python3 $R/benchmarks/emulated_links.py --train large,deep --json $OUT/train_links_16cores.json 2>&1 | tail -8
# 3. the deep model at 10 Gbit/s with its timeline, and two knobs
for v in "A" "B MACFLEET_STREAMS=1" "C MACFLEET_CHUNK_BYTES=1M"; do
  set -- $v; echo "== $v"
  env ${2:-X=1} MACFLEET_LAUNCH_TIMELINE=/tmp/tl_$1.json timeout 200 python3 $R/benchmarks/emulated_links.py --train deep --rates 10gbit --json $OUT/deep_10g_$1.json 2>&1 | grep -v "c10d\|hostname of the client" | tail -1
  python3 $R/.exp/tl_buckets.py /tmp/tl_$1.json 0
done
