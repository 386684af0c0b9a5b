"""Each 'gradient bucket k to host' span of a timeline: its thread and median length, rank 0."""
import json, statistics, sys, re
from collections import defaultdict
ev = json.load(open(sys.argv[1]))
threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e.get("name") == "thread_name"}
rows = defaultdict(list)
for e in ev:
    if e.get("pid") == 0 and re.match(r"gradient bucket \d+ to host", e.get("name", "")):
        rows[(e["name"], threads[(0, e["tid"])])].append(e["dur"] / 1000)
for (name, thread), xs in sorted(rows.items()):
    print(f"{name:32s} on {thread:18s} n={len(xs):3d} median {statistics.median(xs[5:] or xs):6.2f} ms")
print("spans to host:", sum(len(v) for v in rows.values()))
