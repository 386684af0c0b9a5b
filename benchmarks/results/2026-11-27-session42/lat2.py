import time, statistics, torch, macfleet
from macfleet import runtime as rt
macfleet.init()
r = macfleet.rank()
col = rt.runtime().collectives
local = col.local
def timeit(fn, n=1500):
    xs = []
    for rep in range(5):
        macfleet.barrier()
        t0 = time.perf_counter()
        for i in range(n): fn()
        xs.append((time.perf_counter() - t0) / n * 1e6)
    return min(xs), statistics.median(xs)
t = torch.zeros(1)
tests = {
  "local.barrier": local.barrier,
  "local.all_reduce": lambda: local.all_reduce(t, t, "sum"),
  "macfleet.all_reduce": lambda: macfleet.all_reduce(t),
  "macfleet.all_gather": lambda: macfleet.all_gather(t),
  "torch.add": lambda: torch.add(t, t, out=t),
  "perf_counter": time.perf_counter,
}
out = {k: timeit(f) for k, f in tests.items()}
if r == 0:
    print(f"N={macfleet.world_size()} threads={torch.get_num_threads()} " + "  ".join(f"{k} {a:.1f}/{b:.1f}us" for k, (a, b) in out.items()))
