"""The launcher's standard input, passed on to every rank, so that ``breakpoint()`` (pdb) and
``input()`` work in a script under ``macfleet launch`` as they do under ``python``.

Ranks run in sessions of their own, often on other hosts, so they cannot read the launcher's
terminal. A thread here reads what is typed (or piped in); the launcher sends it to every agent
over the control channel, and each agent writes it to its ranks' stdin, as mlx.launch does.
The end of input (Ctrl-D, the end of a pipe) closes the ranks' stdin. A launcher in the
background of its terminal reads nothing (the terminal would stop it with SIGTTIN): its ranks
see the end of input at once, as they would with ``< /dev/null``; so do they once it is sent to
the background later.
"""

from __future__ import annotations

import os
import queue
import signal
import termios
import threading

READ_BYTES = 4096  # a control message each; well under protocol.CONTROL_MAX_BYTES


class StdinRelay:
    """What has been read from ``fd`` and not yet taken. One for the launcher's lifetime: after
    a restart, the next attempt's ranks get what is typed from then on."""

    def __init__(self, fd: int = 0) -> None:
        self.fd = fd
        self._chunks: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        self.ended = False  # the end of input has been taken
        if _ours_to_read(fd):
            if os.isatty(fd):  # sent to the background later (Ctrl-Z, bg), a read fails instead of stopping us
                signal.signal(signal.SIGTTIN, signal.SIG_IGN)
            threading.Thread(target=self._read, args=(fd,), name="macfleet-stdin", daemon=True).start()
        else:
            self._chunks.put(b"")

    def take(self) -> tuple[bytes, bool]:
        """The bytes read since the last call, and whether input has ended."""
        data = b""
        while not self.ended:
            try:
                chunk = self._chunks.get_nowait()
            except queue.Empty:
                break
            data += chunk
            self.ended = not chunk
        return data, self.ended

    def echoed_line(self, data: bytes) -> bool:
        """Whether ``data``, just taken, ended a line on the terminal it was typed at: the
        terminal echoed what was typed, Enter included, so the cursor is at a line's start. A
        rank's prompt had left its line open there ("(Pdb) "), and the rank's answer to the
        command typed went on as the rest of that line, without its "[rank K]": the relays
        must know that the terminal ended it (``relay.end_lines_at_echo``)."""
        if not data.endswith(b"\n"):
            return False
        try:
            lflag = termios.tcgetattr(self.fd)[3]
        except (termios.error, OSError):  # not a terminal: a pipe echoes nothing
            return False
        return bool(lflag & termios.ICANON and lflag & (termios.ECHO | termios.ECHONL))

    def _read(self, fd: int) -> None:
        # The raw fd, not sys.stdin: a daemon thread blocked in a buffered reader aborts
        # interpreter shutdown.
        while True:
            try:
                chunk = os.read(fd, READ_BYTES)
            except OSError:
                chunk = b""
            self._chunks.put(chunk)
            if not chunk:
                return


def _ours_to_read(fd: int) -> bool:
    try:
        os.fstat(fd)
        return not os.isatty(fd) or os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False  # no stdin at all, or a terminal we cannot ask
