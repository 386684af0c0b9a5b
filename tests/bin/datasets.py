"""Samplers over datasets of different lengths: ``datasets.py SHORT_RANK``.

Every rank makes three DistributedSamplers, as a script makes them for its training and
validation sets: the first over 40 samples, one fewer on rank SHORT_RANK (an incomplete copy of
the data on its Mac); the second over 40 on every rank; the third over a dataset of each rank's
own length, for that rank alone (``num_replicas=1, rank=0``), as a script may make one for work
of its own; the fourth as the first again (a script that makes its sampler anew each epoch).
The fifth, sixth and seventh are over the training part of a ``random_split`` of 40 samples:
made with each rank's own generator (macfleet seeds rank r's with seed + r), then with one
generator that every rank seeds alike, then with one seed for ranks 0 and 1 and another for 2.
The eighth shuffles with a seed drawn from the rank's own generator (``torch.initial_seed()``,
seed + rank under macfleet). Then every rank counts the samples of its shard of the first, and the
ranks add them up.
"""

import sys

import torch
from torch.utils.data import TensorDataset, random_split

import macfleet

short = int(sys.argv[1])
macfleet.init()
rank = macfleet.rank()
first = macfleet.DistributedSampler(40 - (rank == short))
second = macfleet.DistributedSampler(TensorDataset(torch.arange(40)), shuffle=False)
own = macfleet.DistributedSampler(30 + rank, num_replicas=1, rank=0)
again = macfleet.DistributedSampler(40 - (rank == short))
data = TensorDataset(torch.arange(40))
own_split = macfleet.DistributedSampler(random_split(data, [30, 10])[0])
same_split = macfleet.DistributedSampler(random_split(data, [30, 10], generator=torch.Generator().manual_seed(0))[0])
two_splits = macfleet.DistributedSampler(random_split(data, [30, 10], generator=torch.Generator().manual_seed(rank // 2))[0])
own_seed = macfleet.DistributedSampler(data, seed=torch.initial_seed())
seen = macfleet.all_reduce(torch.tensor([float(len(list(first)))]))
print(f"rank {rank}: {seen.item():.0f} samples in the shards", flush=True)
macfleet.shutdown()
