"""16 MiB all-reduces back to back for a few seconds (profiling target)."""
import os, time
import torch
import macfleet
def threads():
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            comm = open(f"/proc/self/task/{tid}/comm").read().strip()
            f = open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()
            out[tid] = (comm, int(f[11]), int(f[12]), int(f[7]))
        except OSError:
            pass
    return out
macfleet.init(device="cpu")
size = int(os.environ.get("LOOP_BYTES", 16 << 20)) // 4
t = torch.ones(size)
for _ in range(3):
    macfleet.all_reduce(t)
n = 0
before = threads()
start = time.perf_counter()
limit = float(os.environ.get("LOOP_S", "4"))
while True:
    macfleet.all_reduce(t)
    n += 1
    c = torch.tensor([int(time.perf_counter() - start > limit)]); macfleet.all_reduce(c, "max")
    if c.item():
        break
el = time.perf_counter() - start
if os.environ.get("LOOP_THREADS"):
    after = threads()
    tot_u = sum(u - before.get(t, (0, 0, 0, 0))[1] for t, (c, u, s, _) in after.items())
    tot_s = sum(s - before.get(t, (0, 0, 0, 0))[2] for t, (c, u, s, _) in after.items())
    rows = sorted(((u + s - before.get(t, (0, 0, 0, 0))[1] - before.get(t, (0, 0, 0, 0))[2], c, u - before.get(t, (0, 0, 0, 0))[1], s - before.get(t, (0, 0, 0, 0))[2]) for t, (c, u, s, _) in after.items()), reverse=True)
    flt = sum(v[3] - before.get(t, (0, 0, 0, 0))[3] for t, v in after.items())
    print(f"rank {macfleet.rank()} minor faults per op {flt / n:.0f}")
    print(f"rank {macfleet.rank()} wall {el:.2f}s user {tot_u/100:.2f}s sys {tot_s/100:.2f}s per op user {tot_u*10/n:.2f}ms sys {tot_s*10/n:.2f}ms", flush=True)
    for tot, c, u, s in rows[:10]:
        if tot:
            print(f"   {c:<20} user {u*10/n:6.2f} ms/op  sys {s*10/n:6.2f} ms/op", flush=True)
if macfleet.rank() == 0:
    print(f"LOOP {size*4>>20} MiB: {n} all-reduces, {el / n * 1e3:.2f} ms each", flush=True)
macfleet.shutdown()
