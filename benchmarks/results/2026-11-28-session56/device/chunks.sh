# session 56, device: macfleet over TCP (MACFLEET_SHM=0) at N=4 and 8 with the ring's chunk
# size (MACFLEET_CHUNK_BYTES) at the default 4 MiB, 1 MiB, 512 KiB and 256 KiB; gloo alongside in each run.
python3 -m pip install -q --no-index --no-deps --no-build-isolation --break-system-packages --force-reinstall .whl/*.whl . >/tmp/pip.log 2>&1 || { echo install failed; tail -3 /tmp/pip.log; }
cd /tmp
for n in 4 8; do for c in 4M 1M 512K 256K; do
  echo "== N=$n chunk=$c"
  timeout 150 python3 -m macfleet.launcher.cli bench allreduce --nproc $n --env MACFLEET_SHM=0 --env MACFLEET_CHUNK_BYTES=$c --sizes 16M,64M,256M --json $OUT/n${n}_chunk${c}.json 2>&1 | grep -v '^\s*$' | tail -4
done; done
# then, in a second call, the same at 8M:
# for n in 4 8; do ... --env MACFLEET_CHUNK_BYTES=8M ... --json $OUT/n${n}_chunk8M.json; done
