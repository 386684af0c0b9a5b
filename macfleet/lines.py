"""Cut a process's output into pieces as it arrives: at newlines, at carriage returns, and at
the end of each read.

Progress bars (tqdm, ``print(..., end="\\r")``) redraw with ``\\r`` and write no newline until
they finish: cut at newlines only, a rank's progress bar showed nothing for a whole epoch, then
every redraw at once. A piece keeps its ending, so a terminal still redraws the line in place;
``\\r\\n`` stays one ending when it arrives in one read.
"""

from __future__ import annotations

from typing import Callable, Iterator


def pieces(read: Callable[[], bytes]) -> Iterator[bytes]:
    """What ``read`` returns (``b""`` at the end), cut after every ``\\n``, ``\\r`` or ``\\r\\n``;
    what is left of a read without an ending is a piece too, so nothing waits for the next one."""
    for chunk in iter(read, b""):
        start = 0
        while start < len(chunk):
            ends = [i for i in (chunk.find(b"\n", start), chunk.find(b"\r", start)) if i >= 0]
            cut = min(ends) if ends else len(chunk) - 1
            if chunk[cut: cut + 2] == b"\r\n":
                cut += 1
            yield chunk[start: cut + 1]
            start = cut + 1


def ends_line(piece: bytes) -> bool:
    return piece.endswith((b"\n", b"\r"))


class WholeLines:
    """Pieces put back together into lines, for a tail of the last ones (the error report)."""

    def __init__(self) -> None:
        self._partial = b""

    def add(self, piece: bytes) -> str | None:
        """The line ``piece`` ends, without its ending; None if it ends none, or a blank one."""
        self._partial += piece
        return self._take() if ends_line(piece) else None

    def rest(self) -> str | None:
        """What came after the last line ending, at the end of the stream."""
        return self._take()

    def _take(self) -> str | None:
        line, self._partial = self._partial, b""
        return line.decode(errors="replace").rstrip("\r\n") if line.strip() else None
