"""An unmodified torchrun-style DDP script (gloo, env:// rendezvous): no macfleet import."""

import os

import torch
import torch.distributed as dist
from torch import nn

dist.init_process_group("gloo")  # reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
rank, world = dist.get_rank(), dist.get_world_size()
assert world == int(os.environ["WORLD_SIZE"]) and rank == int(os.environ["RANK"])
torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(nn.Linear(8, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
g = torch.Generator().manual_seed(rank)
for _ in range(3):
    optimizer.zero_grad()
    model(torch.randn(4, 8, generator=g)).pow(2).mean().backward()
    optimizer.step()
flat = torch.cat([p.detach().flatten() for p in model.parameters()])
low, high = flat.clone(), flat.clone()
dist.all_reduce(low, dist.ReduceOp.MIN)
dist.all_reduce(high, dist.ReduceOp.MAX)
assert torch.equal(low, high), "ranks disagree on the parameters"
print(f"ddp ok rank {rank} of {world} local {os.environ['LOCAL_RANK']}/{os.environ['LOCAL_WORLD_SIZE']}")
dist.destroy_process_group()
