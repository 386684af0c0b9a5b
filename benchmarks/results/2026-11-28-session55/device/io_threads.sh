# session 55, device: macfleet over TCP (MACFLEET_SHM=0) at N=8 and 4 with the data context's I/O threads
# forced to 8 (the default at streams 2), 4, 2, 1, through MFX_IO, an override patched into
# runtime.init for this run only (not committed). gloo alongside in each run.
R=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-build-isolation --break-system-packages --force-reinstall .whl/*.whl . >/tmp/pip.log 2>&1 || { echo install failed; tail -3 /tmp/pip.log; }
cd /tmp
for n in 8 4; do for io in 8 4 2 1; do
  echo "== N=$n io=$io"
  MFX_IO=$io timeout 150 python3 -m macfleet.launcher.cli bench allreduce --nproc $n --env MACFLEET_SHM=0 --env MFX_IO=$io --sizes 16M,64M,256M --json $OUT/n${n}_io${io}.json 2>&1 | grep -v '^\s*$' | tail -5
done; done
