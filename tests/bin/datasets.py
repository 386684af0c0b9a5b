"""Samplers over datasets of different lengths: ``datasets.py SHORT_RANK``.

Every rank makes three DistributedSamplers, as a script makes them for its training and
validation sets: the first over 40 samples, one fewer on rank SHORT_RANK (an incomplete copy of
the data on its Mac); the second over 40 on every rank; the third over a dataset of each rank's
own length, for that rank alone (``num_replicas=1, rank=0``), as a script may make one for work
of its own; the fourth as the first again (a script that makes its sampler anew each epoch).
Then every rank counts the samples of its shard of the first, and the ranks add them up.
"""

import sys

import torch
from torch.utils.data import TensorDataset

import macfleet

short = int(sys.argv[1])
macfleet.init()
rank = macfleet.rank()
first = macfleet.DistributedSampler(40 - (rank == short))
second = macfleet.DistributedSampler(TensorDataset(torch.arange(40)), shuffle=False)
own = macfleet.DistributedSampler(30 + rank, num_replicas=1, rank=0)
again = macfleet.DistributedSampler(40 - (rank == short))
seen = macfleet.all_reduce(torch.tensor([float(len(list(first)))]))
print(f"rank {rank}: {seen.item():.0f} samples in the shards", flush=True)
macfleet.shutdown()
