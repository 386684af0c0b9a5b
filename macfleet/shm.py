"""The ranks of one host exchange through shared memory; signals go through it too.

On Apple silicon memory moves at 100-800 GB/s while loopback TCP moves a few, so the ranks
that share a Mac reduce through one shared segment: each rank copies its tensor into its own
slot, waits at a barrier, reduces its share of the elements across every slot into a result
slot, and copies the result out (a tensor over 1 MiB keeps the rank's own share where it is:
only that rank reads it). Every element is reduced by one rank, so all ranks get the same
bits; a small tensor (the ranks' together up to 512 KiB) is reduced whole by every rank, in
the same order, which saves the second barrier. Rounds of one slot are pipelined over two
buffers. Broadcasts and all-gathers go through the slots too: one barrier a round, where a
ring over sockets takes a hop per rank.

The barrier is a row of counters at the head of the segment, one cache line per rank: a rank
arrives by writing its barrier count and waits until every count has reached it. A socket
round trip costs tens of microseconds per barrier (measured: 250 us a round on 16 cores),
which made slots small enough to stay in cache slower than the memory traffic they save. A
rank that has waited a while sleeps until a rank arrives and rings it (``macfleet.doorbells``).

The segment is a file in the agent's per-job directory, under /dev/shm, or on macOS a POSIX
shared-memory object (``macfleet.segments``). The host's first rank creates it; once every local
rank has mapped it, it is unlinked, so the memory goes back to the system when the last process
exits, however it exits.
"""

from __future__ import annotations

import math
import mmap
import os
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path

import torch

from macfleet.doorbells import Doorbells
from macfleet.errors import CollectiveTimeout, ConfigError, ProtocolError
from macfleet.knobs import parse_size
from macfleet.segments import PREFIX, Segments
from macfleet.transport import Liveness

ALIGN = 64
PAGE = 4096
SPIN_S = 0.002  # wait this long yielding only the GIL, then sleep until rung (a rank far behind)
CHECK_S = 0.1  # how often a wait looks at the abort flag and the deadline (a sleep wakes for it)
DIRECT_BYTES = 1 << 20  # above this a rank's own share skips its slot and rows are added one call each
GATHER_BYTES = 512 << 10  # rows of all ranks up to this: every rank reduces every row itself, after one barrier

# A rank's control line: its barrier count; what it brings to the all-reduce in progress (the
# shared tensor's key, 0 for none, and where in its row the reduced run starts), read by the
# others after a barrier; and the collective it is in (``announce``): a version, odd while being
# written, then the collective; and whether it sleeps (``ASLEEP``, non-zero while it does). A
# sleeper writes ASLEEP, then reads the counts; an arriving rank writes its count, then reads
# ASLEEP, with a fence between each write and read. So of any sleeper and any arriving rank, one
# sees the other's write: the sleeper sees the count and does not sleep, or the arriving rank
# sees ASLEEP and rings it.
COUNT, KEY, START, VERSION, OP, WHAT, ELEMENTS, ASLEEP = 0, 1, 2, 3, 4, 5, 6, 7
LINE = ALIGN // 8  # words of one control line

_ordering = threading.Lock()


@dataclass(frozen=True)
class Signature:
    """The collective a rank is in. Every rank of a host must be in the same one: ranks that
    are not would read each other's bytes as their own, or wait at barriers that never match."""

    op: int  # the collective's number; every rank draws them in the same order
    kind: str  # one of KINDS
    numel: int
    dtype: torch.dtype
    reduce_op: str = ""  # one of REDUCE_OPS
    caller: str = ""  # one of CALLERS: what in macfleet issued it ("" for the script itself)
    root: int = -1  # a broadcast's source rank (below 2**15); -1 for the other kinds

    KINDS = ("all_reduce", "broadcast", "all_gather", "shared_tensor")
    REDUCE_OPS = ("", "sum", "avg", "max", "min")
    CALLERS = ("", "DataParallel (start)", "DataParallel (buffers)", "DataParallel (gradients)",
               "checkpoint.save", "checkpoint.load", "DataParallel (parameters changed)", "SyncBatchNorm",
               "DataParallel (join)", "all_reduce (sparse)")
    DTYPES = tuple(sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str))

    def words(self) -> tuple[int, int, int]:
        """(OP, WHAT, ELEMENTS) of a control line."""
        what = ((self.root + 1) << 48) | (self.CALLERS.index(self.caller) << 40) | \
            (self.KINDS.index(self.kind) << 32) | (self.DTYPES.index(self.dtype) << 16) | \
            self.REDUCE_OPS.index(self.reduce_op)
        return self.op, what, self.numel

    @classmethod
    def from_words(cls, op: int, what: int, numel: int) -> Signature:
        return cls(op, cls.KINDS[(what >> 32) & 0xFF], numel, cls.DTYPES[(what >> 16) & 0xFFFF],
                   cls.REDUCE_OPS[what & 0xFFFF], cls.CALLERS[(what >> 40) & 0xFF], (what >> 48) - 1)

    def __str__(self) -> str:
        what = f"{self.kind} of {self.numel} {str(self.dtype).removeprefix('torch.')}"
        what = f"{what} ({self.reduce_op})" if self.reduce_op else what
        what = f"{what} from rank {self.root}" if self.root >= 0 else what
        return f"{what}, from {self.caller}" if self.caller else what


