"""A rank's last collectives, and the lines of the script that called them.

Ranks that call different collectives (rank 0 averages a metric for its log line and the
others do not, or saves a checkpoint alone) fail with "rank 0 is in collective 11, rank 1 in
collective 9": true, but it names neither the collectives rank 0 made on its own nor where.
Each rank keeps its last few, with the line of the script (or library) that called each; its
exit report carries them, and the launcher's report lines the ranks' lists up side by side.
"""

from __future__ import annotations

import contextlib
import linecache
import os
import sys
import threading
import warnings
from collections import deque
from types import FrameType

import torch

from macfleet import protocol

KEPT = 4  # per rank: enough to see where two ranks parted, short enough for a report of many
# Frames that are not the caller: macfleet's own, torch's (a module's __call__ around a
# DataParallel forward, autograd around the end of backward) and the plumbing of threads and
# context managers. The first frame past them is the script's line, or a library's.
_PACKAGES = tuple(os.path.dirname(os.path.abspath(m.__file__ or "")) + os.sep
                  for m in (sys.modules[__package__ or "macfleet"], torch))
_PLUMBING = frozenset(os.path.abspath(m.__file__ or "") for m in (threading, contextlib))


def call_site() -> tuple[str, int]:
    """The file and line that called into macfleet: about 1 us for a forward's dozen frames."""
    frame, _ = _caller(sys._getframe(1))
    return ("", 0) if frame is None else (frame.f_code.co_filename, frame.f_lineno)


def warn_at_script(message: str) -> None:
    """``warnings.warn(message)``, shown at the line that called into macfleet (``call_site``)
    rather than at macfleet's own: a sampler is iterated from inside torch's DataLoader, a
    DataParallel's forward from inside ``nn.Module``."""
    _, level = _caller(sys._getframe(1))
    warnings.warn(message, stacklevel=level + 2)


def _caller(frame: FrameType | None) -> tuple[FrameType | None, int]:
    """The first frame from ``frame`` outward that is neither macfleet's, torch's nor plumbing,
    and how many frames out from ``frame`` it is."""
    out = 0
    while frame is not None:
        path = frame.f_code.co_filename
        if not path.startswith(_PACKAGES) and path not in _PLUMBING:
            break
        frame, out = frame.f_back, out + 1
    return frame, out


def where(path: str, line: int) -> str:
    """``train.py:14`` for a file under the working directory, the full path otherwise."""
    if not path:
        return ""
    relative = os.path.relpath(path) if os.path.isabs(path) else path
    return f"{path if relative.startswith('..') else relative}:{line}"


class History:
    def __init__(self) -> None:
        # (number, what, path, line) of each: the number is the same on every rank, ``what`` is
        # formatted only for a report (a Signature), and path is "" where no line called it
        # (DataParallel's communication thread). A tuple: this costs well under 1 us a collective.
        self.made: deque[tuple[int, object, str, int]] = deque(maxlen=KEPT)
        self.failed_in = 0  # the collective this rank left by an exception (0: none)
        self.note = ""  # a line after them, on what the rank was doing (``protocol.STOOD_BY``)

    def add(self, op: int, what: object, site: tuple[str, int]) -> None:
        self.made.append((op, what, *site))

    def lines(self) -> list[str]:
        """The last collectives, oldest first, each with its calling line's source."""
        out = []
        for op, what, path, line in list(self.made):
            source = linecache.getline(path, line).strip() if path else ""
            at = f" at {where(path, line)}" + (f": {source[:80]}" if source else "") if path else ""
            out.append(f"#{op} {what}{protocol.FAILED_HERE if op == self.failed_in else ''}{at}")
        return [*out, self.note] if self.note else out
