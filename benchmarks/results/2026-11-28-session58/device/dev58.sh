set -x
python3 -m pip install -q --no-index --no-deps --no-build-isolation --break-system-packages --force-reinstall .whl/*.whl . 2>&1 | tail -2
python3 -c "import torch, sys, importlib.util as u; print(sys.version.split()[0], torch.__version__, 'triton', u.find_spec('triton') is not None)"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
# the MNIST example on CUDA, with the new bootstrap, then the old one (uncommitted copy)
timeout 300 macfleet launch --nproc 2 --device cuda examples/mnist/train.py --epochs 1 > $OUT/mnist_cuda_new.txt 2>&1; echo "new rc=$? nanobind lines: $(grep -c nanobind $OUT/mnist_cuda_new.txt)"
tail -3 $OUT/mnist_cuda_new.txt
site=$(python3 -c "import macfleet.workers.bootstrap as b; print(b.__file__)")
cp "$site" /tmp/bootstrap_new.py && cp .exp/bootstrap_old.py "$site"
timeout 300 macfleet launch --nproc 2 --device cuda examples/mnist/train.py --epochs 1 > $OUT/mnist_cuda_old.txt 2>&1; echo "old rc=$? nanobind lines: $(grep -c nanobind $OUT/mnist_cuda_old.txt)"
grep "nanobind: leaked" $OUT/mnist_cuda_old.txt
cp /tmp/bootstrap_new.py "$site"
# the oracle on CUDA at 2 ranks sharing the GPU
timeout 300 macfleet launch --nproc 2 --device cuda tests/bin/cuda_check.py > $OUT/cuda_check.txt 2>&1; echo "cuda_check rc=$?"
python3 -m pip install -q --no-index --no-deps --break-system-packages .whl/test/*.whl 2>&1 | tail -1
timeout 200 python3 -m pytest -q -n 0 -p no:cacheprovider tests/test_launcher.py tests/test_units.py -k "nanobind or ddp_s_other" 2>&1 | tail -3
