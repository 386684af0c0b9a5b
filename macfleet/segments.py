"""Where a host's shared memory lives: files in a RAM filesystem, or POSIX shared-memory objects.

Linux has /dev/shm, a RAM filesystem, and the agent puts its per-job directory there. A segment
is then a file in that directory, and removing the directory removes whatever a crash left.

A Mac has no RAM filesystem: its temporary directory is on the SSD. A shared mapping's dirty
pages belong to the file, and the kernel may write them back to it: when it evicts them (under
memory pressure, which training on unified memory brings) or when the file is unmapped. And
every step rewrites the whole segment and every bucket. So on macOS a segment is a POSIX
shared-memory object (``shm_open``): memory with no file behind it, which is also what torch's
shared tensors and Python's ``multiprocessing.shared_memory`` use there.

An object outlives a process that crashes before unlinking it, until the Mac restarts. So its
creator first leaves a marker file of the same name in the per-job directory, and whoever
removes the directory (the agent, or a rank whose agent is gone) first unlinks every object
a marker names (``release``).

``MACFLEET_SHM_OBJECTS=1`` (or ``0``) chooses objects (or files) on any system; the tests use it to
run the macOS way on Linux, where ``shm_open`` makes a file in /dev/shm.
"""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass

from macfleet import knobs
from macfleet.errors import ConfigError

try:  # what multiprocessing.shared_memory uses: shm_open without ctypes (variadic on macOS arm64)
    import _posixshmem
except ImportError:  # Windows, or a Python built without it
    _posixshmem = None

PREFIX = "shm-"  # every segment's name starts so (markers, in objects mode)


def use_objects() -> bool:
    """Objects on macOS (and where ``MACFLEET_SHM_OBJECTS=1``), files elsewhere."""
    return knobs.switch("MACFLEET_SHM_OBJECTS", sys.platform == "darwin") and _posixshmem is not None


def object_name(name: str) -> str:
    """The object for segment ``name``. macOS allows 30 characters, the slash included
    (PSHMNAMLEN counts the terminating NUL), so the name is a digest: 28 characters."""
    return "/mf-" + hashlib.sha1(name.encode()).hexdigest()[:24]


@dataclass(frozen=True)
class Segments:
    """Create, open and unlink the segments named ``name`` of one per-job ``directory``."""

    directory: str
    objects: bool = False

    def create(self, name: str, nbytes: int) -> int:
        """Create segment ``name`` (it must not exist) of ``nbytes`` zero bytes and, where the
        system can, claim its memory now: a segment that outgrows a full /dev/shm (docker's
        default is 64 MiB) would otherwise kill the first rank that touches the missing page
        with SIGBUS, mid-collective. Nothing is left if there is no room. Returns an open
        descriptor."""
        if self.objects:
            os.close(os.open(self._marker(name), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
            try:
                fd = _posixshmem.shm_open(object_name(name), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            except OSError as exc:  # e.g. a Linux without /dev/shm, where MACFLEET_SHM_OBJECTS=1 was set
                os.unlink(self._marker(name))
                raise ConfigError(f"shared memory: cannot create a POSIX shared-memory object ({exc.strerror}); "
                                  f"set MACFLEET_SHM_OBJECTS=0, or MACFLEET_SHM=0 to exchange over sockets "
                                  f"only") from None
        else:
            fd = os.open(self._marker(name), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, nbytes)  # once: macOS refuses to resize an object
            if hasattr(os, "posix_fallocate"):  # Linux; macOS objects are plain memory
                os.posix_fallocate(fd, 0, nbytes)
        except OSError as exc:
            os.close(fd)
            self.unlink(name)
            where = "POSIX shared memory" if self.objects else self.directory
            raise ConfigError(
                f"shared memory: no room for {nbytes / 2**20:.0f} MiB in {where} ({exc.strerror}); make it larger "
                f"(docker run --shm-size) or set MACFLEET_SHM=0 to exchange over sockets only") from None
        return fd

    def open(self, name: str) -> int:
        if self.objects:
            return _posixshmem.shm_open(object_name(name), os.O_RDWR, 0o600)
        return os.open(self._marker(name), os.O_RDWR)

    def unlink(self, name: str) -> None:
        """Remove segment ``name``; its memory stays while a mapping of it does."""
        if self.objects:
            try:
                _posixshmem.shm_unlink(object_name(name))
            except FileNotFoundError:
                pass
        try:
            os.unlink(self._marker(name))
        except FileNotFoundError:
            pass

    def exists(self, name: str) -> bool:
        if not self.objects:
            return os.path.exists(self._marker(name))
        try:
            os.close(self.open(name))
        except FileNotFoundError:
            return False
        return True

    def _marker(self, name: str) -> str:
        """The segment's file, or, in objects mode, its marker."""
        return os.path.join(self.directory, name)


def release(directory: str) -> None:
    """Unlink every object that a marker in ``directory`` names: those of segments whose
    creator did not live to unlink them. The caller then removes the directory."""
    if _posixshmem is None:
        return
    try:
        names = [name for name in os.listdir(directory) if name.startswith(PREFIX)]
    except OSError:
        return
    for name in names:
        try:
            _posixshmem.shm_unlink(object_name(name))
        except OSError:
            pass  # a file segment (no object), or unlinked meanwhile
