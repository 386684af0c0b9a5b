"""Where a rank is when it cannot say so itself: its stacks, dumped by faulthandler on a signal.

A rank stuck in native code that holds the GIL (a C extension's deadlock, a GPU wait that
never ends) sends no heartbeat and answers no request for its stacks: every Python thread,
its control thread included, waits for the GIL. The launcher then knows only that it went
silent. But faulthandler dumps every thread's Python stack from a C signal handler, without
the GIL. So the bootstrap arms it (``arm``) to write to a per-rank file on ``DUMP_SIGNAL``;
when the coordinator finds a rank silent, it asks the rank's agent, which sends the signal,
reads the file (``tidy``) and passes the stacks on for the failure report.
"""

from __future__ import annotations

import faulthandler
import linecache
import os
import re
import signal
from typing import IO

import macfleet
from macfleet.commands import starter, starts_script

DUMP_SIGNAL = getattr(signal, "SIGUSR2", None)  # None where there is none (Windows): no dumps
MAX_BYTES = 12 << 10  # a control message's header holds 16 KiB
_FRAME = re.compile(r'^\s*File "(?P<path>.*)", line (?P<line>\d+) in (?P<name>.*)$')
_LIBRARY = os.path.dirname(os.path.abspath(macfleet.__file__)) + os.sep
_STDLIB = os.path.dirname(os.path.abspath(os.__file__)) + os.sep
_kept: list[IO[str]] = []  # the armed file stays open for the process's life
starter(os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap.py"))  # its frames are not the script's


def arm(path: str) -> None:
    """Dump every thread's stack into ``path`` on ``DUMP_SIGNAL`` (a script that installs its
    own handler for that signal replaces this one: it only loses the dump)."""
    if DUMP_SIGNAL is None:
        return
    try:
        f = open(path, "a")  # appending: the agent empties it before each dump it asks for
    except OSError:
        return  # no dump, rather than no script
    _kept.append(f)
    faulthandler.register(DUMP_SIGNAL, file=f, all_threads=True)


def tidy(dump: str, frames_per_thread: int = 10) -> str:
    """faulthandler's dump (innermost frame first, no source) as a traceback shows a stack, and
    as the stall report shows a live rank's: the main thread first, from the script's
    outermost frame on (runpy's and the bootstrap's cut), each line of source under its frame,
    macfleet's own threads left out."""
    threads: list[tuple[bool, list[str]]] = []
    for block in re.split(r"\n\s*\n", dump.strip()):
        frames = [m for m in (_FRAME.match(line) for line in block.splitlines()[1:])
                  if m and not m["path"].startswith("<frozen importlib")]  # an import's machinery: noise
        frames.reverse()  # outermost first
        main = any(starts_script(f["path"]) for f in frames)
        while frames and starts_script(frames[0]["path"]):
            frames.pop(0)
        while frames and os.path.basename(frames[0]["path"]) == "threading.py":
            frames.pop(0)  # what starts any thread; the thread's own function comes next
        if not frames or frames[0]["path"].startswith(_LIBRARY) or all(_ours_or_stdlib(f["path"]) for f in frames):
            continue  # one of macfleet's threads (control, buckets), or its idle pool's (stdlib alone)
        lines = []
        for f in frames[-frames_per_thread:]:
            lines.append(f'  File "{f["path"]}", line {f["line"]}, in {f["name"]}')
            source = linecache.getline(f["path"], int(f["line"])).strip()
            if source:
                lines.append(f"    {source}")
        threads.append((main, lines))
    threads.sort(key=lambda t: not t[0])
    text = "\n".join(f"thread {'MainThread' if main else '(another)'} (most recent call last):\n" + "\n".join(lines)
                     for main, lines in threads).encode()
    return text.decode() if len(text) <= MAX_BYTES else text[:MAX_BYTES].decode(errors="ignore") + "\n..."


def _ours_or_stdlib(path: str) -> bool:
    """A frame of macfleet or of Python's own library (not of the packages installed in it)."""
    return path.startswith(_LIBRARY) or (path.startswith(_STDLIB) and "site-packages" not in path
                                         and "dist-packages" not in path)
