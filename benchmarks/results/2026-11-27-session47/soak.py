"""Train a small model for a long time; print each rank's RSS and open fds as it goes."""
import os, sys, time
import torch
from torch import nn
import macfleet

def rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024

macfleet.init()
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
dev = macfleet.device()
model = macfleet.DataParallel(net.to(dev), bucket_cap_mb=0.5, first_bucket_mb=0.1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 128, device=dev), torch.randint(0, 10, (32,), device=dev)
steps, every = int(sys.argv[1]), int(sys.argv[2])
t0 = time.time()
for step in range(1, steps + 1):
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    m = macfleet.all_reduce(torch.tensor([loss.item()]), op="avg")
    if step % 7 == 0:
        macfleet.all_gather_object({"step": step})
        macfleet.broadcast(torch.randn(3000, device=dev), 0)
    if step % every == 0:
        print(f"step {step} rss {rss_mb():.1f} MB fds {len(os.listdir('/proc/self/fd'))} threads {len(os.listdir('/proc/self/task'))} mem {macfleet.memory()} {time.time()-t0:.0f}s", flush=True)
