python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/deps .whl/*.whl >/dev/null 2>&1
for v in base new; do
  rm -rf /tmp/src_$v /tmp/site_$v; mkdir -p /tmp/src_$v && tar -xf .exp/$v.tar -C /tmp/src_$v
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site_$v /tmp/src_$v >/dev/null 2>&1 || echo "install $v failed"
done
R=$(pwd)
mkdir -p /tmp/run && cd /tmp/run
for v in base new:1G new:16M; do
  s=${v%%:*}; pb=${v#*:}; [ "$pb" = "$v" ] && pb=""
  echo "== timeline $v"
  MACFLEET_PIECE_BYTES=$pb PYTHONPATH=/tmp/site_$s:/tmp/deps python3 -m macfleet.launcher.cli launch --nproc 2 --device cuda --timeline /tmp/t.json $R/.exp/large_tl.py 2>&1 | tail -1
  python3 $R/.exp/tl_pieces.py /tmp/t.json
done
for round in 1 2; do
  for v in base new; do
    echo "== round $round $v"
    MACFLEET_PIECE_BYTES=1G PYTHONPATH=/tmp/site_$v:/tmp/deps timeout 200 python3 /tmp/src_$v/benchmarks/train_throughput.py --device cuda --nprocs 2,4 --models large --steps 30 --json $OUT/ab_${v}_$round.json 2>&1 | grep "^large.*macfleet"
  done
done
