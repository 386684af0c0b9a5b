R=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl .whl/test/*.whl >/dev/null 2>&1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site . >/dev/null 2>&1 || echo install failed
nproc; python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0))"
mkdir -p /tmp/run && cd /tmp/run
mf() { PYTHONPATH=/tmp/site python3 -m macfleet.launcher.cli "$@"; }
mf launch --nproc 4 --device cuda $R/tests/bin/cuda_check.py > /tmp/cc_4.log 2>&1; echo "cuda_check N=4 rc=$? false=$(grep -o '": false' /tmp/cc_4.log | wc -l) true=$(grep -o '": true' /tmp/cc_4.log | wc -l)"; grep -o '"oracle_max_diff[^,]*' /tmp/cc_4.log | cut -d: -f2 | sort -g | sed -n '1p;$p' | tr '\n' ' '; echo
mf launch --nproc 2 --device cuda --timeline $OUT/mnist_cuda_timeline.json $R/examples/mnist/train.py --epochs 1 2>&1 | tail -3
cd /tmp && PYTHONPATH=/tmp/site timeout 420 python3 -m pytest -n 6 -q -p no:cacheprovider --rootdir $R -c $R/pyproject.toml $R/tests -x 2>&1 | tail -15 | tee $OUT/device_suite.log
