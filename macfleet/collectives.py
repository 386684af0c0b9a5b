"""Collectives over the ring: all_reduce, broadcast, all_gather, barrier.

A contiguous host tensor in its working dtype is reduced in its own memory; anything else goes
through reusable host buffers (a device tensor's memory is not host memory, and half precision is
reduced in float32 on the host). Ranks of one host reduce and broadcast through shared memory
(``macfleet.shm``) and, across hosts, on a ring of the hosts' first ranks; they gather the
same way. The all-reduce is the classic ring:
reduce-scatter then all-gather over N segments, each segment cut into chunks so that the
reduction of one chunk overlaps the transfer of the next, and large tensors are split into
parts that run concurrently on separate channels (both ring directions, and ``streams``
socket pairs per direction). Small tensors take a latency path: every rank passes its whole
tensor round the ring, half the ranks' one way and half the other (about N/2 steps instead of
2(N-1)), and reduces locally in rank order.

Results are identical on every rank: each element is reduced once, by one rank, in a fixed
order, then copied to the others.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Callable, Iterator

import torch

from macfleet import hostops, protocol
from macfleet.arguments import (WIRE_DTYPES, as_numbers, check_all_gather, check_all_reduce, check_broadcast,
                                made_of_numbers)
from macfleet.errors import ConfigError, JobAborted, PeerLost, ProtocolError
from macfleet.history import History, call_site, where
from macfleet.shm import LocalGroup, Signature, split_evenly
from macfleet.transport import Channel, Liveness, Ring

LEFT = ("this rank left the job with macfleet.shutdown(): a collective, DataParallel or macfleet.init() after it "
        "cannot run; call macfleet.shutdown() last")
# Half precision is reduced in float32 on the host (DESIGN.md section 4).
WORK_DTYPE = {torch.float16: torch.float32, torch.bfloat16: torch.float32}

# Up to these sizes the one-pass latency path beats the ring (benchmarks/results, device machine
# over loopback: at 8 ranks 256 KiB took 1.8-1.9 ms one-pass against 2.8-3.0 ms on the ring,
# 1 MiB 4.7-5.4 ms against 3.6-3.8). Between two members the one pass moves the same bytes as
# the ring in one step (``_reduce_pair``): 2 MiB took 1.23-1.25 ms against 1.89-2.01 on the ring,
# 4 MiB 2.12 against 2.13-2.25, 8 MiB 2.8-3.1 against 3.0-3.1 (session 13).
SMALL_BYTES = 256 << 10
TWO_MEMBER_ONE_PASS_BYTES = 4 << 20
# The ring sends pieces this large straight from the tensor's memory: it saves a memcpy of every
# byte sent, and costs one settle word per channel at the end of the collective.
ZERO_COPY_BYTES = 1 << 20
# A broadcast passes a piece on while the next comes in, so the last member has it after about
# (pieces + hops - 1) piece times instead of hops whole-tensor times. Measured on the device
# machine over loopback (session 30), 4 MiB at 8 ranks: 25-26 ms in one 4 MiB piece, 5.2 ms in
# 256 KiB pieces, 6.5 ms in 128 KiB, 9.0 ms in 64 KiB (each piece costs a message); 16 MiB at 4
# ranks: 14.8-15.0 ms in 4 MiB pieces, 10.4 ms in 1 MiB, 12.5 ms in 256 KiB.
BROADCAST_PIECES = 16
MIN_BROADCAST_PIECE_BYTES = 256 << 10
Reducer = Callable[[torch.Tensor, torch.Tensor], object]
REDUCERS: dict[str, Reducer] = {
    "sum": lambda acc, x: acc.add_(x),
    "avg": lambda acc, x: acc.add_(x),
    "max": lambda acc, x: torch.maximum(acc, x, out=acc),
    "min": lambda acc, x: torch.minimum(acc, x, out=acc),
}


class HostBuffers:
    """Named host buffers that grow and are reused, so the steady state allocates nothing big."""

    def __init__(self) -> None:
        self._raw: dict[str, bytearray] = {}

    def get(self, name: str, numel: int, dtype: torch.dtype) -> tuple[torch.Tensor, memoryview]:
        nbytes = numel * dtype.itemsize
        raw = self._raw.get(name)
        if raw is None or len(raw) < nbytes:
            raw = self._raw[name] = bytearray(max(nbytes, 64))
        view = memoryview(raw)[:nbytes]
        tensor = torch.frombuffer(raw, dtype=dtype, count=numel) if numel else torch.empty(0, dtype=dtype)
        return tensor, view


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
        alone (``macfleet.hostops``). ``zero_copy_bytes``: the ring sends pieces at least this
        large without copying them (``Ring.settle``)."""
        self._ring = ring
        self.local, self.leaders, self.shared_memory = local, leaders, shared_memory
        self.liveness = liveness
        self.all_streams = all_streams  # else only two-member rings use streams beyond the first
        self.rank, self.world = rank, world
        self.chunk_bytes = chunk_bytes
        self.small_bytes = small_bytes
        self.min_part_bytes = min_part_bytes
        self.inline_bytes = inline_bytes
        self.zero_copy_bytes = zero_copy_bytes
        self.ops_done = 0  # progress counter, read by the heartbeat
        self.started = time.monotonic()
        self.waited_s = 0.0  # time the script's threads spent blocked in macfleet (``waiting``)
        self.stood_by_s = 0.0  # time neither worked nor waited for a slower rank (``standing_by``)
        # Waits for a collective handed to a background thread that has not run yet (the round of
        # DataParallel.join, which forward does not wait for): any other thread's collective must
        # come after it, or ranks would number the two differently.
        self.ahead: Callable[[], None] | None = None
        # Waits until DataParallel's thread has averaged every gradient bucket released so far
        # (``_CommThread.drain``): a collective of the script's, made inside backward, comes after
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
        extra = len(self.rings[0].channels) - 1 if self.rings else 0
        self._pool = ThreadPoolExecutor(extra, thread_name_prefix="macfleet-ring") if extra else None
        self._host = HostBuffers()

    # -- public collectives -----------------------------------------------------------------
    def all_reduce(self, tensor: torch.Tensor, op: str = "sum", name: str = "tensor",
                   compression: str = "none") -> torch.Tensor:
        """``compression`` (``fp16``, ``bf16``) casts what crosses the network only; the
        reduction itself stays float32 on the host."""
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
        with self._collective("all_reduce", numel * work_dtype.itemsize, tensor, op) as op_id:
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
            meta = {"c": "all_reduce", "numel": numel, "dtype": str(tensor.dtype), "rop": op, "wire": str(wire),
                    "by": self._by}
            reducer = REDUCERS[op]
            # Through shared memory whatever the size: its barrier costs microseconds, so even a
            # 4 KiB all-reduce is faster there than one pass round the ring (benchmarks/).
            averaged = False
            if self.shared_memory:
                averaged = self._reduce_hierarchical(op_id, data.reshape(-1), work, raw, op, meta, wire)
            else:
                if not in_place:
                    work.copy_(data.reshape(-1))  # blocking device->host copy (and upcast), see mps-facts.md
                self._reduce_on(self.ring, op_id, work, raw, reducer, meta, wire)
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
            counts = self.all_gather(torch.tensor([count]), name).view(-1).tolist()
            most = max(counts)
            indices = torch.zeros(mine.sparse_dim(), most, dtype=torch.int64)
            indices[:, :count] = mine.indices()
            values = torch.zeros((most, *mine.values().shape[1:]), dtype=mine.dtype)
            values[:count] = mine.values()
            indices, values = self.all_gather(indices, name), self.all_gather(values, name)
        whole = torch.sparse_coo_tensor(torch.cat([indices[r, :, :n] for r, n in enumerate(counts)], 1),
                                        torch.cat([values[r, :n] for r, n in enumerate(counts)]), tensor.shape)
        whole = whole.coalesce()
        if op == "avg":
            whole = whole / self.world
        # a leaf that requires grad takes it under no_grad (entered last: inference_mode(False) enables grad)
        with torch.inference_mode(tensor.is_inference()), torch.no_grad():
            tensor.copy_(whole.to(tensor.device))
        return tensor

    def broadcast(self, tensor: torch.Tensor, src: int = 0, name: str = "tensor") -> torch.Tensor:
        check_broadcast(tensor, src, self.world, name)
        if made_of_numbers(tensor):
            self.broadcast(as_numbers(tensor, name)[0], src, name)
            return tensor
        data = _outside_autograd(tensor)
        with self._collective("broadcast", tensor.numel() * tensor.element_size(), tensor, root=src) as op_id:
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
                self._broadcast_on(self.ring, op_id, work, raw, src, meta)  # on the ring of all, position == rank
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
        with self._collective("all_gather", self.world * tensor.numel() * tensor.element_size(), tensor) as op_id:
            if tensor.numel() == 0:
                return out
            blocks, raw = self._host.get("gather", self.world * tensor.numel(), tensor.dtype)
            blocks = blocks.view(self.world, -1)
            blocks[self.rank].copy_(_outside_autograd(tensor).reshape(-1))
            meta = {"c": "all_gather", "numel": tensor.numel(), "dtype": str(tensor.dtype), "by": self._by}
            if self.shared_memory:
                self._gather_hierarchical(op_id, blocks, raw, meta)
            else:
                self._gather_ring(self.ring, op_id, blocks.view(-1), raw, _even_spans(self.world, blocks.shape[1]),
                                  meta)
            out.copy_(blocks.view(out.shape))
        return out

    def host_tensor(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A zeroed flat host tensor that ``all_reduce`` reduces without copying it in or out
        where this host's ranks share memory (``LocalGroup.shared_tensor``); a plain one
        elsewhere. A collective: every rank calls it in the same order with the same size."""
        self._after_the_buckets()
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
                    tensor = torch.zeros(numel, dtype=dtype)
            finally:
                crossed = self._leave()
            if crossed is not None:
                raise self._crossing(crossed, "host_tensor", op_id)
        return tensor

    def barrier(self) -> None:
        self.all_reduce(torch.zeros(1, dtype=torch.int32), "sum", name="barrier")

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    # -- algorithms -------------------------------------------------------------------------
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
            self._reduce_on(self.leaders, op_id, work, raw, reducer, meta, wire)
            steps.append("hosts " + self.last_algorithm)
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
            self._broadcast_on(self.leaders, op_id, work, raw, self.leaders.members.index(root), meta)
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
            self._gather_ring(self.leaders, op_id, blocks.view(-1), raw, spans, meta)
        if local is not None and local.size < self.world:
            local.broadcast(blocks.view(-1))

    def _broadcast_on(self, ring: Ring, op_id: int, work: torch.Tensor, raw: memoryview, root: int,
                      meta: dict) -> None:
        """The member at clockwise position ``root``'s ``work`` to every member, in pieces, each
        member passing a piece on while the next comes in.

        A tensor of one piece (up to ``MIN_BROADCAST_PIECE_BYTES``) goes both ways round a ring
        of three or more, as the small all-reduce's blocks do: the farthest member has it after
        about n / 2 hops instead of n - 1, and a small broadcast's time is its hops. A larger one
        goes clockwise only, so the root sends every byte once: its time is its pieces, and a
        second direction would put them twice on the root's link."""
        n, size = ring.world, work.element_size()
        nbytes = work.numel() * size
        piece_bytes = min(self.chunk_bytes, max(MIN_BROADCAST_PIECE_BYTES, nbytes // BROADCAST_PIECES))
        pieces = [raw[a * size: b * size] for a, b in _chunks(0, work.numel(), max(1, piece_bytes // size))]
        cw, ccw = ring.channels[0], ring.channels[1]
        both = n >= 3 and nbytes <= MIN_BROADCAST_PIECE_BYTES
        reach = (n // 2, (n - 1) // 2) if both else (n - 1, 0)  # how many members each direction serves
        ahead = (cw.position - root) % n  # this member's hops clockwise from the root
        if ahead == 0:
            for ch, count in zip((cw, ccw), reach):
                if count:
                    ch.begin(op_id)
                    for piece in pieces:
                        ch.send(piece, meta)
            if n > 1:
                cw.expect_answer(meta)
            return
        ch, hops, count = (cw, ahead, reach[0]) if ahead <= reach[0] else (ccw, n - ahead, reach[1])
        ch.begin(op_id)
        for piece in pieces:
            ch.recv_header(len(piece), meta)
            ch.recv_into(piece)
            if hops < count:  # the last member of each direction does not pass it on
                ch.send(piece, meta)
        if ahead == n - 1:  # the member before the root answers it (Channel.expect_answer), clockwise
            if ch is not cw:
                cw.begin(op_id)
            cw.owe_answer(meta)  # it names the source this rank took

    def _reduce_on(self, ring: Ring, op_id: int, work: torch.Tensor, raw: memoryview, reducer: Reducer,
                   meta: dict, wire: torch.dtype | None = None) -> None:
        # Between two members the one-pass path moves the same bytes as the ring in half the
        # steps; measured faster up to about 4 MiB (benchmarks/, 2 ranks).
        one_pass = max(self.small_bytes, TWO_MEMBER_ONE_PASS_BYTES) if ring.world == 2 else self.small_bytes
        if work.numel() * work.element_size() <= one_pass:
            self.last_algorithm = "latency (one pass)"
            if ring.world == 2 and wire is None:
                self._reduce_pair(ring, op_id, work, raw, reducer, meta)
            else:
                self._reduce_small(ring, op_id, work, reducer, meta, wire)
        else:
            self._reduce_ring(ring, op_id, work, raw, reducer, meta, wire)

    def _reduce_small(self, ring: Ring, op_id: int, work: torch.Tensor, reducer: Reducer, meta: dict,
                      wire: torch.dtype | None) -> None:
        numel, n = work.numel(), ring.world
        blocks, raw = self._host.get("small", n * numel, wire or work.dtype)  # blocks travel in the wire dtype
        blocks = blocks.view(n, numel)
        blocks[ring.channels[0].position].copy_(work)
        self._gather_ring(ring, op_id, blocks.view(-1), raw, _even_spans(n, numel), meta)
        work.copy_(blocks[0])
        for k in range(1, n):  # ring order, so every rank computes the same bits
            reducer(work, blocks[k])

    def _reduce_pair(self, ring: Ring, op_id: int, work: torch.Tensor, raw: memoryview, reducer: Reducer,
                     meta: dict) -> None:
        """The one pass between two members: each sends its tensor as it is and reduces the
        other's straight into it. a + b is b + a to the bit (so are max and min), so both get
        the same result without the ring-ordered blocks of ``_reduce_small``, and two copies of
        the tensor fewer: a member's whole exchange when two Macs train a small model."""
        other, other_raw = self._host.get("pair", work.numel(), work.dtype)
        ch, size = ring.channels[0], work.element_size()
        ch.begin(op_id)
        pieces = [(a * size, b * size) for a, b in _chunks(0, work.numel(), self._chunk_elems(work))]
        for a, b in pieces:
            ch.send(raw[a:b], meta)  # copied into the message: the reduction below may overwrite it
        for a, b in pieces:
            ch.recv_header(b - a, meta)
            ch.recv_into(other_raw[a:b])
        reducer(work, other)

    def _gather_ring(self, ring: Ring, op_id: int, flat: torch.Tensor, raw: memoryview,
                     spans: list[tuple[int, int]], meta: dict) -> None:
        """Pass every member's block round the ring until all members have all blocks: block k,
        elements ``spans[k]`` of ``flat`` (``raw`` its bytes), belongs to the member at
        clockwise ring position k (on the ring of all ranks, rank k).

        Both directions at once: the blocks of the n // 2 members behind come clockwise, those
        of the (n - 1) // 2 ahead counter-clockwise, so the last block arrives after about n / 2
        hops instead of n - 1 (a hop costs about 100 us over loopback sockets: benchmarks/results)."""
        n, size = ring.world, flat.element_size()
        cw, ccw = ring.channels[0], ring.channels[1]
        me = cw.position
        hops = [(cw, n // 2, -1), (ccw, (n - 1) // 2, +1)]  # (channel, blocks it brings, direction they come from)
        step = self._chunk_elems(flat)
        for ch, count, _ in hops:
            if count:
                ch.begin(op_id)
                for a, b in _chunks(*spans[me], step):
                    ch.send(raw[a * size: b * size], meta)
        for s in range(n // 2):
            for ch, count, sign in hops:
                if s >= count:
                    continue
                k = (me + sign * (s + 1)) % n
                for a, b in _chunks(*spans[k], step):
                    piece = raw[a * size: b * size]
                    ch.recv_header(len(piece), meta)
                    ch.recv_into(piece)
                    if s < count - 1:
                        ch.send(piece, meta)

    def _reduce_ring(self, ring: Ring, op_id: int, work: torch.Tensor, raw: memoryview, reducer: Reducer,
                     meta: dict, wire: torch.dtype | None) -> None:
        numel, size = work.numel(), work.element_size()
        packed, packed_raw = (work, raw) if wire is None else self._host.get("wire", numel, wire)
        wsize = packed.element_size()
        # Measured (benchmarks/, 16 cores): extra streams help two-member rings and hurt larger
        # ones. The choice depends only on the ring's size, which every member sees the same.
        usable = len(ring.channels) if self.all_streams or ring.world == 2 else 2
        parts = max(1, min(usable, numel * size // (ring.world * self.min_part_bytes)))
        bounds = split_evenly(numel, parts)
        self.last_algorithm = f"ring x{parts}"
        # The ring computes on one chunk of one segment at a time, never on the whole tensor: a
        # 1 MiB all-reduce of 4 ranks adds 256 KiB pieces. Their size, not the tensor's, decides
        # whether waking an OpenMP team pays (measured, 1 MiB at 4 ranks over TCP: 2.0 ms on
        # the team, 1.6-1.8 ms inline; benchmarks/results/2026-11-22-session6).
        piece = min(self._chunk_elems(work), -(-(bounds[0][1] - bounds[0][0]) // ring.world)) * size
        copy = piece * wsize // size < self.zero_copy_bytes  # the same on every member: it follows from the size
        jobs = []
        for p in range(1, parts):
            a, b = bounds[p]
            jobs.append(self._pool.submit(  # type: ignore[union-attr]
                self._reduce_part_threaded, piece, ring.channels[p], ring.world, op_id, work[a:b], packed[a:b],
                packed_raw[a * wsize: b * wsize], reducer, meta, copy))
        a, b = bounds[0]
        try:
            with hostops.threads_for(piece, self.inline_bytes):
                self._reduce_part(ring.channels[0], ring.world, op_id, work[a:b], packed[a:b],
                                  packed_raw[a * wsize: b * wsize], reducer, meta, copy)
        finally:
            for job in jobs:
                job.result()
        if not copy:
            ring.settle(op_id, ring.channels[:parts])

    def _reduce_part_threaded(self, piece_bytes: int, *args: object) -> None:
        """``_reduce_part`` on a pool thread, on one thread alone if its pieces are small."""
        with hostops.threads_for(piece_bytes, self.inline_bytes):
            self._reduce_part(*args)  # type: ignore[arg-type]

    def _reduce_part(self, ch: Channel, n: int, op_id: int, x: torch.Tensor, packed: torch.Tensor, raw: memoryview,
                     reducer: Reducer, meta: dict, copy: bool = True) -> None:
        """Reduce-scatter then all-gather of ``x`` on one channel of an ``n``-member ring, chunk by chunk.

        ``packed``/``raw`` is what goes on the wire: ``x`` itself, or a same-length buffer in the
        compressed dtype (then each chunk is cast just before it is sent, and back as it arrives).

        ``copy=False`` sends straight from ``raw``. Within the op that is safe without waiting
        for anything: a region we sent is written again only when its final sum arrives, and
        that sum includes what we sent, so the next member had received it. After the op the
        caller settles (``Ring.settle``).
        """
        i, size = ch.position, packed.element_size()
        cast = packed.dtype != x.dtype  # compressed: packed is the wire dtype (else x itself)
        segments = split_evenly(x.numel(), n)
        step = self._chunk_elems(x)
        ch.begin(op_id)

        def chunks(k: int) -> list[tuple[int, int]]:
            return _chunks(*segments[k % n], step)

        def send(a: int, b: int) -> None:
            if cast:
                packed[a:b].copy_(x[a:b])
            ch.send(raw[a * size: b * size], meta, copy)

        for a, b in chunks(i):
            send(a, b)
        # Reduce-scatter: add what the previous rank sends into our copy, pass the sum on. The
        # last step's sums are final, so passing them on is already the first all-gather step.
        for s in range(n - 1):
            for a, b in chunks(i - s - 1):
                ch.recv_header((b - a) * size, meta)
                frame = ch.recv_frame()
                reducer(x[a:b], torch.frombuffer(frame.buffer, dtype=packed.dtype))  # in x's dtype (float32)
                send(a, b)
                if cast and s == n - 2:  # our final segment: keep it as the others get it, rounded
                    x[a:b].copy_(packed[a:b])
        # All-gather: pass each final segment on as it arrived, then copy it into place (casting
        # back if compressed). The message passed on is the one received, shared, not copied,
        # so the next member gets it without waiting for our copy, and it never reads our memory.
        for s in range(n - 1):
            for a, b in chunks(i - s):
                ch.recv_header((b - a) * size, meta)
                frame = ch.recv_frame()
                if s < n - 2:
                    ch.send(frame, meta)
                x[a:b].copy_(torch.frombuffer(frame.buffer, dtype=packed.dtype))  # we sent it in RS: see above

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
        started = self._start_waiting()
        try:
            yield
        finally:
            self._stop_waiting(started)

    def _start_waiting(self) -> float | None:
        """When this thread starts to wait (None: it already waits, or does not count)."""
        state = self._thread
        if getattr(state, "counting", False) or getattr(state, "background", False):
            return None
        state.counting = True
        return time.monotonic()

    def _stop_waiting(self, started: float | None) -> None:
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
                    root: int = -1) -> Iterator[int]:
        """One collective at a time, in issue order; what we are in is visible to the heartbeat
        (the coordinator's stall report names who waits on whom) and to this host's other ranks
        (``LocalGroup.announce``: ranks in different collectives fail instead of mixing bytes).
        A small one (``nbytes``) does its arithmetic on this thread alone."""
        if self.broken is not None:
            self.broken["went_on"] = True  # the launcher stops the ranks that wait in it (its next beat)
            raise ProtocolError(
                f"this rank left {self.broken['what']} by an exception ({self.broken['error']}), and a "
                f"collective left halfway cannot be finished: the other ranks wait in it, and no later "
                f"collective would line up with theirs. Let that exception end the script")
        self._after_the_buckets()
        self._enter(kind)
        since = self._start_waiting()  # inline, not self.waiting(): a generator costs 1-2 us a collective
        try:
            with hostops.threads_for(nbytes, self.inline_bytes):
                op_id = self.next_op()
                caller = self._by = self.caller
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
            self._stop_waiting(since)
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

    def _chunk_elems(self, t: torch.Tensor) -> int:
        return max(1, self.chunk_bytes // t.element_size())


def _at(site: tuple[str, int]) -> str:
    """The words ' at train.py:14' for a call site; none where no line of a script called (the
    collectives of DataParallel's own thread)."""
    place = where(*site)
    return f" at {place}" if place else ""


def error_line(exc: BaseException) -> str:
    """``Type: message`` of an exception, cut to fit a heartbeat: for the launcher's report."""
    return f"{type(exc).__name__}: {exc}"[:300]


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


def _even_spans(n: int, per: int) -> list[tuple[int, int]]:
    """Element ranges of ``n`` blocks of ``per`` elements each, laid end to end."""
    return [(k * per, (k + 1) * per) for k in range(n)]


def _chunks(start: int, end: int, step: int) -> list[tuple[int, int]]:
    return [(a, min(a + step, end)) for a in range(start, end, step)]
