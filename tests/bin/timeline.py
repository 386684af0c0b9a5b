"""A few DataParallel steps of a model of three buckets, then an all-reduce of the script's own,
for ``launch --timeline``. ``fail-at STEP``: rank 1 raises in that step's forward."""

import sys

import torch
from torch import nn

import macfleet
import oracle

STEPS = 3

macfleet.init()
fail_at = int(sys.argv[2]) if sys.argv[1:2] == ["fail-at"] else -1
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
model = macfleet.DataParallel(net, bucket_cap_mb=0.5, first_bucket_mb=0.01)  # 3 buckets: 20 KB, 1 MB, 130 KB
assert len(model.buckets) == 3, len(model.buckets)
opt = oracle.MomentumSGD(model.parameters(), lr=0.1, momentum=0)  # not torch's: see oracle.py
for step in range(STEPS):
    if step == fail_at and macfleet.rank() == 1:
        raise RuntimeError(f"deliberate failure in step {step}")
    loss = model(torch.randn(32, 64)).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
macfleet.all_reduce(torch.ones(3), name="metric")
print("trained")
