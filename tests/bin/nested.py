"""A collective started while another of the same rank is under way: ``nested.py MODE DIR``.

Rank 0 starts an all-reduce, which cannot end before rank 1 joins it, and rank 1 joins only
once rank 0 has tried the second collective (DIR/tried says so). MODE ``threads``: the first is
thread ``sender``'s, the second the main thread's, which must be refused at once; the sender's
all-reduce ends, and must then say that its result cannot be trusted (on another rank the main
thread's could have taken its place). ``handler``: the first is the main thread's, the second a
SIGUSR1 handler's ``checkpoint.save`` (the habit of saving on a preemption signal), which runs
on the main thread inside the first. Either way the refused collective's error ends the script.
``exit``: the first is a daemon thread's, and the script ends while it is under way; rank 1
joins it once rank 0 is leaving the job (``macfleet.shutdown`` at the script's end), which must
not close the sockets and shared memory under it.
"""

import os
import signal
import sys
import threading
import time

import torch
from torch import nn

import macfleet
from macfleet import runtime as rt
from macfleet.runtime import runtime

mode, directory = sys.argv[1], sys.argv[2]
macfleet.init()


def tried() -> None:
    open(os.path.join(directory, "tried"), "w").close()


def inside() -> None:
    """Until this rank is inside a collective (rank 1, not there yet, holds it up)."""
    while runtime().collectives.current is None:
        time.sleep(0.001)


if macfleet.rank() == 1:
    while not os.path.exists(os.path.join(directory, "tried")):  # rank 0 has tried its second collective
        time.sleep(0.01)
    got = macfleet.all_reduce(torch.ones(4))
    print("rank 1 got", got.tolist(), flush=True)
    if mode != "exit":
        macfleet.barrier()  # rank 0 never comes: the launcher ends the job
elif mode == "threads":
    outcome: dict[str, str] = {}

    def send() -> None:
        try:
            macfleet.all_reduce(torch.ones(4))  # the sender's all-reduce
            outcome["sender"] = "returned"
        except macfleet.ConfigError as exc:
            outcome["sender"] = str(exc)

    sender = threading.Thread(target=send, name="sender")
    sender.start()
    inside()
    try:
        macfleet.all_reduce(torch.ones(4))  # the main thread's all-reduce
    finally:
        tried()
        sender.join()
        print("sender:", outcome["sender"], flush=True)
elif mode == "exit":
    def send_late() -> None:
        got = macfleet.all_reduce(torch.ones(4))  # the daemon's all-reduce
        print("sender got", got.tolist(), flush=True)

    def leaving() -> None:
        while rt._runtime is not None:  # until shutdown has begun
            time.sleep(0.001)
        tried()

    threading.Thread(target=send_late, name="sender", daemon=True).start()
    inside()
    threading.Thread(target=leaving, daemon=True).start()
else:
    def save_on_signal(signum: int, frame: object) -> None:
        try:
            macfleet.checkpoint.save(os.path.join(directory, "ckpt.pt"), nn.Linear(2, 2))  # the handler's save
        finally:
            tried()

    signal.signal(signal.SIGUSR1, save_on_signal)
    threading.Thread(target=lambda: (inside(), os.kill(os.getpid(), signal.SIGUSR1))).start()
    macfleet.all_reduce(torch.ones(4))  # the all-reduce the handler interrupts
