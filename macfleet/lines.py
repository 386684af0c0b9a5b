"""Cut a process's output into pieces to forward: whole lines, and an unfinished line once the
process has gone quiet for a moment.

Progress bars (tqdm, ``print(..., end="\\r")``) redraw with ``\\r`` and write no newline until
they finish: forwarded at newlines only, a rank's bar showed nothing for a whole epoch, then
every redraw at once. So ``\\r`` ends a piece too, and what is left unfinished is forwarded after
``SETTLE_S`` of silence. Not sooner: ``print`` writes its text and its newline in two calls, and
a line forwarded in two pieces can be split by another host's line landing between them on the
launcher's terminal. A piece keeps its ending, so a terminal still redraws the line in place.
"""

from __future__ import annotations

import errno
import os
import select
import sys
from typing import Iterator

SETTLE_S = 0.2  # quiet this long, and an unfinished line is shown as it is
LONGEST = 1 << 20  # an unfinished line this long is a piece already (binary output, a line with no end)


def pieces(fd: int, settle_s: float = SETTLE_S, ended: int | None = None) -> Iterator[bytes]:
    """What is read from ``fd`` until its end, cut after every ``\\n``, ``\\r`` or ``\\r\\n``; an
    unfinished rest is a piece of its own once nothing more has come for ``settle_s``.

    ``ended``: a descriptor that turns readable once the writer has exited. Its children may
    still hold ``fd`` open (a script's background process), so the end of ``fd`` may be far
    off; the first time ``ended`` is readable and ``fd`` has nothing more, an empty piece says
    that all the writer wrote has been yielded (its unfinished line too, at once)."""
    pending = b""
    # poll, not select: select refuses descriptors from 1024 on (FD_SETSIZE), which an agent of
    # 150-odd ranks reaches; its pump threads died and the ranks' output was lost.
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    if ended is not None:
        poller.register(ended, select.POLLIN)
    while True:
        ready = [f for f, _ in poller.poll(settle_s * 1000 if pending else None)]
        if not ready:
            yield pending  # quiet: show the unfinished line (a progress bar) as it is
            pending = b""
            continue
        if fd not in ready:  # the writer has exited, and every byte it wrote has been read
            poller.unregister(ended)
            if pending:
                yield pending
                pending = b""
            yield b""
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        pending += chunk
        start = 0
        while True:
            ends = [i for i in (pending.find(b"\n", start), pending.find(b"\r", start)) if i >= 0]
            if not ends:
                break
            cut = min(ends)
            if pending[cut] == 13 and cut + 1 == len(pending):
                break  # a \r last: whether \n follows is for the next read to tell (or the quiet)
            if pending[cut: cut + 2] == b"\r\n":
                cut += 1
            yield pending[start: cut + 1]
            start = cut + 1
        pending = pending[start:]
        if len(pending) >= LONGEST:  # else every read would copy all that is pending: quadratic
            yield pending
            pending = b""
    if pending:
        yield pending


NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # a file that takes no more, where a reader gone is EPIPE


def forward_nowhere(fd: int, error: OSError | None = None) -> None:
    """Whatever read ``fd`` (our stdout or stderr) has gone (``... | head``, a closed terminal,
    an ssh channel closed at the launcher's end): point it at /dev/null. Later writes, and the
    interpreter's last flush of what its buffer still holds, then succeed with nothing shown,
    instead of raising ``BrokenPipeError`` where nobody can read the traceback. (A closed
    ``fd``, see ``reopen_closed_std_streams``, is opened on /dev/null.)

    Where the ``error`` was no reader gone but a file with no room (``macfleet launch ... >
    out.txt`` on a full disk), stdout's loss is said on stderr, which may still reach someone."""
    devnull = os.open(os.devnull, os.O_RDWR)  # the lowest free number: ``fd`` itself where it was closed
    if devnull != fd:
        os.dup2(devnull, fd)
        os.close(devnull)
    os.set_inheritable(fd, True)  # os.open's are not: children would start with it closed
    if fd == 1 and error is not None and error.errno in NO_ROOM:
        try:
            os.write(2, f"macfleet: cannot write the ranks' output ({error.strerror}): the rest of it is dropped "
                        f"(--log-dir keeps each rank's)\n".encode())
        except OSError:
            pass  # stderr has no room either


def reopen_closed_std_streams() -> None:
    """A process started with stdin, stdout or stderr closed (``macfleet launch ... >&-``, a
    scheduler that closes them): Python leaves ``sys.stdout`` None, on which the launcher
    crashed, and the next descriptor it opened (a pipe, a socket) would take that number and
    become its children's output. Each closed one is /dev/null instead, as for a daemon."""
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        try:
            os.fstat(fd)
        except OSError:
            forward_nowhere(fd)
            setattr(sys, name, open(fd, "r" if fd == 0 else "w", closefd=False))


def ends_line(piece: bytes) -> bool:
    return piece.endswith((b"\n", b"\r"))


class WholeLines:
    """Pieces put back together into lines, for a tail of the last ones (the error report)."""

    def __init__(self) -> None:
        self._partial = b""

    def add(self, piece: bytes) -> str | None:
        """The line ``piece`` ends, without its ending; None if it ends none, or a blank one. Of a
        line longer than ``LONGEST`` only the last ``LONGEST`` bytes are kept: a line with no end
        would otherwise be copied whole at every piece, as ``pieces`` once did."""
        self._partial = (self._partial + piece)[-LONGEST:]
        return self._take() if ends_line(piece) else None

    def rest(self) -> str | None:
        """What came after the last line ending, at the end of the stream."""
        return self._take()

    def _take(self) -> str | None:
        line, self._partial = self._partial, b""
        return line.decode(errors="replace").rstrip("\r\n") if line.strip() else None
