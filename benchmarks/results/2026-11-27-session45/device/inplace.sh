python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/deps .whl/*.whl >/dev/null 2>&1
rm -rf /tmp/src_new /tmp/site_new; mkdir -p /tmp/src_new && tar -xf .exp/new.tar -C /tmp/src_new
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site_new /tmp/src_new >/dev/null 2>&1 || echo "install failed"
export PYTHONPATH=/tmp/site_new:/tmp/deps
R=$(pwd)
mkdir -p /tmp/run && cd /tmp/run
mf() { python3 -m macfleet.launcher.cli "$@"; }
echo "== bench shared tensors N=4"; mf bench allreduce --nproc 4 --sizes 16M,64M --shared-tensors --budget 0.5 2>&1 | grep -E "^ *[0-9]+M "
for slot in default 4M 64M default; do
  if [ $slot = default ]; then unset MACFLEET_SHM_SLOT_BYTES; else export MACFLEET_SHM_SLOT_BYTES=$slot; fi
  echo "== large cpu N=4 slot $slot"
  mf launch --nproc 4 --device cpu --timeline /tmp/t_$slot.json $R/.exp/large_tl.py > /dev/null 2>&1
  python3 $R/.exp/tl_spread.py /tmp/t_$slot.json
done
unset MACFLEET_SHM_SLOT_BYTES
