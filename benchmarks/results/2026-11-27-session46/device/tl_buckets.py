"""Per step of rank R (default 0): backward, each bucket's readiness and all-reduce (ms from the
backward's start), the wait; medians over steps 4 on."""
import json, statistics, sys, re
rank = int(sys.argv[2]) if len(sys.argv) > 2 else 0
ev = sorted((e for e in json.load(open(sys.argv[1])) if e.get("pid") == rank and "ts" in e), key=lambda e: e["ts"])
steps, cur = [], None
for e in ev:
    n = e["name"]
    if n.startswith("backward"):
        cur = {"t0": e["ts"], "backward": e["dur"] / 1000}
        steps.append(cur)
        continue
    if cur is None: continue
    m = re.match(r"gradient bucket (\d+) ready", n)
    if m: cur[f"b{m.group(1)} ready"] = (e["ts"] - cur["t0"]) / 1000
    m = re.match(r"all_reduce gradient bucket (\d+)$", n)
    if m and e.get("ph") == "X":
        cur[f"b{m.group(1)} start"] = (e["ts"] - cur["t0"]) / 1000
        cur[f"b{m.group(1)} dur"] = e["dur"] / 1000
    if n == "waiting for gradients": cur["wait"] = e["dur"] / 1000
    if n == "forward": cur["forward"] = e["dur"] / 1000
keys = sorted({k for s in steps for k in s if k != "t0"})
for k in keys:
    xs = [s[k] for s in steps[4:] if k in s]
    if xs: print(f"{k:12s} {statistics.median(xs):8.2f}  (n={len(xs)})")
