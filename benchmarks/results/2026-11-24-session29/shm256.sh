# run from the repository root on the device machine, with .whl/ (pyzmq, msgpack wheels) and
# .exp/old = `git archive dd8f424 | tar -x -C .exp/old` (the code before this session) carried along
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/s_new .whl/*.whl || exit 1
cp -r /tmp/s_new /tmp/s_old
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/s_new . || exit 1
(cd .exp/old && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/s_old .) || exit 1
mkdir -p /tmp/run && cd /tmp/run
for k in 1 2; do for v in old new; do
  echo "== $v $k"; PYTHONPATH=/tmp/s_$v python3 -m macfleet.launcher.cli bench allreduce --nproc 2 --sizes 64M,256M --budget 1 2>&1 | grep -E "^ +(64M|256M)"
done; done
