R=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl .whl/test/*.whl >/dev/null 2>&1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site . >/dev/null 2>&1 || echo install failed
nproc; python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0))"
cd /tmp && PYTHONPATH=/tmp/site timeout 540 python3 -m pytest -n 6 -q -p no:cacheprovider --rootdir $R -c $R/pyproject.toml $R/tests -x 2>&1 | tail -15 | tee $OUT/device_suite.log
