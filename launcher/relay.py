"""Copy every agent's stdout and stderr (its ranks' prefixed lines, and its own words) to the
launcher's, whole lines at a time.

An agent writes each line of a rank in one write, but an ssh connection delivers what its agent
wrote in packets that need not end where a line does. Written straight to one terminal by two
hosts' ssh clients at once, their lines ran into each other ('[rank 1 mac1] chatter 1 [rank 3
mac2] chatter 3 8...', then the rest of rank 1's line on a line of its own). So stdout comes
through the launcher too, as stderr already did for the failure report: cut into whole lines
(``lines.pieces``), each written in one write under its screen's lock. A line an agent leaves
unfinished (a progress bar, or the rest of a line later than ``SETTLE_S``) is ended before
another agent's piece goes out there, so two hosts' text never shares a line; where stdout and
stderr are one terminal, before a piece on the other stream too (``Screen``).
"""

from __future__ import annotations

import os
import select
import sys
import threading
import time
from collections import deque
from typing import IO, Callable

from macfleet.lines import SETTLE_S, WholeLines, forward_nowhere, pieces


class Screen:
    """Where one or more outputs land: the line left unfinished there, and by whom.

    The launcher's stdout and stderr share one where they are the same file (a terminal, or
    ``2>&1``; ``join_if_one_file``). A rank's prompt leaves its line open on stdout, and the
    launcher's note that the rank waits for its user (on stderr) went on after the prompt, on
    its line: "[rank 0] overwrite? [y/N]: macfleet: rank 0 (localhost) is waiting for what you
    type". A rank's line on one stream and another's on the other ran together alike."""

    def __init__(self) -> None:
        # Reentrant: the launcher's own lines are written from its main thread, where a signal
        # handler may run while that thread holds the lock.
        self.lock = threading.RLock()
        self.open_by: tuple[object, Output] | None = None  # (writer, output) of the unfinished line
        # (writer, output) whose unfinished line another's piece ended: the newline its agent
        # then writes to end it (before another rank's line of that host) is said already
        self.cut: tuple[object, Output] | None = None


class Output:
    """One of the launcher's outputs, which the relays of every agent (and the launcher's own
    lines) write to. ``stream``: how to find it at each write, as ``sys.stdout`` may be
    replaced (``reopen_closed_std_streams``, tests that capture it). ``screen``: shared with
    another output that is the same file (see ``Screen``); else its own."""

    def __init__(self, stream: Callable[[], IO[bytes]], screen: Screen | None = None) -> None:
        self._stream = stream
        self.screen = screen or Screen()

    def write(self, writer: object, piece: bytes) -> None:
        """``piece`` from ``writer`` (an agent, or the launcher), after ending a line another
        writer, or this writer on another output of the screen, left unfinished. A redraw (a
        piece ending with \\r: a rank's progress bar) is not shown while another's line is
        open, as each agent does among its own ranks (``RankOutput.show``): a bar on every host
        would scroll the terminal a line per redraw.

        Whatever read the output may have gone: ``macfleet launch ... 2>&1 | head`` (EPIPE), or
        the terminal of a launcher left running in the background (EIO, once it has closed). The
        failed write used to raise out of the launcher: a job whose ranks all exited 0 exited 1
        (on the last line), or was stopped (on a line in mid-job), and the thread that copies an
        agent's output died, so a rank that wrote more than a pipe holds waited for good. The job
        goes on without its lines now: later writes, and the interpreter's last flush, go
        nowhere. An output that is only full for now (non-blocking, EAGAIN) loses this piece."""
        screen = self.screen
        with screen.lock:
            if self._is(screen.cut, writer):
                screen.cut = None
                if piece == b"\n":
                    return
            if screen.open_by is not None and not self._is(screen.open_by, writer):
                if piece.endswith(b"\r"):
                    return
                piece, screen.cut = b"\n" + piece, screen.open_by
            screen.open_by = None if piece.endswith(b"\n") else (writer, self)
            stream = self._stream()
            try:
                stream.write(piece)
                stream.flush()
            except OSError as exc:
                if not isinstance(exc, BlockingIOError):
                    forward_nowhere(stream.fileno(), exc)

    def end(self, writer: object) -> None:
        """``writer`` will write no more here: a line of its left unfinished is ended now."""
        with self.screen.lock:
            if self._is(self.screen.open_by, writer):
                self.write(writer, b"\n")

    def is_file(self, fd: int) -> bool:
        """Whether this output is the same open file as ``fd`` (a terminal: the launcher's stdin)."""
        try:
            return os.path.sameopenfile(self._stream().fileno(), fd)
        except (OSError, ValueError):  # closed, or not a file
            return False

    def _is(self, key: tuple[object, Output] | None, writer: object) -> bool:
        """Whether ``key`` (``Screen.open_by``, ``Screen.cut``) is ``writer`` on this output."""
        return key is not None and key[0] is writer and key[1] is self


