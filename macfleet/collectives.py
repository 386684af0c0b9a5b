"""Collectives: all_reduce, broadcast, all_gather, barrier, made one at a time in the same
order on every rank.

A contiguous host tensor in its working dtype is reduced in its own memory; anything else goes
through reusable host buffers (a device tensor's memory is not host memory, and half precision is
reduced in float32 on the host). Ranks of one host reduce and broadcast through shared memory
(``macfleet.shm``) and, across hosts, on a ring of the hosts' first ranks; they gather the
same way. Without shared memory every collective runs on the ring of all ranks. How the bytes
go round a ring is ``macfleet.ring_algorithms``'; this module decides which way a collective
goes, and keeps the order: each collective is numbered, announced to the heartbeat and to the
host's other ranks, and recorded for the report of ranks that went different ways.

Results are identical on every rank: each element is reduced once, by one rank, in a fixed
order, then copied to the others.
"""

from __future__ import annotations

import ctypes
import hashlib
import threading
import time
from collections import deque
from contextlib import contextmanager
from typing import Callable, Iterator

import torch

from macfleet import hostops, protocol, timeline
from macfleet.arguments import (WIRE_DTYPES, as_numbers, check_all_gather, check_all_reduce, check_broadcast,
                                made_of_numbers)
from macfleet.errors import ConfigError, JobAborted, PeerLost, ProtocolError
from macfleet.history import History, call_site, where
from macfleet.host_buffers import HostBuffers
from macfleet.ring_algorithms import REDUCERS, SMALL_BYTES, ZERO_COPY_BYTES, RingAlgorithms, even_spans
from macfleet.shm import LocalGroup, Signature
from macfleet.transport import Liveness, Ring

LEFT = ("this rank left the job with macfleet.shutdown(): a collective, DataParallel or macfleet.init() after it "
        "cannot run; call macfleet.shutdown() last")
# Half precision is reduced in float32 on the host (DESIGN.md section 4).
WORK_DTYPE = {torch.float16: torch.float32, torch.bfloat16: torch.float32}


