"""``cuda_same.py MODE``: tests/bin/same_batches.py's stream on the GPU: the model and each batch
on CUDA, so the digests of the inputs are read through a copy of their first rows to the host.
``stream``: every rank streams all of it (the launcher should name every rank); ``split``: by
``macfleet.rank()`` (it should say nothing)."""

import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

import macfleet


class Stream(IterableDataset):
    def __init__(self, part, parts):
        self.part, self.parts = part, parts

    def __iter__(self):
        g = torch.Generator().manual_seed(3)
        for i in range(48):
            x, y = torch.randn(6, generator=g), torch.randint(0, 3, (), generator=g)
            if i % self.parts == self.part:
                yield x, y


macfleet.init()
device = macfleet.device()
rank, world = macfleet.rank(), macfleet.world_size()
data = Stream(0, 1) if sys.argv[1] == "stream" else Stream(rank, world)
model = macfleet.DataParallel(nn.Linear(6, 3).to(device))
for x, y in DataLoader(data, batch_size=4):
    x, y = x.to(device), y.to(device)
    nn.functional.cross_entropy(model(x), y).backward()
print(f"rank {rank} trained on {x.device}", flush=True)