@dataclass
class SharedTensor:
    """One allocation of ``shared_tensor``: row ``i`` is local rank ``i``'s tensor."""

    key: int  # allocation number, the same on every local rank
    rows: torch.Tensor  # [size, numel], rows in one mapping that every local rank has
    mapping: mmap.mmap


def _fence() -> None:
    """A full memory barrier, so the slot data a rank wrote is visible before its counter is,
    and read only after the counters are. x86 keeps stores in order anyway; ARM (Apple silicon)
    does not. Python has no fence, but a lock's release followed by an acquire is one (a
    store-release is never reordered with a later load-acquire), hence two lock round trips."""
    with _ordering:
        pass
    with _ordering:
        pass


class LocalGroup:
    """The ranks ``base .. base+size-1`` on this host, ``index`` being this rank's place."""

    def __init__(self, directory: str, job_id: str, base: int, size: int, index: int, slot_bytes: int,
                 liveness: Liveness, timeout_s: float, direct_bytes: int = DIRECT_BYTES,
                 objects: bool = False, gather_bytes: int = GATHER_BYTES) -> None:
        """``directory``: the agent's per-job directory; ``objects``: segments are POSIX
        shared-memory objects, not files in it (``macfleet.segments``)."""
        self.base, self.size, self.index = base, size, index
        self.direct_bytes, self.gather_bytes = direct_bytes, gather_bytes
        self.slot_bytes = max(ALIGN, slot_bytes - slot_bytes % ALIGN)
        self.liveness, self.timeout_s = liveness, timeout_s
        self.segments = Segments(directory, objects)
        self.name = f"{PREFIX}{job_id}-{base}"
        self._generation = 0
        self._round = 0
        self._shared: dict[int, SharedTensor] = {}  # by the data_ptr of this rank's row
        self._allocated = 0  # shared tensors so far: the same count on every local rank
        self._scratch = torch.empty(0, device="cpu")
        self._rows: dict[tuple[int, torch.dtype], torch.Tensor] = {}  # ``slots``, by buffer and dtype
        self._announced: Signature | None = None
        self._words = (0, 0, 0)  # the announcement as its control-line words, for the check after the barrier
        self._unchecked = False  # whether the first barrier since the announcement is still to come
        # how the last all_reduce went: "in place" (shared tensors where they are), "one barrier"
        # (a small one), "" (through the slots)
        self.path = ""
        # the barrier counters first: one 64-byte line each, so no two ranks write to one line
        self._control = -(-size * ALIGN // PAGE) * PAGE
        self._total = self._control + 2 * (size + 1) * self.slot_bytes  # two buffers of: a slot per rank + result
        if index == 0:  # before rendezvous, so the others find it when they attach
            fd = self.segments.create(self.name, self._total)  # zero-filled: every counter starts at 0
        else:
            fd = -1
        self._fd = fd
        self._bells = Doorbells(directory, self.name, size, index)
        self._asleep = [(i, i * LINE + ASLEEP) for i in range(size)]  # each rank's ASLEEP word
        self._mmap: mmap.mmap | None = None
        self._counters: memoryview | None = None
        self.raw: torch.Tensor | None = None

    def attach(self) -> None:
        """Map the segment (every rank has registered, so the leader has created it)."""
        try:
            self._mmap = _map(self._fd if self._fd >= 0 else self.segments.open(self.name), self._total)
        except ValueError:  # Python's mmap refuses to map past the end of the file
            raise ConfigError(self._layout_differs(f"slots of {self.slot_bytes} bytes (rank {self.base + self.index}) "
                                                   f"that do not fit the segment rank {self.base} made")) from None
        self._counters = memoryview(self._mmap)[:self._control].cast("q")
        # never an inference tensor, though macfleet.init() may run under torch.inference_mode():
        # every later collective writes into its slots, mostly outside that mode
        with torch.inference_mode(False):
            self.raw = torch.frombuffer(self._mmap, dtype=torch.uint8, offset=self._control)
        self._bells.open()
        self._counters[self.index * LINE + START] = self.slot_bytes  # unused until the first shared tensor
        self.barrier()
        self._bells.unlink()  # every rank has opened every FIFO
        slots = [self._counters[i * LINE + START] for i in range(self.size)]
        if len(set(slots)) > 1:  # slots at different offsets: every result would be garbage
            raise ConfigError(self._layout_differs(
                "slots of " + ", ".join(f"{n} bytes (rank {self.base + i})" for i, n in enumerate(slots))))
        self.barrier()  # every rank has read the slots before a shared tensor's length is written there
        if self.index == 0:  # everyone has it mapped: from now on only the mappings keep it alive
            self.segments.unlink(self.name)

    @staticmethod
    def _layout_differs(what: str) -> str:
        return (f"the ranks of this host lay out their shared memory differently: {what}. "
                f"MACFLEET_SHM_SLOT_BYTES must be the same for every rank of a host")

    # -- signalling -------------------------------------------------------------------------
    def barrier(self) -> None:
        assert self._counters is not None
        self._generation += 1
        gen, counters, stride = self._generation, self._counters, LINE
        _fence()  # what we wrote before, then the counter
        counters[self.index * stride + COUNT] = gen
        _fence()  # the counter, then who sleeps (see ASLEEP)
        for i, word in self._asleep:
            if counters[word]:
                self._bells.ring(i)
        started = time.monotonic()
        next_check, deadline = started + CHECK_S, started + self.timeout_s
        while any(counters[i * stride + COUNT] < gen for i in range(self.size)):
            now = time.monotonic()
            if now - started < SPIN_S:
                os.sched_yield()  # and the GIL: other threads (autograd hooks) may run between looks
            else:
                self._doze(gen, next_check - now)
            if now >= next_check:
                next_check = now + CHECK_S
                self.liveness.check()
                late = [i for i in range(self.size) if counters[i * stride + COUNT] < gen]
                self._check_late(late, gen)
                if self.liveness.held:  # a rank is in a debugger: no deadline while it is
                    deadline = now + self.timeout_s
                if now > deadline:
                    raise CollectiveTimeout(
                        f"local rank {self.index}: local ranks {late} of this host did not reach a barrier "
                        f"within {self.timeout_s:.0f} s")
        _fence()  # the counters, then what the others wrote
        self.liveness.moved()
        if self._unchecked:
            self._unchecked = False
            self._check_agreement()

    def _doze(self, gen: int, timeout_s: float) -> None:
        """Sleep until a rank arrives at barrier ``gen`` and rings, unless every rank has."""
        assert self._counters is not None
        counters, mine = self._counters, self.index * LINE + ASLEEP
        counters[mine] = gen
        _fence()  # that we sleep, then the counts (see ASLEEP)
        if any(counters[i * LINE + COUNT] < gen for i in range(self.size)):
            self._bells.sleep(max(0.0, timeout_s))
        counters[mine] = 0

    # -- agreement ----------------------------------------------------------------------------
    def announce(self, signature: Signature) -> None:
        """Publish the collective this rank is entering, before its first barrier. After that
        barrier every rank compares what all announced (so mismatched sizes, dtypes or ops are
        an error, never a mix of each other's bytes), and a rank waiting for late ones looks at
        theirs to tell a rank that is behind from one in another collective."""
        assert self._counters is not None
        counters, line = self._counters, self.index * LINE
        counters[line + VERSION] += 1  # odd: a reader that sees it skips the line
        _fence()
        self._words = signature.words()
        counters[line + OP], counters[line + WHAT], counters[line + ELEMENTS] = self._words
        _fence()
        counters[line + VERSION] += 1
        self._announced, self._unchecked = signature, True

    def _check_agreement(self) -> None:
        """After the first barrier of a collective every rank has announced it. A rank past the
        barrier may announce its next collective already (a broadcast of one round has no other
        barrier): a line that is not ours and that ``_published`` shows moving on or moved on is
        that, and is skipped. The rank compared the lines before it moved on, and of any two
        ranks the first to compare finds the other's line unchanged, so a mismatch is still
        found by one of them."""
        assert self._counters is not None and self._announced is not None
        counters, mine = self._counters, self._words
        for i in range(self.size):
            line = i * LINE
            if (counters[line + OP], counters[line + WHAT], counters[line + ELEMENTS]) != mine \
                    and counters[line + VERSION]:
                theirs = self._published(i)
                if theirs is not None and theirs.op <= self._announced.op:
                    self._disagree(i, waiting=False)

    def _check_late(self, late: list[int], gen: int) -> None:
        """A late rank that announced this collective differently, or a later one, is not
        behind: it is somewhere this rank will never meet it. Unless it has arrived since
        ``late`` was read: the last to arrive passes at once, and may announce its next
        collective before we look (its counter is written before that announcement, and read
        here after it, so a rank still short of ``gen`` is truly late)."""
        if self._announced is None:
            return
        assert self._counters is not None
        for i in late:
            theirs = self._published(i)
            _fence()  # the line, then the counter
            if theirs is None or self._counters[i * LINE + COUNT] >= gen:
                continue
            if theirs.op > self._announced.op or (theirs.op == self._announced.op and theirs != self._announced):
                self._disagree(i, waiting=True)

    def _published(self, i: int) -> Signature | None:
        """Local rank ``i``'s last announcement, or None if it has made none or is writing one."""
        assert self._counters is not None
        counters, line = self._counters, i * LINE
        version = counters[line + VERSION]
        _fence()
        words = counters[line + OP], counters[line + WHAT], counters[line + ELEMENTS]
        _fence()
        if version == 0 or version % 2 or counters[line + VERSION] != version:
            return None
        return Signature.from_words(*words)

    def _disagree(self, i: int, waiting: bool) -> None:
        theirs, me, other = self._published(i), self.base + self.index, self.base + i
        where = "waits for it in" if waiting else "is in"
        raise ProtocolError(
            f"rank {other} and rank {me} are in different collectives: rank {other} is in {theirs} "
            f"(collective {theirs.op if theirs else '?'}), while rank {me} {where} {self._announced} "
            f"(collective {self._announced.op if self._announced else '?'}). Every rank must call the same "
            f"collectives, in the same order, on tensors of the same size and dtype")

    # -- the all-reduce ---------------------------------------------------------------------
    def slot(self, buffer: int, index: int, dtype: torch.dtype, numel: int) -> torch.Tensor:
        """Rank ``index``'s slot of ``buffer`` (``index == size``: the result slot)."""
        assert self.raw is not None
        start = (buffer * (self.size + 1) + index) * self.slot_bytes
        return self.raw[start: start + numel * dtype.itemsize].view(dtype)

    def slots(self, buffer: int, dtype: torch.dtype) -> torch.Tensor:
        """Every rank's slot of ``buffer`` as rows of one strided tensor ``[size, slot elements]``.
        Made once for each buffer and dtype: three torch calls that a small all-reduce made each
        time, at tens of microseconds each where they run cold, after a backward."""
        rows = self._rows.get((buffer, dtype))
        if rows is None:
            assert self.raw is not None
            start = buffer * (self.size + 1) * self.slot_bytes
            with torch.inference_mode(False):  # kept: see attach
                rows = self.raw[start: start + self.size * self.slot_bytes].view(dtype).view(self.size, -1)
            self._rows[(buffer, dtype)] = rows
        return rows

    def all_reduce(self, src: torch.Tensor, out: torch.Tensor, op: str, divide_by: int = 1) -> None:
        """``out`` = reduction (``sum``, ``max``, ``min``) over this host's ranks of ``src`` (flat
        tensors; ``out`` may be ``src``), divided by ``divide_by`` (for an average, in the same
        pass). ``src`` may be on a device: it is copied (blocking) straight into this rank's slot.

        When every rank brings the same ``shared_tensor``, or the same run of its elements
        (``out`` is ``src``), the ranks reduce straight from each other's tensors and write the
        result into all of them: two passes over the memory instead of five, and two barriers.
        Otherwise the tensors go through the slots, in rounds of one slot each, pipelined over
        the two buffers with one barrier per round: barrier t means every rank has copied in
        round t, reduced its share of round t-1 and copied out round t-2, so after it a rank may
        reduce round t, copy out round t-1 and copy in round t+1 (into the buffer round t-1
        used, which nobody reads any more).

        A rank's own share of a round skips its slot when ``src`` is host memory of the
        working dtype (and not small): only the rank itself reduces it, so it reads it from
        ``src`` and writes the result straight into ``out`` (and the result slot, for the
        others). That saves three of the five passes over the share: 27% of the memory traffic
        at 2 ranks, 14% at 4, 7% at 8.

        A small tensor (the ranks' together up to ``gather_bytes``, and one slot) takes one
        round and one barrier: see ``_all_reduce_gathered``. The choice rests on its size
        alone, which every rank agrees on (a rank that disagrees is stopped at the first
        barrier), never on whether it is a shared tensor."""
        nbytes = out.numel() * out.element_size()
        if nbytes * self.size <= self.gather_bytes and nbytes <= self.slot_bytes:
            self.path = "one barrier"
            self._all_reduce_gathered(src, out, op, divide_by)
            return
        shared, start = self._holder(out) if src.data_ptr() == out.data_ptr() else (None, 0)
        in_place = bool(self._allocated) and self._agree_on(shared, start)
        self.path = "in place" if in_place else ""
        if in_place:
            assert shared is not None
            rows = shared.rows[:, start:start + out.numel()]
            self._reduce_rows(rows, rows, self._share(out.numel()), op, divide_by)
            self.barrier()  # every share of every row is final
            return
        per_round = self.slot_bytes // out.dtype.itemsize
        rounds = [(start, min(start + per_round, src.numel())) for start in range(0, src.numel(), per_round)]
        first = self._round
        self._round += len(rounds)
        # Host memory of the working dtype is read in place (else the slot converts it); a
        # small tensor's round costs more in torch calls than in bytes, so it takes three calls.
        direct = (src.device.type == "cpu" and src.dtype == out.dtype
                  and src.numel() * src.element_size() > self.direct_bytes)
        self._copy_in(first, src, out.dtype, rounds[0], direct)
        for t, span in enumerate(rounds):
            self.barrier()
            self._reduce_share(first + t, src, out, span, op, divide_by, direct)
            if t > 0:
                self._copy_out(first + t - 1, out, rounds[t - 1], direct)
            if t + 1 < len(rounds):
                self._copy_in(first + t + 1, src, out.dtype, rounds[t + 1], direct)
        self.barrier()  # the last round's result is complete
        self._copy_out(first + len(rounds) - 1, out, rounds[-1], direct)

    def _all_reduce_gathered(self, src: torch.Tensor, out: torch.Tensor, op: str, divide_by: int) -> None:
        """Every rank copies its tensor into its slot, and after one barrier reduces every row
        itself, in rank order, into ``out``. Every rank makes the same calls on the same rows,
        so all get the same bits. For a small tensor that is cheaper than a result slot written
        by one rank and read by the others, which needs a second barrier and more torch calls:
        measured on 16 cores, one element took 14-24 us instead of 38-72 (2 to 8 ranks). Each
        rank reads every rank's row, so the gain shrinks with the rows' total: the two ways
        were level at 128 KiB a rank with 4 ranks and 8 (512 KiB and 1 MiB in all), and at 256
        KiB a rank with 8 ranks the one barrier took 0.44 ms instead of 0.31. The buffers
        alternate as in ``all_gather`` (``_gathered``)."""
        _reduce_columns(self._gathered(src, out.dtype), out, op)
        if divide_by != 1:
            out.div_(divide_by)

    def _holder(self, out: torch.Tensor) -> tuple[SharedTensor | None, int]:
        """The shared tensor whose row (this rank's) holds ``out``, all of it or a run of its
        elements (``buf[a:b]`` of a ``macfleet.host_tensor``), and where in the row ``out``
        starts; (None, 0) for anything else (a view of another dtype does not line up)."""
        ptr = out.data_ptr()
        found = next(((row, shared) for row, shared in list(self._shared.items())  # a finalizer may drop one meanwhile
                      if row <= ptr < row + shared.rows.shape[1] * shared.rows.element_size()), None)
        if found is None or found[1].rows.dtype != out.dtype or not out.is_contiguous():
            return None, 0
        row, shared = found
        start, misaligned = divmod(ptr - row, out.element_size())
        if misaligned or start + out.numel() > shared.rows.shape[1]:
            return None, 0
        return shared, start

    def _agree_on(self, shared: SharedTensor | None, start: int) -> bool:
        """Publish which shared tensor (if any) this rank brings and where its part starts, and
        return whether every rank brings the same part of the same one (the collective's
        signature has its length): all ranks read the same lines after the barrier, so all
        decide alike. (Until a shared tensor exists anywhere, no rank can bring one: no
        barrier then.)"""
        assert self._counters is not None
        counters, line = self._counters, self.index * LINE
        counters[line + KEY] = shared.key if shared is not None else 0
        counters[line + START] = start
        self.barrier()
        mine = (counters[line + KEY], counters[line + START])
        return mine[0] != 0 and all((counters[i * LINE + KEY], counters[i * LINE + START]) == mine
                                    for i in range(self.size))

    def shared_tensor(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A zeroed flat tensor in memory that every rank of this host maps, so that an
        ``all_reduce`` of it copies nothing in or out. A collective: every local rank calls it
        in the same order with the same ``numel`` and ``dtype``. The memory is unmapped when the
        returned tensor and every view of it are gone (the file is unlinked at once, so a crash
        frees it too)."""
        if numel < 1:
            raise ConfigError(f"a shared tensor needs at least one element, not {numel}")
        self._allocated += 1
        key = self._allocated
        row = -(-numel * dtype.itemsize // PAGE) * PAGE  # rows of whole pages: no line is written by two ranks
        name = f"{self.name}-t{key}"
        if self.index == 0:
            fd = self.segments.create(name, row * self.size)
        self.barrier()  # the segment exists
        mapping = _map(fd if self.index == 0 else self.segments.open(name), row * self.size)
        self.barrier()  # everyone has mapped it
        if self.index == 0:
            self.segments.unlink(name)
        # Never inference tensors, though the caller may be under torch.inference_mode(): every
        # later all-reduce of it writes into them, mostly outside that mode (a view of another
        # dtype made inside the mode is an inference tensor, as a new tensor made there is).
        with torch.inference_mode(False):
            rows = torch.frombuffer(mapping, dtype=torch.uint8).view(self.size, row)[:, :numel * dtype.itemsize]
            shared = SharedTensor(key, rows.view(dtype), mapping)
            mine = shared.rows[self.index]
        self._shared[mine.data_ptr()] = shared
        # Once the caller drops it, forget it; the mapping then goes with the last view of it.
        weakref.finalize(mine, self._shared.pop, mine.data_ptr(), None).atexit = False
        return mine

    def _share(self, n: int) -> tuple[int, int]:
        """The elements of ``n`` that this rank reduces (the same split on every rank)."""
        return split_evenly(n, self.size)[self.index]

    def _copy_in(self, round_: int, src: torch.Tensor, dtype: torch.dtype, span: tuple[int, int],
                 direct: bool) -> None:
        """The round's elements into this rank's slot (in the working dtype: half precision is
        reduced in float32); all but its own share when that is read from ``src`` directly."""
        start, stop = span
        slot = self.slot(round_ % 2, self.index, dtype, stop - start)
        if not direct:
            slot.copy_(src[start:stop])
            return
        _copy_all_but(slot, src[start:stop], self._share(stop - start))

    def _copy_out(self, round_: int, out: torch.Tensor, span: tuple[int, int], direct: bool) -> None:
        """The round's result into ``out``; only the others' shares when ``direct`` (ours is
        there already)."""
        start, stop = span
        result = self.slot(round_ % 2, self.size, out.dtype, stop - start)
        if not direct:
            out[start:stop].copy_(result)
            return
        _copy_all_but(out[start:stop], result, self._share(stop - start))

    def _reduce_share(self, round_: int, src: torch.Tensor, out: torch.Tensor, span: tuple[int, int], op: str,
                      divide_by: int, direct: bool) -> None:
        """Reduce this rank's share of the round across every rank into the result slot (when
        ``direct``, into ``out`` first, from ``src``). A large share takes one torch call per
        rank's row, in rank order (when ``direct`` the own row first: it is in ``src``, outside
        the segment), and never calls on pieces of it: each call wakes the rank's OpenMP team,
        which cost more than cache misses on 16 cores (benchmarks/results/2026-11-22-session8)."""
        start, stop = span
        buf, n = round_ % 2, stop - start
        a, b = self._share(n)
        if a == b:  # fewer elements than ranks: nothing of this round is ours
            return
        result = self.slot(buf, self.size, out.dtype, n)
        if not direct and n * out.element_size() <= self.direct_bytes:  # a small round: one call, not one per row
            self._reduce_rows(self.slots(buf, out.dtype)[:, :n], result.unsqueeze(0), (a, b), op, divide_by)
            return
        rows = [self.slot(buf, j, out.dtype, n)[a:b] for j in range(self.size)]
        if not direct:
            _combine(rows, result[a:b], op)
            if divide_by != 1:
                result[a:b].div_(divide_by)
            return
        # Into our own output first, from our own row: where ``out`` is ``src`` the sum is
        # written over what was just read (no line fetched for writing alone), and the copy
        # into the result slot reads it back from cache.
        mine = out[start + a:start + b]
        _combine([src[start + a:start + b]] + rows[:self.index] + rows[self.index + 1:], mine, op)
        if divide_by != 1:
            mine.div_(divide_by)
        result[a:b].copy_(mine)

    def _reduce_rows(self, inputs: torch.Tensor, outputs: torch.Tensor, share: tuple[int, int], op: str,
                     divide_by: int) -> None:
        """Columns ``share`` of ``inputs`` ([size, n]) reduced over the rows, then written into
        every row of ``outputs`` ([rows, n]). Pieces of one slot keep the partial result in cache."""
        a, b = share
        step = max(1, self.slot_bytes // inputs.element_size())
        for start in range(a, b, step):
            stop = min(start + step, b)
            rows = inputs[:, start:stop]
            if outputs.shape[0] == 1:
                result = outputs[0, start:stop]
            else:  # results go to several rows: reduce into scratch first
                if self._scratch.numel() < stop - start or self._scratch.dtype != inputs.dtype:
                    with torch.inference_mode(False):  # reused: see shared_tensor
                        self._scratch = torch.empty(step, dtype=inputs.dtype, device="cpu")
                result = self._scratch[: stop - start]
            _reduce_columns(rows, result, op)
            if outputs.shape[0] == 1:
                if divide_by != 1:
                    result.div_(divide_by)
            elif divide_by != 1:  # divided on the way out: one pass over the piece fewer, the same bits
                torch.div(result.expand(outputs.shape[0], -1), divide_by, out=outputs[:, start:stop])
            else:
                outputs[:, start:stop].copy_(result.expand(outputs.shape[0], -1))

    def broadcast(self, data: torch.Tensor, root: int = 0) -> None:
        """Local rank ``root``'s ``data`` to every rank of this host (overwritten on the others),
        in rounds of one slot: the root copies in, a barrier, the others copy out. Round t's
        buffer is written again at round t+2, after the barrier that every rank reaches only
        once it has copied round t out."""
        per_round = self.slot_bytes // data.element_size()
        for start in range(0, data.numel(), per_round):
            piece = data[start: start + per_round]
            buf = self._round % 2
            self._round += 1
            if self.index == root:
                self.slot(buf, root, data.dtype, piece.numel()).copy_(piece)
            self.barrier()
            if self.index != root:
                piece.copy_(self.slot(buf, root, data.dtype, piece.numel()))

    def all_gather(self, block: torch.Tensor, out: torch.Tensor) -> None:
        """``out[i]`` = local rank ``i``'s ``block`` (flat host tensors; ``out`` is ``[size,
        block.numel()]`` and ``block`` may be this rank's row of it), in rounds of one slot:
        every rank copies its piece into its slot, a barrier, every rank copies all slots out
        (buffers reused as in ``broadcast``)."""
        per_round = self.slot_bytes // block.element_size()
        for start in range(0, block.numel(), per_round):
            n = min(per_round, block.numel() - start)
            out[:, start: start + n].copy_(self._gathered(block[start: start + n], block.dtype))

    def _gathered(self, piece: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """One round: ``piece`` (at most a slot, converted to ``dtype``) into this rank's slot,
        a barrier, and every rank's piece as the rows ``[size, piece.numel()]`` of the round's
        buffer. They stay valid until the round after next writes that buffer again, after a
        barrier that every rank reaches only once it is done with them."""
        n, buf = piece.numel(), self._round % 2
        self._round += 1
        rows = self.slots(buf, dtype)[:, :n]
        rows[self.index].copy_(piece)
        self.barrier()
        return rows

    def close(self) -> None:
        self.raw = None
        self._rows.clear()
        for shared in list(self._shared.values()):
            try:
                shared.mapping.close()
            except BufferError:
                pass  # a tensor view is still alive; the mapping goes with the process
        self._shared.clear()
        if self._counters is not None:
            self._counters.release()
            self._counters = None
        if self._mmap is not None:
            try:
                self._mmap.close()
            except BufferError:
                pass  # a tensor view is still alive; the mapping goes with the process
        self._bells.close()
        if self.index == 0:
            self.segments.unlink(self.name)  # closed before every rank had mapped it


def _reduce_columns(rows: torch.Tensor, result: torch.Tensor, op: str) -> None:
    """``result`` = the rows of ``rows`` ([ranks, n]) reduced with ``op`` (sum, max, min)."""
    if op == "sum" and rows.shape[0] == 2:  # measured: one add beats a two-row strided sum
        torch.add(rows[0], rows[1], out=result)
    elif op == "max":
        torch.amax(rows, dim=0, out=result)
    elif op == "min":
        torch.amin(rows, dim=0, out=result)
    else:
        torch.sum(rows, dim=0, dtype=rows.dtype, out=result)


def _combine(rows: list[torch.Tensor], result: torch.Tensor, op: str) -> None:
    """``result`` = ``rows`` reduced with ``op`` (sum, max, min), in row order."""
    if len(rows) == 1:
        result.copy_(rows[0])
        return
    fn = {"sum": torch.add, "max": torch.maximum, "min": torch.minimum}[op]
    fn(rows[0], rows[1], out=result)
    for row in rows[2:]:
        fn(result, row, out=result)


def _copy_all_but(dst: torch.Tensor, src: torch.Tensor, share: tuple[int, int]) -> None:
    """``dst`` = ``src`` outside ``share`` (a rank's own elements, which it keeps where they are).
    The first and the last rank's shares leave one side empty: no call for it."""
    a, b = share
    if a > 0:
        dst[:a].copy_(src[:a])
    if b < dst.numel():
        dst[b:].copy_(src[b:])


def _map(fd: int, nbytes: int) -> mmap.mmap:
    """Map ``nbytes`` of the open file and close the descriptor (the mapping keeps the file)."""
    try:
        return mmap.mmap(fd, nbytes)
    finally:
        os.close(fd)


def default_slot_bytes(ranks: int, cache_bytes: int | None = None, cores: int | None = None) -> int:
    """Shared memory per rank and round: as large as the host's shared cache leaves room for.

    A slot is written by one rank and read by the others within a round or two, so while the
    segment (two buffers of ``ranks`` + 1 slots) stays in the cache the cores share
    (``cache_bytes``), its bytes never go to memory: only the tensors do. The slot is the power
    of two nearest to what puts the segment in half that cache. It is at most what was
    measured best where the cache holds any segment (benchmarks/device_run.sh slots, 16 cores,
    300 MiB L3): 16 MiB up to 4 ranks, where fewer rounds matter most, and 4 MiB from 8 on
    (1.3x faster than 16 at 256 MiB). On the project's 2-core machine (32 MiB L3, one thread a
    rank) 2 MiB slots took 64 MiB in 11-17 ms against 18-22 ms with 16 MiB, and 1 MiB and 512
    KiB were slower again (benchmarks/results/2026-11-27-session44). Where the cache is not
    known, the largest.

    Above all that, a rank of several threads gets at least 2 MiB per thread (its share of
    ``cores``), up to 16 MiB: each round's torch calls wake the rank's OpenMP team (150-200 us
    a round at 8 threads), so such a rank needs rounds long enough to pay for them. On 64
    cores, 8 ranks of 8 threads moved 16-256 MiB at 0.9-1.6x gloo's speed in 4 MiB slots,
    1.6-2.6x in 8 MiB and 2.3-2.7x in 16 MiB (benchmarks/results/2026-11-28-session59)."""
    largest = (16 << 20) if ranks <= 4 else (4 << 20)
    threads = (cores or 1) // ranks
    least = min(16 << 20, (2 << 20) * threads) if threads > 1 else 1 << 20
    if not cache_bytes:
        return max(least, largest)
    nearest = 1 << max(0, round(math.log2(cache_bytes / (4 * (ranks + 1)))))
    return max(least, min(largest, nearest))


def shared_cache_bytes(root: str = "/sys/devices/system/cpu/cpu0/cache") -> int | None:
    """The largest cache that several cores share, as Linux describes it (the L3 of an x86
    machine), or None where nothing says (macOS: Apple silicon's L2 belongs to one cluster of
    cores, and the system-level cache that all share is not reported)."""
    largest = None
    for index in Path(root).glob("index*"):
        try:
            kind, shared, size = ((index / name).read_text().strip() for name in ("type", "shared_cpu_list", "size"))
            nbytes = parse_size(size)
        except (OSError, ValueError):
            continue
        if kind != "Instruction" and any(c in shared for c in ",-") and nbytes > (largest or 0):
            largest = nbytes
    return largest


def split_evenly(n: int, parts: int) -> list[tuple[int, int]]:
    """``n`` elements in ``parts`` contiguous ranges, the first ``n % parts`` one longer."""
    base, extra = divmod(n, parts)
    out, start = [], 0
    for p in range(parts):
        end = start + base + (1 if p < extra else 0)
        out.append((start, end))
        start = end
    return out
