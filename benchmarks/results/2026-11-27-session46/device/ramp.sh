cp -r .exp/netkit /tmp/netkit
for b in ip tc ssh ssh-keygen sshd; do printf '#!/bin/sh\nLD_LIBRARY_PATH=/tmp/netkit/lib exec /tmp/netkit/bin/%s "$@"\n' $b > /usr/local/bin/$b; chmod +x /usr/local/bin/$b; done
id sshd >/dev/null 2>&1 || useradd -r -M -d /run/sshd -s /usr/sbin/nologin sshd
python3 -m pip install -q --no-index --no-deps --no-build-isolation --break-system-packages .whl/*.whl . >/tmp/pip.log 2>&1 || { echo install failed; tail -5 /tmp/pip.log; }
R=$(pwd); mkdir -p /tmp/run && cd /tmp/run
python3 -m macfleet.launcher.cli launch --nproc 2 --device cuda $R/tests/bin/cuda_check.py > /tmp/cc.log 2>&1; echo "cuda_check N=2 rc=$? false=$(grep -o '": false' /tmp/cc.log | wc -l) true=$(grep -o '": true' /tmp/cc.log | wc -l)"
for round in 1 2 3; do
  for r in 0 1; do
    echo "== link round $round ramp $r"
    MACFLEET_RAMP=$r timeout 150 python3 $R/benchmarks/emulated_links.py --train deep --rates 10gbit --json $OUT/ramp_link_${r}_$round.json 2>&1 | grep "10gbit deep"
  done
done
for round in 1 2; do
  for r in 0 1; do
    echo "== one host round $round ramp $r"
    MACFLEET_RAMP=$r timeout 150 python3 $R/benchmarks/train_throughput.py --nprocs 4 --threads-per-rank 4 --models deep --steps 20 --json $OUT/ramp_host_${r}_$round.json 2>&1 | grep "^deep    4 [md]"
  done
done
