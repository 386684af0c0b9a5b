R=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/deps .whl/*.whl >/dev/null 2>&1
rm -rf /tmp/src_new /tmp/site_new; mkdir -p /tmp/src_new && tar -xf .exp/new.tar -C /tmp/src_new
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site_new /tmp/src_new >/dev/null 2>&1 || echo "install failed"
export PYTHONPATH=/tmp/site_new:/tmp/deps
mkdir -p /tmp/run && cd /tmp/run
mf() { python3 -m macfleet.launcher.cli "$@"; }
run() { # label n sizes env...
  local label=$1 n=$2 sizes=$3; shift 3
  echo "== $label N=$n $*"
  env MACFLEET_SHM=0 "$@" python3 -m macfleet.launcher.cli bench allreduce --nproc $n --sizes $sizes --budget 0.4 2>&1 | grep -E "^ *[0-9]+(K|M) "
}
for round in 1 2; do
  run r${round}_def 2 256K,1M,2M,4M
  run r${round}_c256 2 256K,1M,2M,4M MACFLEET_CHUNK_BYTES=256K
  run r${round}_c512 2 256K,1M,2M,4M MACFLEET_CHUNK_BYTES=512K
  run r${round}_def 4 512K,1M,2M
  run r${round}_s1m 4 512K,1M,2M MACFLEET_SMALL_BYTES=1M
  run r${round}_p128 4 512K,1M,2M MACFLEET_MIN_PART_BYTES=128K
done
