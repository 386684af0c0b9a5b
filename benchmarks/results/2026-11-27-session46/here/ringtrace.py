import time, torch, macfleet
from macfleet import ring_algorithms as ra
macfleet.init()
t = torch.ones(6 << 20)
for k in range(3):
    macfleet.barrier()
    ra.TRACE.clear()
    s = time.perf_counter()
    macfleet.all_reduce(t)
    e = time.perf_counter()
    if k == 2:
        for ts, ch, what in sorted(ra.TRACE):
            print(f"rank {macfleet.rank()} {1000*(ts-s):8.2f} ch{ch:03d} {what}")
        print(f"rank {macfleet.rank()} total {1000*(e-s):.2f} ms")
