"""Train a fixed model for K steps on shards of one fixed batch; rank 0 saves the parameters.

``oracle.py STEPS OUT``. Shared with the test, which trains the same model on the whole batch
in one process: both must end with the same parameters.
"""

import sys

import torch
from torch import nn

import macfleet

BATCH = 24


def make_model():
    torch.manual_seed(1234)
    return nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 3))


def make_batch():
    g = torch.Generator().manual_seed(99)
    return torch.randn(BATCH, 10, generator=g), torch.randint(0, 3, (BATCH,), generator=g)


def make_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def main():
    steps, out = int(sys.argv[1]), sys.argv[2]
    macfleet.init()
    rank, world = macfleet.rank(), macfleet.world_size()
    model = macfleet.DataParallel(make_model())
    optimizer = make_optimizer(model)
    x, y = make_batch()
    shard = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
    for _ in range(steps):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x[shard]), y[shard]).backward()
        optimizer.step()
    if rank == 0:
        torch.save(model.module.state_dict(), out)
    macfleet.shutdown()


if __name__ == "__main__":
    main()
