"""The table of README section 2: medians, per rank, of where a step's wait for gradients goes
(one bucket), over the timeline's steps from the 51st on. Usage: tl_wait.py cnn_cuda_tl.json.
Each span's own median alone is what session 45's tl_summary.py prints."""
import json
import statistics as st
import sys
from collections import defaultdict

events = json.load(open(sys.argv[1]))
for pid in sorted({e["pid"] for e in events if e.get("ph") == "X"}):
    by = defaultdict(list)
    for e in events:
        if e.get("pid") == pid and e.get("ph") == "X":
            by[e["name"]].append(e)
    wait, to_host, reduce = (sorted(by[n], key=lambda e: e["ts"])[50:] for n in
                             ("waiting for gradients", "gradient bucket 0 to host", "all_reduce gradient bucket 0"))
    rows = {
        "waiting for gradients": [w["dur"] for w in wait],
        "wait's start -> copy to the host": [h["ts"] - w["ts"] for w, h in zip(wait, to_host)],
        "copy to the host": [h["dur"] for h in to_host],
        "all-reduce": [r["dur"] for r in reduce],
        "all-reduce's end -> wait's end": [(w["ts"] + w["dur"]) - (r["ts"] + r["dur"]) for w, r in zip(wait, reduce)],
    }
    for name, values in rows.items():
        print(f"rank {pid} {name:<36} {st.median(values):6.0f} us")
