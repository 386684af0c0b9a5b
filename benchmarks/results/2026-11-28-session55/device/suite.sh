# session 55, device, final code: the whole suite (ip/tc/ssh/sshd from .exp/netkit) with 8 workers,
# and cuda_check at 2 ranks (the GPU path: events, staging, memory fraction, two ranks on one GPU)
cp -r .exp/netkit /tmp/netkit
for b in ip tc ssh ssh-keygen sshd; do printf '#!/bin/sh\nLD_LIBRARY_PATH=/tmp/netkit/lib exec /tmp/netkit/bin/%s "$@"\n' $b > /usr/local/bin/$b; chmod +x /usr/local/bin/$b; done
[ -e /usr/sbin/sshd ] || ln -s /usr/local/bin/sshd /usr/sbin/sshd
id sshd >/dev/null 2>&1 || useradd -r -M -d /run/sshd -s /usr/sbin/nologin sshd
R=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-build-isolation --break-system-packages --force-reinstall .whl/*.whl .whl/test/*.whl . >/tmp/pip.log 2>&1 || { echo install failed; tail -3 /tmp/pip.log; }
nproc; python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0))"
mkdir -p /tmp/run && cd /tmp/run
timeout 100 python3 -m macfleet.launcher.cli launch --nproc 2 --device cuda $R/tests/bin/cuda_check.py > $OUT/cuda_check.log 2>&1; echo "cuda_check rc=$?"
grep -o 'CUDA {.*' $OUT/cuda_check.log | python3 -c "
import json, sys
for line in sys.stdin:
    d = json.loads(line[5:])
    bad = {k: v for k, v in d.items() if v is False or (k.startswith('oracle') and not (isinstance(v, float) and v < 1e-5))}
    print('rank', d['rank'], len(d), 'checks; not as expected:', bad)"
cd /tmp && timeout 400 python3 -m pytest -n 8 -q -p no:cacheprovider --rootdir $R -c $R/pyproject.toml $R/tests 2>&1 | tail -25 | tee $OUT/device_suite.log | tail -4
