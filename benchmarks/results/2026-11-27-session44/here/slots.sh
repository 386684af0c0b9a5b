cd /tmp; . /work/main/.venv/bin/activate
for r in 5 6 7; do for s in 2M 1M 512K; do
  macfleet bench allreduce --nproc 2 --env MACFLEET_SHM_SLOT_BYTES=$s --sizes 16M,64M,256M --json /tmp/sb_${s}_$r.json > /dev/null 2>&1
  python3 -c "
import json; d=json.load(open('/tmp/sb_${s}_$r.json'))
print('$s $r', ' '.join(f\"{r['bytes']>>20}M:{r['seconds']*1e3:.1f}\" for r in d['rows'] if r['library']=='macfleet'), ' gloo', ' '.join(f\"{r['seconds']*1e3:.1f}\" for r in d['rows'] if r['library']!='macfleet'))"
done; done
