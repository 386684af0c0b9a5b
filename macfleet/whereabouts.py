"""Where a rank is, for the launcher's stall report: when the others wait for it in a collective
it is not in, the launcher asks it, twice, and tells a rank that works from a stuck one.

A rank works if its stacks move between the two answers, or it uses the processor: itself, or
the processes it started (a ``multiprocessing`` pool preprocessing the data on rank 0 while the
others wait at a barrier; ``tar`` unpacking it). Its main thread may also wait, without moving
or using the processor, on work done outside it: a download through Python's sockets (urllib,
requests, a hub client; an asyncio loop's), a process it started (``curl``, ``aws s3 cp``), or
a disk (``torch.save`` of a checkpoint to a NAS), itself or through a thread of the script it
waits for (a thread pool fetching a model's files, fsspec's loop). Those look stuck by stacks
and processor time alike, and were aborted after twice the stall timeout; the collective
timeout still bounds them. A rank that waits for a person (in pdb, at a prompt of the script's)
is no stall at all: the others wait for it as long as it takes.
"""

from __future__ import annotations

import builtins
import os
import resource
import stat
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from types import FrameType
from typing import Any, TextIO

from macfleet.commands import starts_script

# The modules whose frames, innermost on the main thread, mean it waits on work outside it.
# A library's read or write ends in one of the first three; ``subprocess`` waits for a child
# (through ``selectors`` where it reads the child's output).
NETWORK_MODULES = ("socket", "ssl", "http.client")
CHILD_MODULES = ("subprocess",)
# ... and that it reads or writes a file in one long call: a checkpoint saved or loaded (torch's
# writer and safetensors' are native code, under their Python callers), a data set copied. On a
# disk that is slow (a NAS over Wi-Fi) such a call lasts minutes, and uses next to no processor.
DISK_MODULES = ("torch.serialization", "safetensors.torch", "shutil")
# ... and that it waits for another thread of the script: ``join()``, a future's ``result()``
# (a thread pool downloading the files of a model, as huggingface_hub's snapshot_download does),
# a queue. Then that thread's waits are the rank's.
THREAD_MODULES = ("threading", "queue")
INNERMOST = 3  # frames looked at: subprocess's communicate reads, and an asyncio loop waits, in selectors' select


def stacks(frames_per_thread: int = 10, max_bytes: int = 12 << 10) -> str:
    """Where this rank's threads are, as a traceback shows it: the main thread (the script's)
    first, each thread's innermost frames, from the script's own outermost one on (not the
    bootstrap's that run it); macfleet's own threads left out. For the stall report, when the
    others wait for this rank in a collective it is not in: a data loader that never returns,
    a lock, an ``input()``. Cut to ``max_bytes``: a control message's header holds 16 KiB."""
    frames = sys._current_frames()
    threads = sorted(threading.enumerate(), key=lambda t: t is not threading.main_thread())
    parts = []
    for thread in threads:
        frame = frames.get(thread.ident or 0)
        if frame is None or thread.name.startswith("macfleet-"):
            continue
        chain = []
        while frame is not None:
            chain.append(frame)
            frame = frame.f_back
        chain.reverse()  # outermost first
        while len(chain) > 1 and starts_script(chain[0].f_code.co_filename):
            chain.pop(0)
        summary = traceback.StackSummary.extract((f, f.f_lineno) for f in chain[-frames_per_thread:])
        parts.append(f"thread {thread.name} (most recent call last):\n" + "".join(summary.format()).rstrip())
    text = "\n".join(parts).encode()
    return text.decode() if len(text) <= max_bytes else text[:max_bytes].decode(errors="ignore") + "\n..."


def in_debugger(frame: FrameType | None) -> bool:
    """Whether the thread whose innermost frame is ``frame`` is stopped in pdb (or stepping
    under it): the others then wait for this rank for as long as someone debugs it, which the
    launcher's stall report must not take for a hang. ``breakpoint()`` sets bdb's trace
    function on every frame of the stack it stops in; a profiler's or coverage's tracer is not
    bdb's."""
    bdb = sys.modules.get("bdb")
    if bdb is None:
        return False
    while frame is not None:
        if isinstance(getattr(frame.f_trace, "__self__", None), bdb.Bdb):
            return True
        frame = frame.f_back
    return False


def held_by_user() -> str | None:
    """Why the script's main thread waits for a person, in words, or None: "in a debugger", or
    "waiting for what you type" (``input()``, a read of ``sys.stdin``, ``getpass``: a prompt on
    rank 0, for a choice or a hub's token, while the others wait at a barrier). The others then
    wait for this rank as long as it lasts, as under ``python`` with one process, rather than
    abort it as a stall."""
    main = _main_frame()
    if in_debugger(main):
        return "in a debugger"
    for frame in _innermost(main):  # getpass reads the line itself: on a rank, which has no terminal, from stdin
        if frame.f_code in _READS_OF_STDIN or frame.f_globals.get("__name__") == "getpass":
            return "waiting for what you type"
    return None


