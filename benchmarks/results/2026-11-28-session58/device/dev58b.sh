python3 -m pip install -q --no-index --no-deps --no-build-isolation --break-system-packages --force-reinstall .whl/*.whl . 2>&1 | tail -2
python3 -m pip install -q --no-index --no-deps --break-system-packages .whl/test/*.whl 2>&1 | tail -1
site=$(cd /tmp && python3 -c "import macfleet.workers.bootstrap as b; print(b.__file__)")
echo "site: $site"; cp "$site" /tmp/bootstrap_new.py && cp .exp/bootstrap_old.py "$site" && echo "old bootstrap in place: $(grep -c _nanobind_loaded $site) mentions"
timeout 300 macfleet launch --nproc 2 --device cuda examples/mnist/train.py --epochs 1 > $OUT/mnist_cuda_old.txt 2>&1; echo "old rc=$? nanobind lines: $(grep -c nanobind $OUT/mnist_cuda_old.txt) of $(wc -l < $OUT/mnist_cuda_old.txt)"
grep "nanobind: leaked" $OUT/mnist_cuda_old.txt
cp /tmp/bootstrap_new.py "$site"; echo "new bootstrap back: $(grep -c _nanobind_loaded $site) mentions"
timeout 300 macfleet launch --nproc 2 --device cuda examples/mnist/train.py --epochs 1 > $OUT/mnist_cuda_new.txt 2>&1; echo "new rc=$? nanobind lines: $(grep -c nanobind $OUT/mnist_cuda_new.txt) of $(wc -l < $OUT/mnist_cuda_new.txt)"
timeout 200 python3 -m pytest -q -n 0 -p no:cacheprovider -rs tests/test_launcher.py tests/test_units.py -k "nanobind or ddp_s_other" 2>&1 | tail -15