STDOUT = Output(lambda: sys.stdout.buffer)
STDERR = Output(lambda: sys.stderr.buffer)


def join_if_one_file() -> None:
    """Give STDOUT and STDERR one screen where they are the same file: a terminal, or one file
    or pipe that ``2>&1`` sent both to."""
    try:
        same = os.path.sameopenfile(sys.stdout.fileno(), sys.stderr.fileno())
    except (OSError, ValueError):  # one of them closed, or not a file
        return
    if same:
        STDERR.screen = STDOUT.screen


def end_lines_at_echo(fd: int) -> list[str]:
    """The terminal at ``fd`` (the launcher's stdin) echoed a line typed there, Enter and all:
    the line left open on it (a rank's prompt) has ended. Forget it on the outputs that are that
    terminal, so that the next piece there does not end it again (a blank line); their names
    ("stdout", "stderr"), for the agents to forget their ranks' open lines on them too."""
    ended = []
    for name, output in (("stdout", STDOUT), ("stderr", STDERR)):
        if output.is_file(fd):
            with output.screen.lock:
                output.screen.open_by = output.screen.cut = None
            ended.append(name)
    return ended


class Relay(threading.Thread):
    """Copies one stream of an agent to one of our outputs until its end. ``tail``: where the
    lines that are not a rank's go (an agent's own words, or ssh's), for the failure report."""

    def __init__(self, stream: IO[bytes], output: Output, writer: object, tail: deque | None = None,
                 settle_s: float = SETTLE_S) -> None:
        super().__init__(daemon=True)  # one waiting on a stream a stray process holds must not keep us
        self.stream, self.output, self.writer, self.tail, self.settle_s = stream, output, writer, tail, settle_s
        self.writing = False

    def run(self) -> None:
        lines = WholeLines() if self.tail is not None else None
        for piece in pieces(self.stream.fileno(), self.settle_s):
            self.writing = True
            self.output.write(self.writer, piece)
            self.writing = False
            line = lines.add(piece) if lines is not None else None
            if self.tail is not None and line and not line.startswith("[rank "):
                self.tail.append(line)
        self.output.end(self.writer)
        self.stream.close()  # at its end: a restart's agents would otherwise hold a pipe each until collected

    def busy(self) -> bool:
        """Writing, or with input to read: getting on with it, not waiting on a stream that may
        never end (a child of the agent that outlived it holds the pipe)."""
        if self.writing:
            return True
        try:
            fd = self.stream.fileno()
        except ValueError:  # closed by ``run``: the stream has ended
            return False
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return any(events & (select.POLLIN | select.POLLHUP) for _, events in poller.poll(0))


def drain(relays: list[Relay], idle_s: float = 2.0) -> None:
    """Until every relay has copied its stream to the end. One still waiting for input after
    ``idle_s`` in all is left (its stream may never end). One that is writing, or has input
    to read, is waited for: the reader may be slower than the job (``macfleet launch ... |
    less`` before the user scrolls down), and what the relay holds is the job's last lines.
    The launcher used to stop waiting after 2 s whatever the relay was doing, and exit without
    them."""
    deadline = time.monotonic() + idle_s
    for relay in relays:
        while relay.is_alive() and (time.monotonic() < deadline or relay.busy()):
            relay.join(timeout=0.05)
