python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/deps .whl/*.whl >/dev/null 2>&1
for v in base new; do
  rm -rf /tmp/src_$v /tmp/site_$v; mkdir -p /tmp/src_$v && tar -xf .exp/$v.tar -C /tmp/src_$v
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site_$v /tmp/src_$v >/dev/null 2>&1 || echo "install $v failed"
done
R=$(pwd)
mkdir -p /tmp/run && cd /tmp/run
export STEPS=80
for round in 1 2 3; do
  for v in new base; do
    echo "== round $round $v N=2"
    PYTHONPATH=/tmp/site_$v:/tmp/deps python3 -m macfleet.launcher.cli launch --nproc 2 --device cuda --timeline /tmp/t.json $R/.exp/large_mps.py > /dev/null 2>&1
    python3 $R/.exp/tl_spread.py /tmp/t.json | tail -1
  done
done
