"""The benchmark's large model under macfleet.DataParallel alone, for a fixed time, printing
step-time medians every 100 steps (and the bare model's in the same processes first)."""
import os, statistics, sys, time
import torch
from torch import nn
from torch.nn import functional as F
import macfleet

macfleet.init(device="cpu")
torch.set_num_threads(int(os.environ.get("THREADS", "4")))
torch.manual_seed(0)
def build():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                         nn.Linear(4096, 1024), nn.ReLU(), nn.Linear(1024, 10))
g = torch.Generator().manual_seed(macfleet.rank())
x = torch.randn(128, 1024, generator=g); y = torch.randint(0, 10, (128,), generator=g)
mode = sys.argv[1]
model = build() if mode == "bare" else macfleet.DataParallel(build())
opt = torch.optim.SGD(model.parameters(), lr=0.01)
steps = int(sys.argv[2])
times, waits = [], []
while len(times) < steps:
    t = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    opt.step()
    times.append(time.perf_counter() - t)
    if mode != "bare":
        waits.append(model.last_wait_s)
    if len(times) % 100 == 0:
        print(f"{mode} steps {len(times)} median {statistics.median(times[-100:])*1e3:.1f} ms"
              + (f" wait {statistics.median(waits[-100:])*1e3:.1f} ms" if waits else ""), flush=True)
macfleet.shutdown()
