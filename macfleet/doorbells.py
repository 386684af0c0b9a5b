"""Doorbells: a rank that waits long at a shared-memory barrier sleeps until a rank arrives.

A barrier (``macfleet.shm``) waits by looking at the other ranks' counters. It looks without
sleeping for a moment, then would have to sleep between looks, and a sleep between looks wakes
late: with ``time.sleep(0.0002)`` a rank woke 95-195 us after the last rank arrived (16-core
machine), and that rank, the one every other waits for, then waited for the sleeper's share of
the reduction; between looks it still used 5% of a core. Shared memory
cannot wake a process, and Python has no futex; a pipe can. Each rank of a host has a FIFO in
the job's directory, and sleeps in ``select`` on its read end; a rank that arrives at a barrier
and sees a sleeper writes a byte to the sleeper's FIFO, which wakes it at once. ``LocalGroup``
says who sleeps in its control lines (see ``shm.ASLEEP`` for why no wake-up is missed).

A rank holds a write end of every FIFO of its host, its own included: that one keeps ``select``
from reporting the end of the file once the others have gone. A ring for a rank that has died
is dropped (its death is the liveness checks' to report). The FIFOs are unlinked once every
rank has opened them, so a crash leaves nothing behind; until then they are in the agent's
per-job directory, which it removes. A rank holds 2 + (ranks on its host) descriptors for them.
"""

from __future__ import annotations

import os
import selectors


class Doorbells:
    """The FIFOs of ``size`` ranks named ``{name}-bell{i}`` in ``directory``; ours is ``index``."""

    def __init__(self, directory: str, name: str, size: int, index: int) -> None:
        self.index = index
        self._paths = [os.path.join(directory, f"{name}-bell{i}") for i in range(size)]
        self._bells: list[int] = []  # write ends, by rank
        self._ear = -1  # our read end
        self._selector: selectors.BaseSelector | None = None
        try:
            os.mkfifo(self._paths[index], 0o600)
        except FileExistsError:  # left by a rank of this job and host that crashed before unlinking it
            os.unlink(self._paths[index])
            os.mkfifo(self._paths[index], 0o600)

    def open(self) -> None:
        """Open every rank's FIFO (each rank has made its own: they have all registered)."""
        flags = os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
        for i, path in enumerate(self._paths):
            ear = os.open(path, os.O_RDONLY | flags)  # first: a FIFO opens for writing only where it has a reader
            self._bells.append(os.open(path, os.O_WRONLY | flags))
            if i == self.index:
                self._ear = ear
            else:
                os.close(ear)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._ear, selectors.EVENT_READ)

    def unlink(self) -> None:
        """Remove our FIFO's name (every rank has opened it); the FIFO lives on while it is open."""
        try:
            os.unlink(self._paths[self.index])
        except FileNotFoundError:
            pass

    def ring(self, i: int) -> None:
        """Wake rank ``i`` if it sleeps (else its next sleep returns at once: it looks again)."""
        try:
            os.write(self._bells[i], b"\0")
        except BlockingIOError:
            pass  # its FIFO is full of rings it has not read yet: it is awake, or will be
        except BrokenPipeError:
            pass  # it has died

    def sleep(self, timeout_s: float) -> None:
        """Until our bell rings or ``timeout_s`` passes; rings heard are cleared."""
        assert self._selector is not None
        if self._selector.select(timeout_s):
            try:
                while os.read(self._ear, 4096):
                    pass
            except BlockingIOError:
                pass

    def close(self) -> None:
        if self._selector is not None:
            self._selector.close()
            self._selector = None
        for fd in self._bells + ([self._ear] if self._ear >= 0 else []):
            os.close(fd)
        self._bells, self._ear = [], -1
        self.unlink()  # closed before every rank had opened it
