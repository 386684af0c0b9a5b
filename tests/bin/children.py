"""A rank's own subprocesses, which must never act as the rank: ``children.py MODE``.

``spawn``: a DataLoader with 'spawn' workers (macOS's default) in a script with no
``if __name__ == "__main__":`` guard, so every worker re-runs this file, ``macfleet.init()``
included. ``fork``: a child forked after ``macfleet.init()`` exits normally (running the
inherited atexit hooks), then the rank raises, and its report must still have its traceback.
``fork-collective``: a dataset whose items are all-reduced, by mistake, in 'fork' workers
(Linux's default), which inherit the rank's runtime, sockets and shared memory; the rank
prints the time at which its loader started and the time of its exit hooks.
"""

import atexit
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

import macfleet

mode = sys.argv[1]
macfleet.init()
if mode == "spawn":
    data = TensorDataset(torch.arange(16.0))
    for (batch,) in DataLoader(data, batch_size=4, num_workers=1, multiprocessing_context="spawn"):
        macfleet.all_reduce(batch)
    print("finished", flush=True)
elif mode == "fork-collective":
    class Reduced(torch.utils.data.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            return macfleet.all_reduce(torch.ones(4))

    atexit.register(lambda: print(f"exiting at {time.monotonic():.3f}", flush=True))
    print(f"loading at {time.monotonic():.3f}", flush=True)
    for batch in DataLoader(Reduced(), batch_size=2, num_workers=1, multiprocessing_context="fork"):
        print(f"batch {batch.sum().item()}", flush=True)  # what the test must never see
    print("finished", flush=True)
elif mode == "fork":
    child = os.fork()
    if child == 0:
        sys.exit(0)  # a normal exit: the inherited macfleet.shutdown runs at exit
    os.waitpid(child, 0)
    macfleet.barrier()
    raise ValueError(f"rank {macfleet.rank()} fails after its child")
