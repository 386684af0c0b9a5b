import time, statistics, random
import macfleet
from macfleet import runtime as rt
macfleet.init()
rank = macfleet.rank()
local = rt.runtime().collectives.local
orig = local.barrier
marks = []
def barrier():
    marks.append(("in", time.perf_counter()))
    orig()
    marks.append(("out", time.perf_counter()))
local.barrier = barrier
def spin(ms):
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        pass
delays = [0.3, 3.0, 6.0] * 100
random.Random(0).shuffle(delays)
rows = []
for d in delays:
    macfleet.barrier()
    if rank == 1:
        spin(d)
    marks.clear()
    t = time.perf_counter()
    macfleet.barrier()
    e = time.perf_counter()
    rows.append((t, e, list(marks)))
allr = macfleet.all_gather_object(rows)
if rank == 0:
    by = {}
    for d, r0, r1 in zip(delays, allr[0], allr[1]):
        entered1 = r1[0]
        # rank 0: time its first barrier returned, relative to rank 1 entering its collective / its first barrier
        outs0 = [t for k, t in r0[2] if k == "out"]
        ins1 = [t for k, t in r1[2] if k == "in"]
        by.setdefault(d, []).append(((outs0[0] - ins1[0]) * 1e6, (r0[1] - entered1) * 1e6, (ins1[0] - entered1) * 1e6, len(outs0)))
    for d in sorted(by):
        xs = by[d]
        med = lambda k: statistics.median(x[k] for x in xs)
        print(f"waited {d:3.1f} ms: r0 first barrier out {med(0):6.1f} us after r1's barrier in; r0 done {med(1):6.1f} after r1 entered; r1 reached barrier {med(2):5.1f} us after entering; barriers {xs[0][3]}")