_builtin_input = builtins.input


def input(*prompt: object) -> str:  # noqa: A001 - it stands in for the builtin, under its name
    """``input()`` as the script calls it on a rank (``watch_input``): the builtin has no Python
    frame of its own, which ``held_by_user`` needs to see the main thread waiting in it."""
    return _builtin_input(*prompt)


class WatchedStdin:
    """``sys.stdin`` as the script reads it on a rank (``watch_input``): a prompt of the script's
    own that reads the line itself (``sys.stdin.readline()``, ``for line in sys.stdin``) waits
    in the stream's native code, under the script's frame, where ``held_by_user`` saw nothing,
    and the job was aborted as a stall while its user read the question. Each read here is a
    frame of this class. Everything else is the stream's own (``fileno()``, ``buffer``, whose
    reads stay unseen). A proxy, not an ``io.TextIOWrapper`` of the same buffer: a second
    wrapper would read ahead of the first, and stdin's own options (no newline translation on
    POSIX) would have to be copied; a script that checks the type of ``sys.stdin`` sees it."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def read(self, size: int | None = -1) -> str:
        return self._stream.read(size)

    def readline(self, size: int | None = -1) -> str:
        return self._stream.readline(size)

    def readlines(self, hint: int = -1) -> list[str]:
        return self._stream.readlines(hint)

    def __iter__(self) -> WatchedStdin:
        return self

    def __next__(self) -> str:
        line = self._stream.readline()
        if not line:
            raise StopIteration
        return line

    def __enter__(self) -> WatchedStdin:
        self._stream.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stream.__exit__(*exc)

    def __getattr__(self, name: str) -> Any:
        if name == "_stream":  # an instance made without __init__ (copy.copy makes one): not recursion
            raise AttributeError(name)
        return getattr(self._stream, name)


_READS_OF_STDIN = {input.__code__, *(method.__code__ for method in (WatchedStdin.read, WatchedStdin.readline,
                                                                    WatchedStdin.readlines, WatchedStdin.__next__))}


def watch_input() -> None:
    """Have the script's ``input()`` calls go through ``input`` above, and its reads of
    ``sys.stdin`` through ``WatchedStdin``, for the rest of the process. A wrapper rather than an
    audit hook (which sees the builtin's calls without one): a hook costs 1-2 us on every audited
    event of the process: one epoch of the MNIST example (94 steps) raised about 14,000 once
    torch and macfleet were imported (``id()``, attribute reads of frames, torch's lazy imports).
    A traceback through a prompt (Ctrl-C at it) shows its frame."""
    builtins.input = input
    if sys.stdin is not None and not isinstance(sys.stdin, WatchedStdin):
        sys.stdin = WatchedStdin(sys.stdin)


def _main_frame() -> FrameType | None:
    """The innermost frame of the script's main thread (None while it has none)."""
    return sys._current_frames().get(threading.main_thread().ident or 0)


def waits_outside() -> str | None:
    """What the script's main thread waits on outside Python, in words, or None: "the network"
    or "a process it started", itself or through a thread of the script it waits for ("the
    network, in its thread ThreadPoolExecutor-0_0"). Judged by the modules of the threads'
    innermost frames, so a read the script makes on a socket of its own (``sock.recv``, no
    library frame below it) is not seen."""
    frames = sys._current_frames()
    waits = _waits_on(frames.get(threading.main_thread().ident or 0))
    if waits != A_THREAD:
        return waits
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.name.startswith("macfleet-"):
            said = _waits_on(frames.get(thread.ident or 0))
            if said not in (None, A_THREAD):
                return f"{said}, in its thread {thread.name}"
    return None


A_THREAD = "another thread"


def _waits_on(frame: FrameType | None) -> str | None:
    """What a thread waits on, from its ``INNERMOST`` frames: "the network", "a process it
    started", "the disk", ``A_THREAD``, or None (nothing outside, or nothing it shows)."""
    for frame in _innermost(frame):
        module = frame.f_globals.get("__name__")
        if module in NETWORK_MODULES:
            return "the network"
        if module in CHILD_MODULES:
            return "a process it started"
        if module in DISK_MODULES:
            return "the disk"
        if module in THREAD_MODULES:
            return A_THREAD
        if module == "asyncio.base_events" and frame.f_code.co_name == "_run_once":
            return _loop_waits_on(frame.f_locals.get("self"))
    return None


def _innermost(frame: FrameType | None) -> Iterator[FrameType]:
    """A thread's ``INNERMOST`` frames, from ``frame`` (its innermost) outwards."""
    for _ in range(INNERMOST):
        if frame is None:
            return
        yield frame
        frame = frame.f_back


def _loop_waits_on(loop: object) -> str | None:
    """What an asyncio loop waiting in its selector waits on: "the network" where a socket is
    registered besides the loop's own wake-up one (a download through aiohttp or httpx; fsspec
    runs such a loop in a thread of its own, which the main thread waits for), "a process it
    started" where a pipe is (``create_subprocess_exec``'s output), else ``A_THREAD`` (its
    executor's threads, ``run_in_executor``). Another kind of loop (uvloop's): None."""
    try:
        own = loop._ssock.fileno()  # type: ignore[attr-defined]
        fds = [key.fd for key in list(loop._selector.get_map().values())]  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - another loop's insides, or its map changed as it was read
        return None
    waits = A_THREAD
    for fd in fds:
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            continue  # closed meanwhile
        if fd != own and stat.S_ISSOCK(mode):
            return "the network"
        if stat.S_ISFIFO(mode):
            waits = "a process it started"
    return waits


def processor_s() -> float:
    """The processor time this rank has used, with that of every process it started: those
    still running (read from /proc on Linux, from ``ps`` on macOS) and those ended and waited
    for (``RUSAGE_CHILDREN``). On Linux a running one's time includes its own ended children
    (``tar`` run and waited for by a shell that is still running). macOS's ``ps`` leaves those
    out: there such time drops from one answer to the next, which at worst makes the rank
    look stuck for that one look, as before this counted children at all. Asked only when a
    stall is reported, so the tens of milliseconds it takes do not matter."""
    ended = resource.getrusage(resource.RUSAGE_CHILDREN)
    table = proc_table() if os.path.isdir("/proc/self/task") else ps_table()
    return time.process_time() + ended.ru_utime + ended.ru_stime + descendants_s(table)


def descendants_s(table: dict[int, tuple[int, float]]) -> float:
    """The processor time of this process's running descendants, from a table of every process's
    parent and processor seconds."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    total, todo, seen = 0.0, list(children.get(os.getpid(), [])), set()
    while todo:
        pid = todo.pop()
        if pid not in seen:  # a table read while processes come and go, pids reused: no loops
            seen.add(pid)
            total += table[pid][1]
            todo.extend(children.get(pid, []))
    return total


def proc_table() -> dict[int, tuple[int, float]]:
    """Every process's parent and processor seconds (with its ended children's), from Linux's
    /proc, to the clock tick (``ps`` there says whole seconds, as coarse as a short stall
    timeout). One ``cat`` reads them: file by file, each read let go of the GIL, and while the script's main thread runs
    Python every such wait lasts up to its 5 ms switch interval (116 processes: 1.3-1.6 s, and
    a rank that answered that late was taken for stuck; ``cat``: 55-60 ms)."""
    tick, table = os.sysconf("SC_CLK_TCK"), {}
    for line in output_of(["sh", "-c", "cat /proc/[0-9]*/stat 2>/dev/null"]).splitlines():
        pid, _, after = line.partition(" ")
        fields = after.rpartition(")")[2].split()  # after the command's name, which may hold spaces
        try:
            table[int(pid)] = (int(fields[1]), sum(int(f) for f in fields[11:15]) / tick)  # utime..cstime
        except (IndexError, ValueError):
            continue
    return table


def ps_table() -> dict[int, tuple[int, float]]:
    """The same from ``ps``, on macOS (which has no /proc)."""
    table = {}
    for line in output_of(["ps", "-A", "-o", "pid=,ppid=,time="]).splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[0].isdigit() and fields[1].isdigit():
            table[int(fields[0])] = (int(fields[1]), ps_time_s(fields[2]))
    return table


def output_of(command: list[str]) -> str:
    """What ``command`` prints, whatever its exit status (``cat`` fails on a process that ended
    meanwhile, having printed the rest); empty where it cannot be run. Bytes that are not UTF-8
    (an environment ``ps`` shows) are replaced."""
    try:
        return subprocess.run(command, capture_output=True, text=True, errors="replace", timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def ps_time_s(text: str) -> float:
    """Seconds from ``ps``'s ``time`` column: "[DD-]HH:MM:SS" on Linux, "MM:SS.cc" (minutes
    past 59 included) on macOS; 0 for anything else."""
    days, _, clock = text.rpartition("-")
    try:
        seconds = 0.0
        for part in clock.split(":"):
            seconds = 60 * seconds + float(part)
        return 86400 * int(days or 0) + seconds
    except ValueError:
        return 0.0
