"""A rank's timeline: when its collectives ran, and DataParallel's forwards, its buckets and
its waits for them, for a trace viewer (``macfleet launch --timeline FILE``).

The launcher sets ``MACFLEET_TIMELINE=1`` for every rank. A rank then keeps each event here,
and its control thread sends them to the launcher in batches (``take``), which writes one
file for the whole job (Chrome's trace-event format). Off, recording costs one attribute
test. Times are the wall clock (``time.time``), the one clock that the Macs of a job share,
through NTP: ranks of one Mac line up exactly, those of different Macs to within its error.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from typing import Any

ENV = "MACFLEET_TIMELINE"
# Events not yet sent: a rank whose launcher reads slower than it records (a loop of tiny
# collectives) keeps this many and counts the rest as dropped rather than grow without end.
KEPT = 200_000
# Names (a tensor's, a thread's) are cut to this, so that a batch of events fits one control
# message (``runtime.TIMELINE_BATCH``); the arguments are macfleet's own, a few short fields.
NAME_CHARS = 60

# One event: (name, start in us, duration in us or -1 for an instant, thread name, args or None)
Event = tuple[str, int, int, str, "dict[str, Any] | None"]


class Timeline:
    def __init__(self, on: bool) -> None:
        self.on = on
        self.dropped = 0
        self._events: deque[Event] = deque()

    def span(self, name: str, start_s: float, end_s: float, args: dict[str, Any] | None = None) -> None:
        """Something that ran from ``start_s`` to ``end_s`` (``time.time()``) on this thread."""
        self._keep((name[:NAME_CHARS], int(start_s * 1e6), max(0, int((end_s - start_s) * 1e6)), _thread(), args))

    def instant(self, name: str, args: dict[str, Any] | None = None) -> None:
        """Something that happened now on this thread."""
        self._keep((name[:NAME_CHARS], int(time.time() * 1e6), -1, _thread(), args))

    def _keep(self, event: Event) -> None:
        if len(self._events) >= KEPT:
            self.dropped += 1
            return
        self._events.append(event)  # deque.append is atomic: the control thread takes from the other end

    def take(self, most: int) -> list[Event]:
        """Up to ``most`` of the oldest events not taken yet."""
        out = []
        while self._events and len(out) < most:
            out.append(self._events.popleft())
        return out


def _thread() -> str:
    """This thread's track. A thread that Python did not start is autograd's: on a GPU (MPS,
    CUDA) backward runs on a thread of the autograd engine's, and its hooks, DataParallel's
    bucket readiness, end of backward and wait among them, with it. Python calls such a thread
    "Dummy-1"."""
    thread = threading.current_thread()
    return "autograd" if isinstance(thread, threading._DummyThread) else thread.name[:NAME_CHARS]


RECORDER = Timeline(os.environ.get(ENV) == "1")
