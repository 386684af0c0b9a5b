"""The job's timeline file (``macfleet launch --timeline FILE``): the events every rank records
(``macfleet.timeline``: its collectives, DataParallel's forwards, buckets and waits), written as
they arrive in Chrome's trace-event format, which https://ui.perfetto.dev and chrome://tracing
open. A rank is a process there (named with its host), each of its threads a track: the
training thread's forward, backward and wait for gradients above the communication thread's
bucket exchanges show how much of the exchange backward hides, as Horovod's timeline does.

Written as a JSON array, one event a line. The format lets a file end without its closing
bracket, so the file is readable however the launcher ends; ``close`` adds it. A long job
records about 150 bytes an event and several events a step, so the file keeps the first
``LIMIT`` events (about 300 MB, as much as a trace viewer opens) and counts the rest.
"""

from __future__ import annotations

import json
import time
from typing import Any, Sequence

LIMIT = 2_000_000


class TraceFile:
    def __init__(self, path: str, limit: int = LIMIT) -> None:
        self.path, self.limit = path, limit
        self._file = open(path, "w", encoding="utf-8")  # OSError: the caller says it as a usage error
        self._file.write("[\n")
        self._origin = int(time.time() * 1e6)  # the file's time 0: the launch
        self._threads: dict[tuple[int, str], int] = {}  # (rank, thread name) -> its track
        self.ranks: dict[int, str] = {}  # rank -> the host it is named with in the file
        self._first = True
        self.events = 0
        self.dropped: dict[int, int] = {}  # rank -> events it could not keep or send
        self.malformed = 0
        self.past_limit = 0  # events that came after the file had ``limit``
        self.failed: str | None = None  # why the file could not be written (a full disk): nothing more goes to it
        self.unwritten = 0  # events that came after it failed

    def add(self, rank: int, host: str, events: Sequence[Any], dropped: object = 0) -> None:
        """One rank's batch of events (``macfleet.timeline.Event`` tuples)."""
        if isinstance(dropped, int) and dropped > 0:
            self.dropped[rank] = dropped  # the rank's count so far
        if self.ranks.get(rank) != host:  # a restart's rank keeps its track, named again if it moved (--min-hosts)
            self.ranks[rank] = host
            self._write({"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank} ({host})"}})
            self._write({"name": "process_sort_index", "ph": "M", "pid": rank, "args": {"sort_index": rank}})
        for event in events if isinstance(events, (list, tuple)) else ():
            if self.failed:
                self.unwritten += 1
                continue
            if self.events >= self.limit:
                self.past_limit += 1
                continue
            try:
                name, ts, dur, thread, args = event
                record = {"name": str(name), "ph": "X" if dur >= 0 else "i", "ts": int(ts) - self._origin,
                          "pid": rank, "tid": self._track(rank, str(thread))}
            except (TypeError, ValueError):  # not one of ours: a version mismatch the launcher allowed, say
                self.malformed += 1
                continue
            if dur >= 0:
                record["dur"] = int(dur)
            else:
                record["s"] = "t"  # an instant on its thread's track
            if isinstance(args, dict) and args:
                record["args"] = args
            self._write(record)
            self.events += 1

    def _track(self, rank: int, thread: str) -> int:
        key = (rank, thread)
        tid = self._threads.get(key)
        if tid is None:
            # the training thread first, then the others in the order they appear
            tid = self._threads[key] = 0 if thread == "MainThread" else len(self._threads) + 1
            self._write({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid, "args": {"name": thread}})
        return tid

    def _write(self, record: dict[str, Any]) -> None:
        """Never raises: a timeline the disk has no room for must not end the job it watches."""
        if not self.failed:
            self._write_raw(("" if self._first else ",\n") + json.dumps(record, separators=(",", ":")))
        self._first = False

    def summary(self) -> list[str]:
        """What the launcher says of the file at the end: where it is, and what it left out."""
        ranks = f"{len(self.ranks)} rank{'' if len(self.ranks) == 1 else 's'}"
        if self.failed:
            lines = [f"timeline: cannot write {self.path} ({self.failed}): it is cut short within its first "
                     f"{self.events} events of {ranks}, and {self.unwritten} more were left out"]
        else:
            lines = [f"timeline: {self.events} events of {ranks} in {self.path}; open it in https://ui.perfetto.dev "
                     f"or chrome://tracing"]
        if self.past_limit:
            lines.append(f"timeline: the file keeps the first {self.limit:,} events; {self.past_limit:,} more were "
                         f"left out (a shorter run, or fewer steps, shows all)")
        if self.dropped:
            lines.append(f"timeline: {sum(self.dropped.values())} events left out (recorded faster than they could "
                         f"be sent) by rank {', '.join(map(str, sorted(self.dropped)))}")
        if self.malformed:  # a rank of another macfleet version (launch --allow-version-mismatch)
            lines.append(f"timeline: {self.malformed} events left out that were not in this macfleet's format "
                         f"(ranks of another macfleet version?)")
        return lines

    def close(self) -> None:
        if not self.failed:
            self._write_raw("\n]\n")
        try:
            self._file.close()  # flushes what is left, and closes the file even where that fails
        except OSError as exc:
            self.failed = self.failed or exc.strerror or str(exc)

    def _write_raw(self, text: str) -> None:
        try:
            self._file.write(text)
        except OSError as exc:
            self.failed = exc.strerror or str(exc)
