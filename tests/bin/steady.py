"""All-reduce known tensors until told to stop, checking every result; for the fuzzer.

``steady.py STOPFILE [GAP_S]``: prints ``ENDPOINTS {...}`` (this rank's ring sockets and the
coordinator), then loops, resting GAP_S between rounds (none by default: the fuzzer wants the
traffic; a test that only waits wants the processor left to the rest of the suite); rank 0
ends the loop for everyone once STOPFILE exists. At the end each rank prints how many results
were wrong (must be 0) and how many frames it dropped.
"""

import json
import os
import sys
import time

import torch

import macfleet
from macfleet.runtime import runtime

macfleet.init()
rank, world = macfleet.rank(), macfleet.world_size()
ring = runtime().collectives.rings[0]  # of all ranks, or of the hosts' leaders (one rank per host)
print("ENDPOINTS " + json.dumps({"rank": rank, "ring": ring.endpoints(),
                                 "coordinator": os.environ.get("MACFLEET_COORDINATOR")}), flush=True)
wrong = iterations = 0
gap = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
sizes = [7, 1000, 300_000, 2_000_000]  # latency path, one chunk, the pipelined ring, zero-copy sends and settle
while True:
    stop = macfleet.broadcast(torch.tensor([int(rank == 0 and os.path.exists(sys.argv[1]))]))
    if stop.item():
        break
    n = sizes[iterations % len(sizes)]
    t = torch.arange(n, dtype=torch.float32) + rank
    macfleet.all_reduce(t)
    wrong += int(not torch.equal(t, world * torch.arange(n, dtype=torch.float32) + sum(range(world))))
    iterations += 1
    time.sleep(gap)  # a rest, not a synchronisation: the broadcast above is that
print(f"RESULT wrong={wrong} iterations={iterations} dropped={ring.dropped}", flush=True)
macfleet.shutdown()
sys.exit(1 if wrong else 0)