class Collectives:
    def __init__(self, rank: int, world: int, liveness: Liveness, ring: Ring | None = None,
                 chunk_bytes: int = 4 << 20, small_bytes: int = SMALL_BYTES,
                 min_part_bytes: int = 256 << 10, local: LocalGroup | None = None, leaders: Ring | None = None,
                 shared_memory: bool = False, all_streams: bool = True,
                 inline_bytes: int = hostops.INLINE_BYTES, zero_copy_bytes: int = ZERO_COPY_BYTES) -> None:
        """``ring``: the ring of all ranks, for collectives without shared memory.
        ``shared_memory``: every collective goes through ``local`` (this host's ranks) and,
        across hosts, ``leaders`` (the ring of each host's first rank, given to those ranks only).
        ``inline_bytes``: collectives up to this size do their arithmetic on the calling thread
        alone (``macfleet.hostops``). The other sizes and ``all_streams`` tune the rings
        (``RingAlgorithms``)."""
        self._ring = ring
        self.local, self.leaders, self.shared_memory = local, leaders, shared_memory
        self.liveness = liveness
        self.rank, self.world = rank, world
        self.inline_bytes = inline_bytes
        self.ops_done = 0  # progress counter, read by the heartbeat
        self.started = time.monotonic()
        self.waited_s = 0.0  # time the script's threads spent blocked in macfleet (``waiting``)
        self.stood_by_s = 0.0  # time neither worked nor waited for a slower rank (``standing_by``)
        # Waits for a collective handed to a background thread that has not run yet (the round of
        # DataParallel.join, which forward does not wait for): any other thread's collective must
        # come after it, or ranks would number the two differently.
        self.ahead: Callable[[], None] | None = None
        # Waits until DataParallel's thread has averaged every gradient bucket released so far
        # (``BucketThread.drain``): a collective of the script's, made inside backward, comes after
        # them, at the same place on every rank.
        self.drain: Callable[[], None] | None = None
        # For the launcher's suggested shares: the seconds this rank worked in each training step
        # (DataParallel notes them, its waits left out), and its part of every step's samples.
        self.step_work_s: deque[float] = deque(maxlen=4096)
        self.step_share: float | None = None
        # (collective, op id, since, caller's line, a broadcast's source or -1)
        self.current: tuple[str, int, float, tuple[str, int], int] | None = None
        self.history = History()  # the last collectives, for the report of ranks that disagree
        # The collective this rank left by an exception, halfway for all it knows: the others may
        # wait in it for data that will never come, and its sockets may hold part of it. Nothing
        # can follow it (``_collective``); the heartbeat and the goodbye tell the launcher.
        self.broken: dict | None = None
        # The exception that ended the script ("Type: message"), once it has (bootstrap.py): a
        # rank whose process then does not exit waits for threads of the script, and the launcher
        # ends the job rather than wait with it.
        self.ended: str | None = None
        self.last_algorithm = ""  # which path the last all_reduce took (for benchmarks)
        self._op = 0
        # Collectives are made one at a time, in the same order everywhere (``_enter``): the
        # thread in one now, and what a thread that tried to start another meanwhile was told;
        # once the rank is leaving (``refuse_new``), none starts.
        self._entry = threading.Condition()
        self._inside: threading.Thread | None = None
        self._crossed: str | None = None
        self._leaving = False
        self._thread = threading.local()  # this thread's caller (on_behalf_of) and waiting state (waiting)
        self._by = ""  # the caller of the collective in progress, for its headers
        self._host = HostBuffers()
        self._on_ring = RingAlgorithms(
            self._host, len(self.rings[0].channels) - 1 if self.rings else 0, chunk_bytes=chunk_bytes,
            small_bytes=small_bytes, min_part_bytes=min_part_bytes, inline_bytes=inline_bytes,
            zero_copy_bytes=zero_copy_bytes, all_streams=all_streams)

    # -- public collectives -----------------------------------------------------------------
    def all_reduce(self, tensor: torch.Tensor, op: str = "sum", name: str = "tensor",
                   compression: str = "none", by: str | None = None) -> torch.Tensor:
        """``compression`` (``fp16``, ``bf16``) casts what crosses the network only; the
        reduction itself stays float32 on the host. ``by``: the caller, as ``on_behalf_of``
        says it for a block (DataParallel's gradients, every step: a block costs more)."""
        check_all_reduce(tensor, op, name, compression)
        if tensor.layout == torch.sparse_coo:
            return self._all_reduce_sparse(tensor, op, name)
        if made_of_numbers(tensor):
            numbers, op = as_numbers(tensor, name, op)
            self.all_reduce(numbers, op, name, compression)
            return tensor
        data = _outside_autograd(tensor)
        work_dtype = WORK_DTYPE.get(tensor.dtype, tensor.dtype)
        numel = tensor.numel()
        with self._collective("all_reduce", numel * work_dtype.itemsize, tensor, op, name=name, by=by) as op_id:
            if numel == 0:
                return tensor
            # A contiguous host tensor already in the working dtype is reduced in its own memory;
            # anything else (device tensors, half precision) goes through a reused host buffer.
            in_place = data.device.type == "cpu" and data.dtype == work_dtype and data.is_contiguous()
            if in_place:
                work, raw = data.view(-1), host_memory(data)
            else:
                work, raw = self._host.get("reduce", numel, work_dtype)
            wire = WIRE_DTYPES[compression] if work_dtype.is_floating_point else None
            # the ring's message headers; ranks of one host that share memory send none
            meta = {"c": "all_reduce", "numel": numel, "dtype": str(tensor.dtype), "rop": op, "wire": str(wire),
                    "by": self._by} if self._ring is not None or self.leaders is not None else {}
            reducer = REDUCERS[op]
            # Through shared memory whatever the size: its barrier costs microseconds, so even a
            # 4 KiB all-reduce is faster there than one pass round the ring (benchmarks/).
            averaged = False
            if self.shared_memory:
                averaged = self._reduce_hierarchical(op_id, data.reshape(-1), work, raw, op, meta, wire)
            else:
                if not in_place:
                    work.copy_(data.reshape(-1))  # blocking device->host copy (and upcast), see mps-facts.md
                self._on_ring.all_reduce(self.ring, op_id, work, raw, reducer, meta, wire)
                self.last_algorithm = self._on_ring.last_algorithm
            if op == "avg" and not averaged:
                work.div_(self.world)
            if not in_place:
                data.copy_(work.view(data.shape))
        return tensor

    def _all_reduce_sparse(self, tensor: torch.Tensor, op: str, name: str) -> torch.Tensor:
        """A sparse COO tensor, reduced as gloo reduces one: every rank's entries gathered (their
        counts first, then indices and values padded to the largest count), summed where they
        coincide, and written back into ``tensor``. Every rank sums the same entries in the same
        order, so the result is the same bits everywhere."""
        mine = tensor.detach().cpu().coalesce()  # on the host, where its entries go anyway (MPS lacks sparse kernels)
        count = mine._nnz()
        with self.on_behalf_of("all_reduce (sparse)"):
            # Each rank's count of entries, and what its tensor is: a rank's entries summed into
            # another shape were written out of place, and the ranks ended with different results.
            header = torch.tensor([count, mine.sparse_dim(), mine.dim(), digest(tuple(mine.shape))],
                                  dtype=torch.int64, device="cpu")
            headers = self.all_gather(header, name)
            if not bool((headers[:, 1:] == headers[0, 1:]).all()):
                raise self._sparse_shapes_differ(mine, headers, name)
            counts = headers[:, 0].tolist()
            most = max(counts)
            indices = torch.zeros(mine.sparse_dim(), most, dtype=torch.int64, device="cpu")
            indices[:, :count] = mine.indices()
            values = torch.zeros((most, *mine.values().shape[1:]), dtype=mine.dtype, device="cpu")
            values[:count] = mine.values()
            indices, values = self.all_gather(indices, name), self.all_gather(values, name)
        # Checked as it is made: every rank's entries within the shape. Through the switch, not
        # the check_invariants argument: torch 2.11 warns at a process's first sparse_coo_tensor
        # ("Sparse invariant checks are implicitly disabled") whatever the argument says.
        with torch.sparse.check_sparse_tensor_invariants(enable=True):
            whole = torch.sparse_coo_tensor(torch.cat([indices[r, :, :n] for r, n in enumerate(counts)], 1),
                                            torch.cat([values[r, :n] for r, n in enumerate(counts)]), tensor.shape,
                                            device="cpu")
        whole = whole.coalesce()
        if op == "avg":
            whole = whole / self.world
        # a leaf that requires grad takes it under no_grad (entered last: inference_mode(False) enables grad)
        with torch.inference_mode(tensor.is_inference()), torch.no_grad():
            tensor.copy_(whole.to(tensor.device))
        return tensor

    def _sparse_shapes_differ(self, mine: torch.Tensor, headers: torch.Tensor, name: str) -> ConfigError:
        """Every rank has seen that the ranks' sparse tensors differ: each gathers their shapes
        (padded to the longest, -1 past a shape's end) and names them alike."""
        padded = torch.full((1 + int(headers[:, 2].max()),), -1, dtype=torch.int64, device="cpu")
        padded[0] = mine.sparse_dim()
        padded[1:1 + mine.dim()] = torch.tensor(mine.shape, dtype=torch.int64, device="cpu")
        rows = self.all_gather(padded, name).tolist()
        told = ", ".join(f"rank {r}: {[n for n in row[1:] if n >= 0]} ({row[0]} sparse)" for r, row in enumerate(rows))
        return ConfigError(f"{name}: the ranks all-reduce sparse tensors of different shapes ({told}); every rank must "
                           f"give one of the same shape and sparse dimensions")

    def broadcast(self, tensor: torch.Tensor, src: int = 0, name: str = "tensor") -> torch.Tensor:
        src = check_broadcast(tensor, src, self.world, name)
        if made_of_numbers(tensor):
            self.broadcast(as_numbers(tensor, name)[0], src, name)
            return tensor
        data = _outside_autograd(tensor)
        with self._collective("broadcast", tensor.numel() * tensor.element_size(), tensor, root=src,
                              name=name) as op_id:
            if tensor.numel() == 0:
                return tensor
            work, raw = self._host.get("broadcast", tensor.numel(), tensor.dtype)
            if self.rank == src:
                work.copy_(data.reshape(-1))
            meta = {"c": "broadcast", "numel": tensor.numel(), "dtype": str(tensor.dtype), "root": src,
                    "by": self._by}
            if self.shared_memory:
                self._broadcast_hierarchical(op_id, work, raw, src, meta)
            else:
                self._on_ring.broadcast(self.ring, op_id, work, raw, src, meta)  # on the ring of all, position == rank
            if self.rank != src:
                data.copy_(work.view(data.shape))
        return tensor

    def all_gather(self, tensor: torch.Tensor, name: str = "tensor") -> torch.Tensor:
        """Every rank's tensor, stacked: a new tensor of shape ``(world, *tensor.shape)``."""
        check_all_gather(tensor, name)
        if made_of_numbers(tensor):
            gathered = self.all_gather(as_numbers(tensor, name)[0], name)
            return gathered.view(torch.bool) if tensor.dtype == torch.bool else torch.view_as_complex(gathered)
        out = torch.empty((self.world, *tensor.shape), dtype=tensor.dtype, device=tensor.device)
        with self._collective("all_gather", self.world * tensor.numel() * tensor.element_size(), tensor,
                              name=name) as op_id:
            if tensor.numel() == 0:
                return out
            blocks, raw = self._host.get("gather", self.world * tensor.numel(), tensor.dtype)
            blocks = blocks.view(self.world, -1)
            blocks[self.rank].copy_(_outside_autograd(tensor).reshape(-1))
            meta = {"c": "all_gather", "numel": tensor.numel(), "dtype": str(tensor.dtype), "by": self._by}
            if self.shared_memory:
                self._gather_hierarchical(op_id, blocks, raw, meta)
            else:
                self._on_ring.all_gather(self.ring, op_id, blocks.view(-1), raw,
                                         even_spans(self.world, blocks.shape[1]), meta)
            out.copy_(blocks.view(out.shape))
        return out

    def host_tensor(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A zeroed flat host tensor that ``all_reduce`` reduces without copying it in or out
        where this host's ranks share memory (``LocalGroup.shared_tensor``); a plain one
        elsewhere. A collective: every rank calls it in the same order with the same size."""
        self._after_the_buckets()
        began = time.time() if timeline.RECORDER.on else 0.0
        with self.waiting():
            self._enter("host_tensor")  # its barriers must not interleave with a collective on another thread
            try:
                op_id = self.next_op()  # drawn with shared memory or without, so numbers agree across hosts
                signature = Signature(op_id, "shared_tensor", numel, dtype, caller=self.caller)
                self.history.add(op_id, signature, call_site())
                if self.shared_memory and self.local is not None and numel > 0:
                    self.local.announce(signature)
                    tensor = self.local.shared_tensor(numel, dtype)
                else:
                    tensor = torch.zeros(numel, dtype=dtype, device="cpu")
            finally:
                crossed = self._leave()
            if crossed is not None:
                raise self._crossing(crossed, "host_tensor", op_id)
        if began:  # on the timeline: DataParallel's buckets are allocated so, at its start and at each new layout
            timeline.RECORDER.span("host_tensor", began, time.time(),
                                   {"op": op_id, "bytes": numel * dtype.itemsize, "by": self.caller})
        return tensor

    def barrier(self) -> None:
        self.all_reduce(torch.zeros(1, dtype=torch.int32, device="cpu"), "sum", name="barrier")

    def close(self) -> None:
        self._on_ring.close()

    # -- with shared memory: this host's ranks, and across hosts their leaders' ring --------
    def _reduce_hierarchical(self, op_id: int, flat: torch.Tensor, work: torch.Tensor, raw: memoryview,
                             op: str, meta: dict, wire: torch.dtype | None) -> bool:
        """Reduce inside the host through shared memory, across hosts on the leaders' ring, then
        hand the result back inside the host. On one host only the first step runs, and an
        average is divided there too, in the same pass; returns whether it was."""
        reducer = REDUCERS[op]
        divide_by = self.world if op == "avg" and self.local is not None and self.local.size == self.world else 1
        if self.local is not None:  # from the tensor (any device) into the slot
            self.local.all_reduce(flat, work, "sum" if op == "avg" else op, divide_by)
        else:
            work.copy_(flat)
        steps = [] if self.local is None else [", ".join(filter(None, ["shared memory", self.local.path]))]
        if self.leaders is not None:
            self._on_ring.all_reduce(self.leaders, op_id, work, raw, reducer, meta, wire)
            steps.append("hosts " + self._on_ring.last_algorithm)
        if self.local is not None and self.local.size < self.world:
            self.local.broadcast(work)
        self.last_algorithm = " + ".join(steps)
        return divide_by != 1

    def _broadcast_hierarchical(self, op_id: int, work: torch.Tensor, raw: memoryview, src: int,
                                meta: dict) -> None:
        """From ``src`` to its host's ranks through shared memory, from that host's leader to the
        other leaders on their ring, and from each of those to its host's ranks. A host's ranks
        are consecutive and its leader is the first, so the ranks tell hosts apart."""
        local = self.local
        first, size = (local.base, local.size) if local is not None else (self.rank, 1)
        here = first <= src < first + size
        if here and local is not None:
            local.broadcast(work, src - first)
        if self.leaders is not None:
            root = max(m for m in self.leaders.members if m <= src)  # the leader of src's host
            self._on_ring.broadcast(self.leaders, op_id, work, raw, self.leaders.members.index(root), meta)
        if not here and local is not None:
            local.broadcast(work)

    def _gather_hierarchical(self, op_id: int, blocks: torch.Tensor, raw: memoryview, meta: dict) -> None:
        """Gather this host's blocks through shared memory, pass each host's run of blocks round
        the leaders' ring, then hand the whole result to the host's other ranks. A host's ranks
        are consecutive and its leader is the first, so leader ``j``'s run reaches from its own
        rank to the next leader's: runs differ in length where hosts differ in size."""
        local, per = self.local, blocks.shape[1]
        if local is not None:
            local.all_gather(blocks[self.rank], blocks[local.base: local.base + local.size])
        if self.leaders is not None:
            bounds = [*self.leaders.members, self.world]
            spans = [(a * per, b * per) for a, b in zip(bounds, bounds[1:])]
            self._on_ring.all_gather(self.leaders, op_id, blocks.view(-1), raw, spans, meta)
        if local is not None and local.size < self.world:
            local.broadcast(blocks.view(-1))

    # -- helpers ----------------------------------------------------------------------------
    @contextmanager
    def on_behalf_of(self, caller: str) -> Iterator[None]:
        """Collectives this thread issues inside the block come from ``caller`` (one of
        ``Signature.CALLERS``), which errors about ranks in different collectives then name:
        "rank 0 is in all_gather of 1 int64, from checkpoint.save" says more than the call."""
        if caller not in Signature.CALLERS:
            raise ValueError(f"unknown caller {caller!r}")
        previous = self.caller
        self._thread.name = caller
        try:
            yield
        finally:
            self._thread.name = previous

    @property
    def caller(self) -> str:
        return getattr(self._thread, "name", "")

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """Count the time this thread spends in the block as time the script waited for the
        other ranks and the network (``waited_s``; the launcher's end-of-job line compares the
        ranks' shares, and the rank that waits least is the one the others wait for). Nested
        blocks count once. A thread ``in_background`` never counts: DataParallel's communication
        thread exchanges while backward computes, and only the end of backward's wait for it is
        time lost."""
        started = self.start_waiting()
        try:
            yield
        finally:
            self.stop_waiting(started)

    def start_waiting(self) -> float | None:
        """When this thread starts to wait (None: it already waits, or does not count): the
        block ``waiting`` without its generator, for the code that runs every step."""
        state = self._thread
        if getattr(state, "counting", False) or getattr(state, "background", False):
            return None
        state.counting = True
        return time.monotonic()

    def stop_waiting(self, started: float | None) -> None:
        if started is not None:
            self._thread.counting = False
            self.waited_s += time.monotonic() - started

    @contextmanager
    def standing_by(self) -> Iterator[None]:
        """Time in the block is neither work nor waiting for slower ranks: a rank out of batches
        inside ``DataParallel.join()`` stands by while the others train on. The launcher's pace
        line leaves it out, or it would name the ranks with more batches as the slow ones."""
        started = time.monotonic()
        self.history.note = protocol.STOOD_BY  # left in place if the block raises: the error report shows it
        try:
            with self.in_background():
                yield
            self.history.note = ""
        finally:
            self.stood_by_s += time.monotonic() - started

    @contextmanager
    def in_background(self) -> Iterator[None]:
        """This thread's collectives overlap the script's work: ``waiting`` does not count them."""
        self._thread.background = True
        try:
            yield
        finally:
            self._thread.background = False

    @contextmanager
    def _collective(self, kind: str, nbytes: int, tensor: torch.Tensor, reduce_op: str = "",
                    root: int = -1, name: str = "", by: str | None = None) -> Iterator[int]:
        """One collective at a time, in issue order; what we are in is visible to the heartbeat
        (the coordinator's stall report names who waits on whom) and to this host's other ranks
        (``LocalGroup.announce``: ranks in different collectives fail instead of mixing bytes).
        A small one (``nbytes``) does its arithmetic on this thread alone. With the timeline on,
        it is an event there, ``name`` (the tensor's) in its title."""
        if self.broken is not None:
            self.broken["went_on"] = True  # the launcher stops the ranks that wait in it (its next beat)
            raise ProtocolError(
                f"this rank left {self.broken['what']} by an exception ({self.broken['error']}), and a "
                f"collective left halfway cannot be finished: the other ranks wait in it, and no later "
                f"collective would line up with theirs. Let that exception end the script")
        self._after_the_buckets()
        self._enter(kind)
        since = self.start_waiting()  # inline, not self.waiting(): a generator costs 1-2 us a collective
        began = time.time() if timeline.RECORDER.on else 0.0
        op_id = 0
        try:
            with hostops.threads_for(nbytes, self.inline_bytes):
                op_id = self.next_op()
                caller = self._by = self.caller if by is None else by
                signature = Signature(op_id, kind, tensor.numel(), tensor.dtype, reduce_op, caller, root)
                site = call_site()
                self.history.add(op_id, signature, site)
                if self.local is not None:
                    self.local.announce(signature)
                self.current = (f"{kind} from {caller}" if caller else kind, op_id, time.monotonic(), site, root)
                try:
                    yield op_id
                except BaseException as exc:
                    self.history.failed_in = op_id
                    if not isinstance(exc, (JobAborted, PeerLost)):  # those end the job anyway
                        self.broken = {"op": op_id, "what": f"{kind} (op {op_id})", "went_on": False,
                                       "error": error_line(exc)}
                    raise
                finally:
                    self.current = None
                    self.ops_done += 1
        finally:
            crossed = self._leave()
            self.stop_waiting(since)
            if began:
                args: dict[str, object] = {"op": op_id, "bytes": nbytes, "by": self._by,
                                           "path": self.last_algorithm if kind == "all_reduce" else ""}
                timeline.RECORDER.span(f"{kind} {name}" if name else kind, began, time.time(),
                                       {k: v for k, v in args.items() if v != ""})
        if crossed is not None:  # it ended, but another thread's may have taken its place on other ranks
            raise self._crossing(crossed, kind, op_id)

    def _after_the_buckets(self) -> None:
        """A collective of the script's comes after DataParallel's that precede it: join()'s
        round handed to its thread (``ahead``), and the buckets released so far (``drain``)."""
        if getattr(self._thread, "background", False):  # DataParallel's own thread
            return
        if self.ahead is not None:
            self.ahead()
        if self.drain is not None:
            self.drain()

    def _enter(self, kind: str) -> None:
        """This thread's collective starts; unless another thread's is under way. Ranks pair
        collectives by the order in which they make them, and two threads at once make them in
        an order that can differ between ranks. Two that look alike (an all_reduce of the same
        shape, from the same line) are then paired with each other across ranks, and each
        returns a mix of the two threads' numbers: no header can tell. So that is an error for
        both threads: this one now, the other as its collective ends. One nested in this
        thread's own (a signal handler's, while the thread waited in a collective) waited for
        good on a lock; it is an error too, and the one it interrupted goes on."""
        me = threading.current_thread()
        with self._entry:
            if self._leaving:
                raise ConfigError(LEFT)
            other = self._inside
            if other is None:
                self._inside = me
                return
            current = self.current
            theirs = f"{current[0]} (op {current[1]}{_at(current[3])})" if current is not None else "a collective"
            ours = f"{kind} from {self.caller}" if self.caller else kind
            if other is me:  # nested in it, and refused before it touched anything: that one goes on
                raise ConfigError(
                    f"rank {self.rank} started {ours}{_at(call_site())} inside {theirs}, on the same thread: a "
                    f"signal handler (or a hook) made a collective while one was under way. Collectives cannot "
                    f"nest: have the handler set a flag, and make the collective (a checkpoint.save, say) from "
                    f"the training loop")
            self._crossed = (
                f"two threads of rank {self.rank} made collectives at once: thread '{other.name}' was in {theirs} "
                f"when thread '{me.name}' started {ours}{_at(call_site())}. Ranks pair collectives by the order in "
                f"which they make them, and threads at once may make them in another order on each rank: make "
                f"them from one thread, or from one thread at a time in an order every rank keeps")
            raise ConfigError(self._crossed)

    def _crossing(self, crossed: str, kind: str, op_id: int) -> ConfigError:
        """The error for the thread whose collective another thread crossed: it ended, but on
        other ranks the other thread's may have been paired with it. No collective can follow."""
        self.broken = {"op": op_id, "what": f"{kind} (op {op_id})", "went_on": False,
                       "error": f"ConfigError: {crossed}"}
        return ConfigError(f"{crossed}; this thread's {kind} (op {op_id}) may hold the other thread's numbers")

    def _leave(self) -> str | None:
        """This thread's collective has ended: what another thread that tried to start one
        meanwhile was told (this one's result cannot be trusted either), or None."""
        with self._entry:
            self._inside = None
            crossed, self._crossed = self._crossed, None
            self._entry.notify_all()
        return crossed

    def refuse_new(self) -> None:
        """The rank is leaving the job (``runtime.shutdown``, at the script's end): no collective
        starts from now on, and one that another thread has under way (a daemon thread's, or
        DataParallel's after the script raised in backward) ends first: its sockets and shared
        memory are about to be closed, and freed under it the thread crashed the process
        (SIGSEGV). It ends as any collective does: done, or by an error (a peer that has left,
        an abort, its deadline)."""
        me = threading.current_thread()
        with self._entry:
            self._leaving = True
            self._entry.wait_for(lambda: self._inside is None or self._inside is me)

    def status(self) -> dict:
        """For the heartbeat: collectives done, the one in progress, and how long since data last
        reached this rank (``quiet_s``)."""
        current = self.current
        status: dict = {"progress": self.ops_done, "quiet_s": time.monotonic() - self.liveness.moved_at}
        if current is not None:
            status["waiting"] = {"op": current[0], "id": current[1], "for_s": time.monotonic() - current[2],
                                 "at": where(*current[3])}
            if current[4] >= 0:  # ranks that wait in one broadcast, each for another source, wait for ever
                status["waiting"]["root"] = current[4]
        if self.broken is not None:
            status["broken"] = dict(self.broken)
        if self.ended is not None:
            status["ended"] = self.ended
        return status

    @property
    def ring(self) -> Ring:
        """The ring of all ranks, which exists where shared memory does not carry the collectives."""
        if self._ring is None:
            raise RuntimeError("no ring of all ranks: with shared memory on, collectives go through "
                               "LocalGroup and the leaders' ring")
        return self._ring

    @property
    def rings(self) -> list[Ring]:
        """This rank's rings: of all ranks, or of the hosts' leaders, or none (one host's ranks
        sharing memory)."""
        return [r for r in (self._ring, self.leaders) if r is not None]

    @property
    def last_op(self) -> int:
        """The number of the last collective this rank entered (0 before the first)."""
        return self._op

    def next_op(self) -> int:
        """A new op id; every rank must draw them in the same order."""
        self._op += 1
        return self._op


def _at(site: tuple[str, int]) -> str:
    """The words ' at train.py:14' for a call site; none where no line of a script called (the
    collectives of DataParallel's own thread)."""
    place = where(*site)
    return f" at {place}" if place else ""


def error_line(exc: BaseException) -> str:
    """``Type: message`` of an exception, cut to fit a heartbeat: for the launcher's report."""
    return f"{type(exc).__name__}: {exc}"[:300]


def digest(value: object) -> int:
    """A signed 64-bit digest of ``value``'s repr: the same on every rank for equal values."""
    return int.from_bytes(hashlib.blake2b(repr(value).encode(), digest_size=8).digest(), "little", signed=True)


def host_memory(tensor: torch.Tensor) -> memoryview:
    """A writable byte view of a contiguous CPU tensor's memory, for sends straight from it.
    It does not keep the tensor alive: the caller holds it until the collective returns
    (zero-copy sends are settled before that)."""
    nbytes = tensor.numel() * tensor.element_size()
    return memoryview((ctypes.c_char * nbytes).from_address(tensor.data_ptr())).cast("B")


def _outside_autograd(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's data without its autograd history, to read and write in place. Collectives
    stay out of autograd, as torch.distributed's do: a parameter is reduced or broadcast in
    place, as by ``dist.broadcast(p, 0)``, rather than refused as a leaf that requires grad.
    A detached view, not ``torch.no_grad()``: grad mode is per thread, and a large tensor's ring
    runs parts of it on pool threads (found by the hypothesis cases).

    An inference tensor (made under ``torch.inference_mode()``, as evaluation metrics are) takes
    in-place writes only inside that mode, which is per thread too: outside it, and on the pool
    threads even inside it, torch refused them from within the collective. The collective writes
    through a plain tensor over the same memory instead, as torch.distributed's kernels write
    beneath that check (an inference tensor is never saved for backward, so no version counter
    is bypassed)."""
    if tensor.is_inference():
        with torch.inference_mode(False):  # else the alias would be an inference tensor itself
            alias = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
            return alias.set_(tensor.untyped_storage(), tensor.storage_offset(), tensor.shape, tensor.stride())
    return tensor.detach() if tensor.requires_grad else tensor


