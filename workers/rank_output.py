"""What an agent shows of its ranks' output: each piece on the agent's own stdout or stderr
(which the launcher relays to its terminal), with "[rank K]" at the start of each of the rank's
lines, and as it is in the rank's log under ``--log-dir``. Ranks write at once and in pieces (a
progress bar redrawn with \\r, a prompt with no line end yet): a line one rank left open is
ended before another's goes out, so no two ranks' text shares a line.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import IO

from macfleet.lines import ends_line, forward_nowhere
from macfleet.protocol import AgentSpec


class RankOutput:
    """The state of the agent's two outputs, and of its ranks' logs, under one lock (``lock``)
    that the copying threads of every rank share. ``host``: this Mac's name in the agent's own
    words."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.lock = threading.Lock()
        self._open_line: dict[int, bytes | None] = {}  # by id(sink): the prefix of the rank whose line is open there
        self.logs: dict[int, IO[bytes]] = {}  # by rank, with --log-dir
        self.lost_logs: set[str] = set()  # the paths of those that could not be written (a full disk)

    def log(self, log: IO[bytes], piece: bytes) -> bool:
        """Append a piece of a rank's output to its log (under ``lock``). A write that fails
        (a full disk, most often) is said once, on a line of its own, and the log is given up:
        --log-dir's copy ends there, where the user would otherwise find it cut without a word."""
        if log.name in self.lost_logs:  # the rank's other stream found it so
            return False
        try:
            log.write(piece)
            return True
        except ValueError:  # closed at the agent's end: what a rank's orphaned child still writes is dropped
            return False
        except OSError as exc:
            self.lost_logs.add(log.name)
            for sink in (sys.stdout.buffer, sys.stderr.buffer):
                self.end_line(sink)  # a rank's line left open (a progress bar): ours goes on a line of its own
            print(f"macfleet agent on {self.host}: cannot write {log.name} ({exc.strerror or exc}): that log "
                  f"ends at {log.tell()} bytes, and the rank's output goes on only here", file=sys.stderr, flush=True)
            return False

    def end_line(self, sink: IO[bytes], prefix: bytes | None = None) -> None:
        """End the line a rank left open on ``sink`` (under ``lock``); with ``prefix``, only
        if it is that rank's."""
        owner = self._open_line.get(id(sink))
        if owner is not None and (prefix is None or owner == prefix):
            self._open_line[id(sink)] = None
            _write(sink, b"\n")

    def lines_ended(self, names: list[str]) -> None:
        """The launcher's terminal echoed a line typed there (``relay.end_lines_at_echo``): a
        rank's line open on these of our outputs ("stdout", "stderr") has ended, before the
        rank reads what was typed. Its answer starts a line, with its prefix: after pdb's
        "(Pdb) n", the rank's "> train.py(12)" came without its "[rank K]"."""
        with self.lock:
            for name in names:
                sink = {"stdout": sys.stdout.buffer, "stderr": sys.stderr.buffer}.get(name)
                if sink is not None:
                    self._open_line[id(sink)] = None

    def show(self, sink: IO[bytes], prefix: bytes, piece: bytes, at_start: bool) -> bool:
        """Write one piece of a rank's output to ``sink`` (under ``lock``); whether the rank's
        next piece starts a line. A line may arrive in pieces (a progress bar redrawn with \\r):
        the prefix goes before its first piece only, and a line another rank left open is ended
        before this rank writes.

        While another rank's line is open (its progress bar), this rank's redraws are not shown:
        each one started a line of its own, and with tqdm on every rank (10 redraws a second
        each) the terminal scrolled a line per redraw. A redraw is a state the next one replaces;
        the bar's last state ends with a newline and is shown, as are whole lines, and
        ``--log-dir`` keeps every redraw."""
        owner = self._open_line.get(id(sink))
        ours = owner == prefix and not at_start  # our line is open: this piece continues it
        if piece == b"\r" and (at_start or owner != prefix):
            return True  # a redraw with nothing drawn on this line yet: nothing to show
        if owner is not None and owner != prefix:
            if piece.endswith(b"\r"):
                return True  # a redraw of ours while another rank's line is open: not shown
            _write(sink, b"\n")  # another rank's bar would be overwritten, or run on into ours
        _write(sink, (b"" if ours else prefix) + piece)
        self._open_line[id(sink)] = None if piece.endswith(b"\n") else prefix
        return ends_line(piece)

    def close_logs(self) -> list[int]:
        """Close the ranks' logs (a copying thread still draining a rank's orphaned child writes
        no more there); the ranks whose log could not be written to its end."""
        with self.lock:
            for log in self.logs.values():
                log.close()
        return sorted(rank for rank, log in self.logs.items() if log.name in self.lost_logs)


def _write(sink: IO[bytes], data: bytes) -> None:
    try:
        sink.write(data)
        sink.flush()
    except (OSError, ValueError) as exc:
        # Our output is gone (the launcher died, or what read it left; a log closed): keep draining
        # so the rank never blocks. A gone stdout or stderr goes to /dev/null from now on, or our
        # last flush at exit would print a BrokenPipeError to the launcher, over ssh. (One that is
        # only full for now, non-blocking, loses this piece.)
        if sink in (sys.stdout.buffer, sys.stderr.buffer) and not isinstance(exc, BlockingIOError):
            forward_nowhere(sink.fileno(), exc if isinstance(exc, OSError) else None)


def open_logs(spec: AgentSpec) -> dict[int, IO[bytes]]:
    """This host's ranks' log files under ``spec.log_dir``, opened to append (a restarted job
    adds to them), each started with a line saying which rank and attempt follows."""
    if spec.log_dir is None:
        return {}
    directory = os.path.join(spec.cwd, spec.log_dir)
    logs: dict[int, IO[bytes]] = {}
    try:
        os.makedirs(directory, exist_ok=True)
        for rank in range(spec.rank_base, spec.rank_base + spec.slots):
            log = logs[rank] = open(os.path.join(directory, f"rank-{rank}.log"), "ab", buffering=0)
            attempt = f", restart {spec.restart_count}" if spec.restart_count else ""
            started = time.strftime("%Y-%m-%d %H:%M:%S")
            header = f"--- macfleet job {spec.job_id}: rank {rank} on {spec.host}{attempt}, {started} ---\n"
            # after a rank that ended mid-line, the header starts a line of its own
            log.write((b"\n" if log.tell() and not _ends_with_newline(log.name) else b"") + header.encode())
    except OSError as exc:
        for log in logs.values():
            log.close()
        raise OSError(f"cannot write rank logs in {directory}: {exc.strerror or exc}") from None
    return logs


def _ends_with_newline(path: str) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"
