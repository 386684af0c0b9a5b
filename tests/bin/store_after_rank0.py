"""A torchrun-style script whose rank 0 leaves first: the others still use the job's store.

Under torch's own default, rank 0 serves the TCPStore at MASTER_ADDR:MASTER_PORT, so once it
has exited the other ranks' store calls fail. Under macfleet (as under torchrun) rank 0's agent
serves it until the last rank of the job is out.
"""

import os
import sys
import time

import torch.distributed as dist

dist.init_process_group("gloo")  # env://
store = dist.distributed_c10d._get_default_store()
rank, world = dist.get_rank(), dist.get_world_size()
if rank == 0:
    store.set("rank0_pid", str(os.getpid()))
    # Until every rank is through init_process_group: gloo connects every pair of ranks there,
    # and a rank still connecting to rank 0 when it goes fails ("Connection closed by peer").
    store.wait([f"joined_{r}" for r in range(1, world)])
    sys.stdout.flush()
    os._exit(0)  # gone at once, with no teardown at all
store.set(f"joined_{rank}", "yes")
pid = int(store.get("rank0_pid"))
deadline = time.monotonic() + 30
while time.monotonic() < deadline:  # the test's "hosts" share one machine, so rank 0's pid is visible
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        break
    time.sleep(0.01)  # polling for rank 0's exit to be reaped
else:
    sys.exit("rank 0 did not exit")
store.set(f"after_{rank}", "yes")
print(f"store served rank {rank} after rank 0 left: {store.get(f'after_{rank}').decode()}", flush=True)
os._exit(0)  # skip gloo's teardown: its peer rank 0 is gone
