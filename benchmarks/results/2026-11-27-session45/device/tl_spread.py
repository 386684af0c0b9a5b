"""Per bucket: spread of the ranks' starts, and time from the last start to the end; waits."""
import json, statistics, sys
from collections import defaultdict
ev = json.load(open(sys.argv[1]))
ops = defaultdict(dict); names = {}
for e in ev:
    if e.get("ph") == "X" and "op" in e.get("args", {}) and "gradient bucket" in e["name"]:
        ops[e["args"]["op"]][e["pid"]] = (e["ts"], e["ts"] + e["dur"]); names[e["args"]["op"]] = e["name"][-1]
by = defaultdict(list)
for op, d in sorted(ops.items())[20:]:
    s = [a for a, _ in d.values()]; t = [b for _, b in d.values()]
    by[names[op]].append(((max(s) - min(s)) / 1e3, (max(t) - max(s)) / 1e3))
for k, v in sorted(by.items()):
    print(f"  bucket {k}: start spread {statistics.median(x[0] for x in v):6.2f} ms, last start -> end {statistics.median(x[1] for x in v):6.2f} ms")
w = defaultdict(list)
for e in ev:
    if e["name"] == "waiting for gradients": w[e["pid"]].append(e["dur"] / 1e3)
print("  wait ms per rank", {k: round(statistics.median(v[5:]), 1) for k, v in sorted(w.items())})
