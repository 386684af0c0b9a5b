"""Median per step, per rank, of each kind of event in a timeline (skipping the first 5 steps)."""
import json, statistics, sys, re
from collections import defaultdict
ev = json.load(open(sys.argv[1]))
by = defaultdict(list)
for e in ev:
    if e.get("ph") == "X":
        name = e["name"]
        by[(e["pid"], name)].append(e)
for (pid, name), es in sorted(by.items()):
    es.sort(key=lambda e: e["ts"])
    d = [e["dur"] / 1000 for e in es[5:]] or [e["dur"] / 1000 for e in es]
    print(f"rank {pid} {name:40s} n={len(es):3d} median {statistics.median(d):8.2f} ms")
# gap from a bucket's readiness to its exchange's start (GPU finishing + copy to host), rank 0
ready = defaultdict(list); start = defaultdict(list)
for e in ev:
    if e.get("pid") != 0: continue
    m = re.match(r"gradient bucket (\d+) ready", e["name"])
    if m: ready[int(m.group(1))].append(e["ts"])
    m = re.match(r"all_reduce gradient bucket (\d+)$", e["name"])
    if m: start[int(m.group(1))].append(e["ts"])
for k in sorted(ready):
    r, s = sorted(ready[k]), sorted(start[k])
    gaps = [(b - a) / 1000 for a, b in zip(r, s)][5:]
    if gaps: print(f"rank 0 bucket {k}: ready -> exchange start median {statistics.median(gaps):.2f} ms")
