# session 54, device: DataParallel before this session (c7a2fcc, carried as .exp/old) and after,
# in turns on one machine: the training benchmark on the CPU, N=2 and 4, both models
R=$(pwd)
mkdir -p /tmp/run && cd /tmp/run
for round in 1 2; do
  for v in old new; do
    src=$R; [ $v = old ] && src=$R/.exp/old
    (cd $src && python3 -m pip install -q --no-index --no-deps --no-build-isolation --break-system-packages --force-reinstall $R/.whl/*.whl . >/tmp/pip.log 2>&1) || { echo install failed; tail -3 /tmp/pip.log; }
    echo "== round $round, $v"
    timeout 120 python3 $src/benchmarks/train_throughput.py --nprocs 2,4 --device cpu --threads-per-rank 4 --models cnn,large --steps 30 --json $OUT/ab_${v}_$round.json 2>&1 | grep -E "^(cnn|large) .*macfleet|^(cnn|large) .*ddp"
  done
done
