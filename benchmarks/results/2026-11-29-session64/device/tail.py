"""Per step of a DataParallel timeline: what happens after the last rank's backward ends."""
import json, statistics as S, sys
from collections import defaultdict
ev = json.load(open(sys.argv[1]))
d = defaultdict(lambda: defaultdict(list))
for e in ev:
    if e.get('ph') in ('X', 'i'):
        d[e['name']][e['pid']].append((e['ts'], e['ts'] + e.get('dur', 0)))
bw = d['backward (first gradient to last)']; ranks = sorted(bw); steps = min(len(v) for v in bw.values())
nb = len([n for n in d if n.startswith('all_reduce gradient bucket')])
rows = defaultdict(list)
for s in range(5, steps):
    tl = max(bw[p][s][1] for p in ranks); last = max(ranks, key=lambda p: bw[p][s][1])
    first = min(ranks, key=lambda p: bw[p][s][1])
    rows['backward end spread (last - first)'].append((tl - bw[first][s][1]) / 1e3)
    for b in range(nb):
        r = d[f'gradient bucket {b} ready']; a = d[f'all_reduce gradient bucket {b}']
        rows[f'b{b} ready on the last rank, rel. its bwd end'].append((r[last][s][0] - tl) / 1e3)
        rows[f'b{b} ready spread'].append((max(r[p][s][0] for p in ranks) - min(r[p][s][0] for p in ranks)) / 1e3)
        rows[f'b{b} all_reduce starts (last rank in)'].append((max(a[p][s][0] for p in ranks) - tl) / 1e3)
        rows[f'b{b} all_reduce ends (last rank out)'].append((max(a[p][s][1] for p in ranks) - tl) / 1e3)
    w = d['waiting for gradients']
    rows['wait of the last rank'].append((w[last][s][1] - w[last][s][0]) / 1e3)
    rows['step (rank 0 forward to forward)'].append((d['forward'][0][s + 1][0] - d['forward'][0][s][0]) / 1e3 if s + 1 < steps else float('nan'))
for k, v in rows.items():
    v = [x for x in v if x == x]
    print(f"{k:45s} median {S.median(v):7.1f}  min {min(v):7.1f}  max {max(v):7.1f}")
