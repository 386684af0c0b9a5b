"""How many threads a collective's host arithmetic may use: small collectives run on one.

torch runs an op on more than 32768 elements on the calling thread's OpenMP team, and every
thread that calls torch has a team of its own (the training thread's, the bucket thread's, the
ring's part threads). Between parallel regions those teams sleep: ranks run with
``OMP_WAIT_POLICY=PASSIVE`` (the agent sets it, since spinning teams starve the communication
threads), and even without it OpenMP stops spinning once a host has more team threads than
cores. So every such op pays for waking its team through the kernel. Measured on the device
machine (16 cores, 2 ranks of 8 threads): a 227 KB copy took 42-69 us on the team and 9 us on
one thread; on this project's 2-core machine, 85 us against 6 us from a second thread. gloo
reduces in plain loops and never pays it, and a small model's gradient bucket passes through
four or five such ops per step (copy in, reduce, copy out, average).

So a collective of at most ``inline_bytes`` runs its arithmetic on the calling thread alone
(a ring over sockets asks per piece it adds: one chunk of one segment, a fraction of the tensor).
Larger ones keep the team, which moves memory faster than one core does (16 MiB copy: 0.3 ms
on 8 threads, 1.5 ms on one). Measured on the device machine, 2 ranks of 8 threads, averaging
through shared memory: 227 KB took 210 us inline and 330 us on the team, 1 MiB 661 us inline
and 371 us on the team; the two cross near 450 KB. The switch is OpenMP's own per-thread setting,
``omp_set_num_threads``, which torch reads on every parallel op; it is put back when the
collective ends, so the caller's own work keeps its threads. Where torch runs without an
OpenMP runtime that we can find, nothing changes.
"""

from __future__ import annotations

import ctypes
import sys
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Callable

import torch

INLINE_BYTES = 256 << 10  # below the measured crossover (benchmarks/results/2026-11-22-session4)


def _openmp_setter() -> Callable[[int], object] | None:
    """``omp_set_num_threads`` of the OpenMP runtime torch itself loaded, or None."""
    if not torch.backends.openmp.is_available():
        return None
    torch_lib = Path(torch.__file__).parent / "lib"
    if sys.platform.startswith("linux"):  # the copy that is mapped: a second copy would be a second runtime
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split()[-1] for line in maps if "omp" in line.rsplit("/", 1)[-1]})
        # torch's own copy first: another package (scikit-learn, say) may have mapped one of its own
        paths.sort(key=lambda path: not path.startswith(str(torch_lib)))
    else:  # macOS wheels carry theirs next to libtorch
        paths = sorted(str(p) for p in torch_lib.glob("*omp*"))
    for path in paths:
        try:
            return ctypes.CDLL(path).omp_set_num_threads
        except (OSError, AttributeError):
            continue
    return None


_set_threads = _openmp_setter()


class _OnThisThread:
    """The block of ``threads_for`` that runs this thread's torch ops on this thread alone. A
    class, not a generator: it is entered at every collective, and a generator's context
    manager is twice the Python calls, each microseconds where they run cold after a backward."""

    __slots__ = ("full",)

    def __init__(self, full: int) -> None:
        self.full = full  # this thread's setting, put back at the end

    def __enter__(self) -> None:
        assert _set_threads is not None
        _set_threads(1)

    def __exit__(self, *exc: object) -> None:
        assert _set_threads is not None
        _set_threads(self.full)


_AS_IS = nullcontext()  # reusable: it keeps no state


def threads_for(nbytes: int, inline_bytes: int = INLINE_BYTES) -> AbstractContextManager[None]:
    """A block in which this thread's torch ops run on this thread alone if ``nbytes`` (the
    collective's size) is at most ``inline_bytes``; on its OpenMP team otherwise."""
    if _set_threads is None or nbytes > inline_bytes:
        return _AS_IS
    full = torch.get_num_threads()  # this thread's setting; the call also runs torch's per-thread
    if full == 1:                   # first-use setup, which would otherwise undo ours later
        return _AS_IS
    return _OnThisThread(full)
