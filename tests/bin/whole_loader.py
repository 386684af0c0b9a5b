"""A script ported from one process that kept its ``DataLoader(dataset, shuffle=True)``: every
rank reads the whole dataset. One epoch of a small model under DataParallel, after a warm-up
step on a dummy batch, taken when no loader is being iterated yet."""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import macfleet
import oracle

macfleet.init()
g = torch.Generator().manual_seed(7)
dataset = TensorDataset(torch.randn(96, 6, generator=g), torch.randint(0, 3, (96,), generator=g))
model = macfleet.DataParallel(nn.Linear(6, 3))
loader = DataLoader(dataset, batch_size=8, shuffle=True)
optimizer = oracle.MomentumSGD(model.parameters(), lr=0.1, momentum=0)  # not torch's: see oracle.py
model(torch.zeros(2, 6)).sum().backward()  # the warm-up step, outside the loop
optimizer.step()
optimizer.zero_grad()
steps = 0
for x, y in loader:
    nn.functional.cross_entropy(model(x), y).backward()  # the line the warning names
    optimizer.step()
    optimizer.zero_grad()
    steps += 1
print(f"rank {macfleet.rank()} took {steps} steps")
