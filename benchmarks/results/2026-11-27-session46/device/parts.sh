cp -r .exp/netkit /tmp/netkit
for b in ip tc ssh ssh-keygen sshd; do printf '#!/bin/sh\nLD_LIBRARY_PATH=/tmp/netkit/lib exec /tmp/netkit/bin/%s "$@"\n' $b > /usr/local/bin/$b; chmod +x /usr/local/bin/$b; done
id sshd >/dev/null 2>&1 || useradd -r -M -d /run/sshd -s /usr/sbin/nologin sshd
python3 -m pip install -q --no-index --no-deps --no-build-isolation --break-system-packages .whl/*.whl . >/tmp/pip.log 2>&1 || { echo install failed; tail -5 /tmp/pip.log; }
R=$(pwd); mkdir -p /tmp/run && cd /tmp/run
for round in 1 2; do
  for e in X=1 MACFLEET_MIN_PART_BYTES=1G; do
    echo "== round $round $e"
    env $e timeout 100 python3 $R/benchmarks/emulated_links.py --json $OUT/parts_${e%%=*}_$round.json 2>&1 | grep -E "^ +(1|10)gbit"
  done
done
