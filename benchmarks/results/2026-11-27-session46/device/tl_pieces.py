"""Rank 0, steps 6 on: each all-reduce's start after its bucket's readiness, and its length (median ms)."""
import json, statistics, sys, re
from collections import defaultdict
ev = sorted((e for e in json.load(open(sys.argv[1])) if e.get("pid") == 0 and "ts" in e), key=lambda e: e["ts"])
ready, rows, waits = {}, defaultdict(list), []
for e in ev:
    m = re.match(r"gradient bucket (\d+) ready", e["name"])
    if m: ready[int(m.group(1))] = e["ts"]
    m = re.match(r"all_reduce gradient bucket (\d+)( piece \d+)?$", e["name"])
    if m and e.get("ph") == "X":
        rows[e["name"]].append(((e["ts"] - ready[int(m.group(1))]) / 1000, e["dur"] / 1000))
    if e["name"] == "waiting for gradients": waits.append(e["dur"] / 1000)
for name, xs in rows.items():
    xs = xs[5:]
    print(f"{name:36s} start {statistics.median(x[0] for x in xs):6.2f} dur {statistics.median(x[1] for x in xs):6.2f}")
print(f"waiting for gradients {statistics.median(waits[5:]):.2f}")
