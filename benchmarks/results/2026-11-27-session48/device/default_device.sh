# session 48, device: a script that sets torch.set_default_device("cuda"); the GPU path's checks
python3 -m pip install -q --no-index --no-deps --no-build-isolation --break-system-packages .whl/*.whl .whl/test/*.whl . >/tmp/pip.log 2>&1 || { echo install failed; tail -5 /tmp/pip.log; }
R=$(pwd); mkdir -p /tmp/run && cd /tmp/run
python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0))"
for dd in cuda meta; do
  timeout 120 macfleet launch --nproc 2 --device cuda $R/tests/bin/default_device.py $dd /tmp/dd 2>&1 | grep -v -i warn | tail -4
  MACFLEET_SHM=0 timeout 120 macfleet launch --nproc 3 --device cuda $R/tests/bin/default_device.py $dd /tmp/dd 2>&1 | grep -v -i warn | tail -4
done
# old.tar: git archive bdbf9a8 (before the fix), carried in .exp
echo "--- before the fix (bdbf9a8), cuda default device:"
mkdir -p /tmp/oldsrc && tar -xf $R/.exp/casesoak/old.tar -C /tmp/oldsrc && python3 -m pip install -q --no-deps --no-build-isolation --target /tmp/old /tmp/oldsrc >/tmp/pip2.log 2>&1 || tail -3 /tmp/pip2.log
for n in 2 3; do PYTHONPATH=/tmp/old MACFLEET_SHM=$((n == 2)) timeout 120 python3 -m macfleet.launcher.cli launch --nproc $n --device cuda $R/tests/bin/default_device.py cuda /tmp/dd 2>&1 | grep -E "Error|ok|/tmp/old" | tail -4; done
for n in 2 4; do
  timeout 150 macfleet launch --nproc $n --device cuda $R/tests/bin/cuda_check.py > /tmp/cc.log 2>&1
  echo "cuda_check N=$n rc=$? false=$(grep -o '": false' /tmp/cc.log | wc -l) true=$(grep -o '": true' /tmp/cc.log | wc -l) oracle $(grep -o '"oracle_max_diff[^,]*' /tmp/cc.log | cut -d: -f2 | sort -g | sed -n '1p;$p' | tr '\n' ' ')"
  grep -i "error\|Traceback" /tmp/cc.log | head -5
done
timeout 120 macfleet launch --nproc 2 --device cuda $R/examples/mnist/train.py --epochs 1 2>&1 | grep -E "epoch|macfleet:" | tail -3
