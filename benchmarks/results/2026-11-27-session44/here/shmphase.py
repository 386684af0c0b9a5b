import time, sys, collections
import torch
import macfleet
from macfleet import shm

acc = collections.defaultdict(float)
def wrap(name):
    orig = getattr(shm.LocalGroup, name)
    def f(self, *a, **k):
        s = time.perf_counter()
        try:
            return orig(self, *a, **k)
        finally:
            acc[name] += time.perf_counter() - s
    setattr(shm.LocalGroup, name, f)
for n in ("barrier", "_copy_in", "_copy_out", "_reduce_share"):
    wrap(n)
macfleet.init()
mb = int(sys.argv[1]) if len(sys.argv) > 1 else 64
x = torch.randn((mb << 20) // 4)
for _ in range(3):
    macfleet.all_reduce(x)
acc.clear()
reps = 10
s = time.perf_counter()
for _ in range(reps):
    macfleet.all_reduce(x)
tot = (time.perf_counter() - s) / reps * 1e3
print(f"rank {macfleet.rank()} threads {torch.get_num_threads()} total {tot:.2f} ms; " +
      " ".join(f"{k} {v/reps*1e3:.2f}" for k, v in acc.items()), flush=True)
macfleet.shutdown()
