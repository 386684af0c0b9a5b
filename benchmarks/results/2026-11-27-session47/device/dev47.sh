# session 47, device: the GPU path of the final code; a long run's memory; random kills of a CUDA job
python3 -m pip install -q --no-index --no-deps --no-build-isolation --break-system-packages .whl/*.whl . >/tmp/pip.log 2>&1 || { echo install failed; tail -5 /tmp/pip.log; }
R=$(pwd); mkdir -p /tmp/run && cd /tmp/run
nproc; python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0))"; git -C $R log -1 --format=%h 2>/dev/null
case "$1" in
check)
  for n in 2 4; do
    timeout 150 macfleet launch --nproc $n --device cuda $R/tests/bin/cuda_check.py > /tmp/cc.log 2>&1
    echo "cuda_check N=$n rc=$? false=$(grep -o '": false' /tmp/cc.log | wc -l) true=$(grep -o '": true' /tmp/cc.log | wc -l) oracle $(grep -o '"oracle_max_diff[^,]*' /tmp/cc.log | cut -d: -f2 | sort -g | sed -n '1p;$p' | tr '\n' ' ')"
    grep -i "error\|Traceback" /tmp/cc.log | head -5; cp /tmp/cc.log $OUT/cuda_check_$n.log
  done
  timeout 120 macfleet launch --nproc 2 --device cuda $R/examples/mnist/train.py --epochs 1 2>&1 | grep -E "epoch|macfleet:" | tail -3
  timeout 300 macfleet launch --nproc 2 --device cuda $R/.exp/soak/soak.py 30000 5000 2>&1 | tee $OUT/soak_cuda.log | grep -E "rank 0|macfleet:" | tail -8
  ;;
chaos)
  CHAOS_ARGS="--device cuda" CHAOS_SCRIPT=$R/.exp/chaos/work.py timeout 540 python3 $R/.exp/chaos/run.py 47 ${2:-20} 2>&1 | tee $OUT/chaos_cuda.log | grep -v "^      " | tail -40
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv
  ;;
esac
