"""Ranks that run at different speeds: ``pace.py SLOW_RANK MODE STEPS``.

Every rank does 0.1 s of work before each step and rank SLOW_RANK 0.3 s more, as a Mac four
times slower would, so the others wait for it at every exchange. MODE ``collectives``: a step
is one all-reduce from the script; ``dp``: a DataParallel training step of a model with several
buckets, whose exchange runs on the communication thread while the script waits at the end of
backward.
Each rank prints how long its loop took, and how long since it joined the job.
"""

import sys
import time

import torch
from torch import nn

import macfleet
import oracle

slow_rank, mode, steps = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
macfleet.init()
joined = time.monotonic()
model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64), nn.Linear(64, 64))
net = macfleet.DataParallel(model, bucket_cap_mb=0.01, first_bucket_mb=0.01) if mode == "dp" else model
assert mode != "dp" or len(net.buckets) > 1, "the model must take the communication thread"
optimizer = oracle.MomentumSGD(model.parameters(), lr=0.01, momentum=0)  # not torch's: see oracle.py
started = time.monotonic()
for _ in range(steps):
    time.sleep(0.4 if macfleet.rank() == slow_rank else 0.1)  # the workload itself, not a synchronisation
    if mode == "dp":
        optimizer.zero_grad()
        net(torch.randn(8, 64)).sum().backward()
        optimizer.step()
    else:
        macfleet.all_reduce(torch.ones(1024))
ended = time.monotonic()
print(f"timing loop_s={ended - started:.3f} total_s={ended - joined:.3f}", flush=True)
