# session 47, device: a two-host ring over emulated links in 4 parts (default), 2 parts (MACFLEET_STREAMS=1), 1 part
cp -r .exp/netkit /tmp/netkit
for b in ip tc ssh ssh-keygen sshd; do printf '#!/bin/sh\nLD_LIBRARY_PATH=/tmp/netkit/lib exec /tmp/netkit/bin/%s "$@"\n' $b > /usr/local/bin/$b; chmod +x /usr/local/bin/$b; done
id sshd >/dev/null 2>&1 || useradd -r -M -d /run/sshd -s /usr/sbin/nologin sshd
python3 -m pip install -q --no-index --no-deps --no-build-isolation --break-system-packages --force-reinstall .whl/*.whl . >/tmp/pip.log 2>&1 || { echo install failed; tail -5 /tmp/pip.log; }
R=$(pwd); mkdir -p /tmp/run && cd /tmp/run
start=$(date +%s)
for round in 1 2; do
  for e in X=1 MACFLEET_STREAMS=1 MACFLEET_MIN_PART_BYTES=1G; do
    [ $(( $(date +%s) - start )) -gt 430 ] && { echo "out of time before round $round $e"; break 2; }
    echo "== round $round $e ($(( $(date +%s) - start )) s)"
    env $e timeout 110 python3 $R/benchmarks/emulated_links.py --json $OUT/parts3_${e%%=*}_$round.json 2>&1 | grep -E "^ +(1|10)gbit"
  done
done
