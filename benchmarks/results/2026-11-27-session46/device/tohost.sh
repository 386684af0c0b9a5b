python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/deps .whl/*.whl >/dev/null 2>&1
rm -rf /tmp/src_new /tmp/site_new; mkdir -p /tmp/src_new && tar -xf .exp/new.tar -C /tmp/src_new
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site_new /tmp/src_new >/dev/null 2>&1 || echo "install failed"
export PYTHONPATH=/tmp/site_new:/tmp/deps
R=$(pwd); mkdir -p /tmp/run && cd /tmp/run
mf() { python3 -m macfleet.launcher.cli "$@"; }
mf launch --nproc 2 --device cuda /tmp/src_new/tests/bin/cuda_check.py > /tmp/cc.log 2>&1; echo "cuda_check N=2 rc=$? false=$(grep -o '": false' /tmp/cc.log | wc -l) true=$(grep -o '": true' /tmp/cc.log | wc -l) $(grep -o '"oracle_max_diff[^,]*' /tmp/cc.log | cut -d: -f2 | sort -g | sed -n '1p;$p' | tr '\n' ' ')"
for s in large_tl large_mps; do
  echo "== $s"
  mf launch --nproc 2 --device cuda --timeline $OUT/$s.json $R/.exp/$s.py 2>&1 | tail -1
  python3 $R/.exp/tohost.py $OUT/$s.json
done
