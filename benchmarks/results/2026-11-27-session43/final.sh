R=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/deps .whl/*.whl >/dev/null 2>&1
rm -rf /tmp/src_new /tmp/site_new; mkdir -p /tmp/src_new && tar -xf .exp/new.tar -C /tmp/src_new
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site_new /tmp/src_new >/dev/null 2>&1 || echo "install failed"
export PYTHONPATH=/tmp/site_new:/tmp/deps
python3 -c "
import torch, time
a = torch.empty(64 << 20); b = torch.empty_like(a); b.copy_(a)
for th in (1, 4, 16):
    torch.set_num_threads(th); t = time.perf_counter()
    for _ in range(10): b.copy_(a)
    print(f'copy 256 MiB, {th} threads: {2 * 10 * a.numel() * 4 / (time.perf_counter() - t) / 1e9:.1f} GB/s (read+write)')
"
mkdir -p /tmp/run && cd /tmp/run
mf() { python3 -m macfleet.launcher.cli "$@"; }
for n in 2 4 8; do
  echo "== N=$n shm"; mf bench allreduce --nproc $n --sizes 4K,1M,16M,64M,256M --budget 0.5 --json $OUT/f_${n}_shm.json 2>&1 | grep -E "^ *[0-9]+(K|M) "
  echo "== N=$n tcp"; MACFLEET_SHM=0 mf bench allreduce --nproc $n --sizes 4K,1M,16M,64M,256M --budget 0.5 --json $OUT/f_${n}_tcp.json 2>&1 | grep -E "^ *[0-9]+(K|M) "
done
echo "== N=4 shm again"; mf bench allreduce --nproc 4 --sizes 16M,64M --budget 1 2>&1 | grep -E "^ *[0-9]+(K|M) "
