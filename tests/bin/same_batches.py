"""``same_batches.py MODE``: a few training steps of a small model, each rank reading its data
as MODE says, after a warm-up step on a dummy batch (alike on every rank, before the loop):
- ``stream``: an IterableDataset that does not split itself: every rank streams all of it;
- ``by-local-rank``: one split into as many parts as the job has ranks, but by
  ``macfleet.local_rank()``, the rank on its Mac, where ``macfleet.rank()`` was meant;
- ``split``: one split by ``macfleet.rank()`` and ``macfleet.world_size()``;
- ``in-order``: a DataLoader over a TensorDataset with no sampler and ``shuffle=False``, the
  mistake rank 0's loaders check names.
No optimizer: the gradients are not the point, and torch's first one costs a second to import.
"""

import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

import macfleet


class Stream(IterableDataset):
    """48 samples of a seeded stream, every ``parts``-th from ``part`` on."""

    def __init__(self, part: int, parts: int) -> None:
        self.part, self.parts = part, parts

    def __iter__(self):
        g = torch.Generator().manual_seed(3)
        for i in range(48):
            x, y = torch.randn(6, generator=g), torch.randint(0, 3, (), generator=g)
            if i % self.parts == self.part:
                yield x, y


mode = sys.argv[1]
macfleet.init()
rank, world = macfleet.rank(), macfleet.world_size()
dataset = {"stream": lambda: Stream(0, 1),
           "by-local-rank": lambda: Stream(macfleet.local_rank(), world),
           "split": lambda: Stream(rank, world),
           "in-order": lambda: TensorDataset(*next(iter(DataLoader(Stream(0, 1), batch_size=48))))}[mode]()
model = macfleet.DataParallel(nn.Linear(6, 3))
loader = DataLoader(dataset, batch_size=4)
model(torch.zeros(2, 6)).sum().backward()  # the warm-up step
for x, y in loader:
    nn.functional.cross_entropy(model(x), y).backward()
print(f"rank {rank} trained", flush=True)
