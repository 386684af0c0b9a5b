"""Two threads of rank 0 make collectives at once: ``two_threads.py DIR``.

Rank 0's thread ``sender`` starts an all-reduce, which cannot end before rank 1 joins it; rank
0's main thread then starts one of its own, and only once it has tried (DIR/tried) does rank 1
join. The main thread must be refused at once, and the sender, whose all-reduce ends, must be
told that its result cannot be trusted: on another rank the main thread's could have taken its
place. The main thread's error ends the script.
"""

import os
import sys
import threading
import time

import torch

import macfleet
from macfleet.runtime import runtime

directory = sys.argv[1]
macfleet.init()
if macfleet.rank() == 1:
    while not os.path.exists(os.path.join(directory, "tried")):  # rank 0's main thread has tried
        time.sleep(0.01)
    got = macfleet.all_reduce(torch.ones(4))
    print("rank 1 got", got.tolist(), flush=True)
    macfleet.barrier()  # rank 0 never comes: the launcher ends the job
    sys.exit(0)

outcome: dict[str, str] = {}


def send() -> None:
    try:
        macfleet.all_reduce(torch.ones(4))  # the sender's all-reduce
        outcome["sender"] = "returned"
    except macfleet.ConfigError as exc:
        outcome["sender"] = str(exc)


sender = threading.Thread(target=send, name="sender")
sender.start()
while runtime().collectives.current is None:  # the sender is inside its all-reduce
    time.sleep(0.001)
try:
    macfleet.all_reduce(torch.ones(4))  # the main thread's all-reduce
finally:
    open(os.path.join(directory, "tried"), "w").close()
    sender.join()
    print("sender:", outcome["sender"], flush=True)
