"""The tuning knobs a user sets through the environment (``MACFLEET_STREAMS=2``, ...), read and
checked in one place.

Each knob is read when it is used, so a bad value is a ``ConfigError`` naming the variable,
never a ``ValueError`` from ``int()`` at import, and never a value that quietly means something
else (``MACFLEET_STREAMS=0`` used to mean the default, a negative timeout no wait at all). The
launcher checks every knob it forwards before it starts a rank (``problems``), so a typo is one
usage error on the launching Mac instead of the same traceback from every rank.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Mapping

from macfleet.errors import ConfigError

BYTES = ("MACFLEET_CHUNK_BYTES", "MACFLEET_SMALL_BYTES", "MACFLEET_MIN_PART_BYTES", "MACFLEET_INLINE_BYTES",
         "MACFLEET_ZERO_COPY_BYTES", "MACFLEET_SHM_SLOT_BYTES", "MACFLEET_SHM_GATHER_BYTES")
COUNTS = ("MACFLEET_STREAMS",)
SECONDS = ("MACFLEET_TIMEOUT", "MACFLEET_RENDEZVOUS_TIMEOUT", "MACFLEET_CONNECT_TIMEOUT")
SWITCHES = ("MACFLEET_SHM", "MACFLEET_SHM_OBJECTS", "MACFLEET_FULL_TRACEBACK")


def nbytes(name: str, default: int, environ: Mapping[str, str] = os.environ) -> int:
    """A size in bytes (``4096``, ``64K``, ``4M``), at least 1."""
    return _read(name, default, environ, parse_size, "a size in bytes (4096, 64K, 4M)", "of at least 1",
                 lambda v: v >= 1)


def parse_size(text: str) -> int:
    """Bytes in ``4K``, ``16M``, ``1.5G``, ``4096`` (binary units; a trailing ``B`` or ``iB`` is
    allowed), as the byte knobs and ``macfleet bench --sizes`` take it. ValueError
    for anything else."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    try:
        return int(float(text[:-1]) * units[text[-1]]) if text and text[-1] in units else int(text)
    except OverflowError:  # "infK"
        raise ValueError(text) from None


def count(name: str, default: int | None, environ: Mapping[str, str] = os.environ) -> int | None:
    """A count, at least 1 (``default`` where unset)."""
    return _read(name, default, environ, int, "a whole number", "of at least 1", lambda v: v >= 1)


def seconds(name: str, default: float, environ: Mapping[str, str] = os.environ) -> float:
    """A duration in seconds, above 0."""
    return _read(name, default, environ, float, "a number of seconds", "above 0", lambda v: 0 < v < float("inf"))


def switch(name: str, default: bool, environ: Mapping[str, str] = os.environ) -> bool:
    """``1`` or ``0``."""
    raw = environ.get(name)
    if not raw:
        return default
    if raw not in ("0", "1"):
        raise ConfigError(f"{name}={raw!r}: give 1 (on) or 0 (off)")
    return raw == "1"


def problems(environ: Mapping[str, str]) -> list[str]:
    """What is wrong with the knobs set in ``environ``, one message each."""
    found = []
    checks = [(name, nbytes) for name in BYTES] + [(name, count) for name in COUNTS] + \
        [(name, seconds) for name in SECONDS] + [(name, switch) for name in SWITCHES]
    for name, read in checks:
        try:
            read(name, 1, environ)
        except ConfigError as exc:
            found.append(str(exc))
    return found


def _read(name: str, default: Any, environ: Mapping[str, str], parse: Callable[[str], Any], what: str, rule: str,
          ok: Callable[[Any], bool]) -> Any:
    """``environ[name]`` parsed, ``default`` where unset or empty: ``what`` it must be, and the
    ``rule`` (checked by ``ok``) it must keep."""
    raw = environ.get(name)
    if not raw:
        return default
    try:
        value = parse(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not {what}") from None
    if not ok(value):
        raise ConfigError(f"{name}={raw!r}: give {what} {rule}")
    return value
