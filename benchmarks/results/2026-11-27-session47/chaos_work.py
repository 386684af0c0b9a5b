"""Chaos workload: DataParallel training with a DataLoader worker, forever (until killed)."""
import sys
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
import macfleet

macfleet.init()
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
dev = macfleet.device()
model = macfleet.DataParallel(net.to(dev), bucket_cap_mb=1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
ds = TensorDataset(torch.randn(4096, 256), torch.randint(0, 10, (4096,)))
sampler = macfleet.DistributedSampler(ds, shuffle=True)
workers = int(sys.argv[1]) if len(sys.argv) > 1 else 1
loader = DataLoader(ds, batch_size=64, sampler=sampler, num_workers=workers)
print("READY", flush=True)
epoch = 0
while True:
    sampler.set_epoch(epoch)
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x.to(dev)), y.to(dev))
        opt.zero_grad()
        loss.backward()
        opt.step()
        t = torch.ones(100_000, device=dev)
        macfleet.all_reduce(t)
        assert t[0].item() == macfleet.world_size()
        step = getattr(sys.modules[__name__], "step", 0) + 1
        sys.modules[__name__].step = step
        if step % 20 == 0 and macfleet.rank() == 0:
            print("STEP", step, flush=True)
    epoch += 1
