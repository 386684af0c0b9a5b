"""DistributedSamplers whose ranks' datasets or options differ: ``datasets.py SHORT_RANK``.

Every rank makes the samplers a script makes for its training and validation sets, each known
across ranks by the line that makes it (and its number there):
- ``alone``: rank 0's alone, for work of its own, made before the others.
- ``first``: over 40 samples, one fewer on rank SHORT_RANK (an incomplete copy on its Mac).
- ``second``: over 40 on every rank.
- ``own``: over a dataset of each rank's own length, for that rank alone (``num_replicas=1``).
- ``again``: the first again (a sampler made anew each epoch).
- ``shrinking``: two made at one line, over 30 and 20 samples, one fewer on rank 0.
- ``own_split``, ``same_split``, ``two_splits``: over the training part of a ``random_split``
  of 40 samples, made with each rank's own generator (macfleet seeds rank r's with seed + r),
  with one generator that every rank seeds alike, and with one seed for ranks 0 and 1 and
  another for rank 2.
- ``own_seed``: shuffled with a seed drawn from the rank's own generator (``torch.initial_seed()``).
Then every rank counts the samples of its shard of the first, and the ranks add them up.
"""

import sys

import torch
from torch.utils.data import TensorDataset, random_split

import macfleet

short = int(sys.argv[1])
macfleet.init()
rank = macfleet.rank()
if rank == 0:
    alone = macfleet.DistributedSampler(10)
first = macfleet.DistributedSampler(40 - (rank == short))
second = macfleet.DistributedSampler(TensorDataset(torch.arange(40)), shuffle=False)
own = macfleet.DistributedSampler(30 + rank, num_replicas=1, rank=0)
again = macfleet.DistributedSampler(40 - (rank == short))
for size in (30, 20):
    shrinking = macfleet.DistributedSampler(size - (rank == 0))
data = TensorDataset(torch.arange(40))
own_split = macfleet.DistributedSampler(random_split(data, [30, 10])[0])
same_split = macfleet.DistributedSampler(random_split(data, [30, 10], generator=torch.Generator().manual_seed(0))[0])
two_splits = macfleet.DistributedSampler(random_split(data, [30, 10], generator=torch.Generator().manual_seed(rank // 2))[0])
own_seed = macfleet.DistributedSampler(data, seed=torch.initial_seed())
seen = macfleet.all_reduce(torch.tensor([float(len(list(first)))]))
print(f"rank {rank}: {seen.item():.0f} samples in the shards", flush=True)
macfleet.shutdown()
