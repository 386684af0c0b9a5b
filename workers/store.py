"""The job's torch.distributed store: ``python -m macfleet.workers.store FD ADDR PORT``.

Scripts that call ``init_process_group`` themselves meet at ``MASTER_ADDR:MASTER_PORT``. Left
to torch, rank 0 serves that TCPStore from inside the training process, so when rank 0 finished
first the other ranks lost their store in the middle of their own teardown; gloo then aborted
them (SIGABRT, "terminate called without an active exception"), 3 runs in 40 of a 3-rank DDP
script. As torchrun does, the agent on rank 0's host serves the store instead, for the whole
job, and tells the ranks so with ``TORCHELASTIC_USE_AGENT_STORE=True``.

This is a process of its own, not a thread of the agent, so that the agent never imports torch.
The agent binds and listens on the socket before its hello (the port is then known and cannot be
taken by someone else) and hands over the descriptor FD. The store lives until its stdin closes:
the agent ended it, or died.

Most jobs never use it (macfleet's own ranks meet through the launcher), so torch is imported,
and the store started, only once a first client knocks: until then the process is a few MB of
plain Python instead of a torch import competing with the ranks' own at every job's start, and
a client's connection waits in the socket's backlog for the second or two that takes.
"""

from __future__ import annotations

import select
import sys
import warnings


def main() -> None:
    if len(sys.argv) != 4:
        sys.exit("usage: python -m macfleet.workers.store FD ADDR PORT")
    fd, addr, port = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    # Its stderr is the launcher's terminal, unprefixed: torch's import-time warnings (no numpy
    # installed, say) would be one line there per job that no rank printed.
    warnings.simplefilter("ignore")
    if not _first_client(fd):
        return  # the job ended without a client
    from torch.distributed import TCPStore  # only now: the usage error above needs no torch

    try:
        store = TCPStore(addr, port, is_master=True, wait_for_workers=False, master_listen_fd=fd)
    except (RuntimeError, ValueError, OSError) as exc:
        sys.exit(f"macfleet: the torch.distributed store on {addr}:{port} did not start: {exc}")
    sys.stdin.buffer.read()  # until the agent closes our stdin
    del store


def _first_client(fd: int) -> bool:
    """Wait until a client's connection is pending on the listening socket (True), or stdin
    closes (False). The connection stays in the backlog for the store to accept."""
    readable, _, _ = select.select([fd, sys.stdin.fileno()], [], [])
    return fd in readable


if __name__ == "__main__":
    main()
