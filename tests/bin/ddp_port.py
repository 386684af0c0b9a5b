"""A torchrun script with DDP, and its port to macfleet by README's table: ``ddp_port.py ddp|macfleet OUT``.

The two share every line but those the table names: the start, the device, the wrapping (the
port keeps DDP's ``device_ids=[local_rank]``), the sampler, the rank and world size, the
collectives and the end. Both train the same model on the same data for two epochs; rank 0
saves the parameters, the losses averaged over the ranks and what the other collectives gave
to OUT, for the test to compare. DDP runs on gloo, so on the CPU, where DDP takes no
``device_ids``.
"""

import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

mode, out = sys.argv[1], sys.argv[2]
local_rank = int(os.environ["LOCAL_RANK"])
if mode == "ddp":
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data.distributed import DistributedSampler

    dist.init_process_group("gloo")
    device = torch.device("cpu")
    rank, world = dist.get_rank(), dist.get_world_size()
else:
    import macfleet

    macfleet.init()
    device = macfleet.device()
    rank, world = macfleet.rank(), macfleet.world_size()

torch.manual_seed(0)
g = torch.Generator().manual_seed(7)
dataset = TensorDataset(torch.randn(96, 6, generator=g), torch.randint(0, 3, (96,), generator=g))
net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3)).to(device)
if mode == "ddp":
    model = DistributedDataParallel(net)
    sampler = DistributedSampler(dataset, shuffle=True, seed=3)
else:
    model = macfleet.DataParallel(net, device_ids=[local_rank])
    sampler = macfleet.DistributedSampler(dataset, shuffle=True, seed=3)
loader = DataLoader(dataset, batch_size=8, sampler=sampler)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
losses = []
for epoch in range(2):
    sampler.set_epoch(epoch)
    for x, y in loader:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device))
        loss.backward()
        optimizer.step()
        mean = loss.detach().clone()
        if mode == "ddp":  # gloo has no AVG
            dist.all_reduce(mean)
            mean /= world
        else:
            macfleet.all_reduce(mean, "avg")
        losses.append(mean.item())
first = torch.tensor([float(rank)])
if mode == "ddp":
    dist.broadcast(first, 1)
    ranks = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(ranks, torch.tensor([rank * 10.0]))
    gathered = torch.stack(ranks)
else:
    macfleet.broadcast(first, 1)
    gathered = macfleet.all_gather(torch.tensor([rank * 10.0]))
if rank == 0:
    torch.save({"params": {k: v.detach().cpu() for k, v in net.state_dict().items()}, "losses": losses,
                "broadcast": first.item(), "gathered": gathered.flatten().tolist()}, out)
if mode == "ddp":
    dist.destroy_process_group()
else:
    macfleet.shutdown()
