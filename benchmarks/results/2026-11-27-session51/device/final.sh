# session 51, device: the final code. PART=cuda: cuda_check at 2 ranks, then DataParallel
# against DDP (gloo) on CUDA (ranks sharing the GPU); PART=cpu: the same on the CPU, 4 threads a rank.
python3 -m pip install -q --no-index --no-deps --no-build-isolation --break-system-packages .whl/*.whl . >/tmp/pip.log 2>&1 || { echo install failed; tail -5 /tmp/pip.log; }
R=$(pwd); mkdir -p /tmp/run && cd /tmp/run
if [ "$PART" = cuda ]; then
  timeout 150 python3 -m macfleet.launcher.cli launch --nproc 2 --device cuda $R/tests/bin/cuda_check.py > $OUT/cuda_check.log 2>&1; echo "cuda_check rc=$?"
  grep -o 'CUDA {.*' $OUT/cuda_check.log | python3 -c "
import json, sys
for line in sys.stdin:
    d = json.loads(line[5:])
    bad = {k: v for k, v in d.items() if v is False or (k.startswith('oracle') and not (isinstance(v, float) and v < 1e-5))}
    print('rank', d['rank'], len(d), 'checks; not as expected:', bad)"
  timeout 260 python3 $R/benchmarks/train_throughput.py --nprocs 2,4 --device cuda --models cnn,large --steps 30 --json $OUT/train_cuda.json 2>&1 | grep -v -i warn | tail -13
else
  timeout 420 python3 $R/benchmarks/train_throughput.py --nprocs 1,2,4 --device cpu --threads-per-rank 4 --models cnn,large --steps 30 --json $OUT/train_cpu.json 2>&1 | grep -v -i warn | tail -16
fi
