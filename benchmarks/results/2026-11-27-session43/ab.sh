R=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/deps .whl/*.whl >/dev/null 2>&1
for t in base new; do
  rm -rf /tmp/src_$t /tmp/site_$t; mkdir -p /tmp/src_$t && tar -xf .exp/$t.tar -C /tmp/src_$t
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site_$t /tmp/src_$t >/dev/null 2>&1 || echo "install $t failed"
done
nproc; lscpu | grep -E "Model name|Thread|Core"; python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0))"
mkdir -p /tmp/run && cd /tmp/run
mf() { v=$1; shift; PYTHONPATH=/tmp/site_$v:/tmp/deps python3 -m macfleet.launcher.cli "$@"; }
for n in 2 4 8; do for path in shm tcp; do for v in base new; do
  if [ $path = tcp ]; then export MACFLEET_SHM=0; else unset MACFLEET_SHM; fi
  echo "== allreduce N=$n $path $v"; mf $v bench allreduce --nproc $n --sizes 4K,1M,16M,64M --budget 0.3 --json $OUT/ar_${n}_${path}_$v.json 2>&1 | grep -E "^ *[0-9]+(K|M) "
done; done; done
unset MACFLEET_SHM
for n in 2 4; do mf new launch --nproc $n --device cuda /tmp/src_new/tests/bin/cuda_check.py > /tmp/cc_$n.log 2>&1; echo "cuda_check N=$n rc=$? false=$(grep -o '": false' /tmp/cc_$n.log | wc -l) true=$(grep -o '": true' /tmp/cc_$n.log | wc -l)"; grep -o '"oracle_max_diff[^,]*' /tmp/cc_$n.log | cut -d: -f2 | sort -g | sed -n '1p;$p' | tr '\n' ' '; echo; done
mf new launch --nproc 2 --device cuda /tmp/src_new/examples/mnist/train.py --epochs 1 2>&1 | tail -3
mf new launch --nproc 4 --device cuda /tmp/src_new/examples/mnist/train.py --epochs 1 --amp 2>&1 | tail -2
