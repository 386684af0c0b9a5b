"""The collectives' algorithms on one ring of members over sockets (``transport.Ring``): the
ring of all ranks, or of the hosts' first ranks when the ranks of each host share memory.

The all-reduce is the classic ring: reduce-scatter then all-gather over N segments, each
segment cut into chunks so that the reduction of one chunk overlaps the transfer of the next,
and large tensors are split into parts that run concurrently on separate channels (both ring
directions, and ``streams`` socket pairs per direction). Small tensors take a latency path:
every member passes its whole tensor round the ring, half the members' one way and half the
other (about N/2 steps instead of 2(N-1)), and reduces locally in ring order; two members
exchange their tensors in one pass. Broadcasts pass pieces on as they come, all-gathers pass
blocks round both ways.

Results are identical on every member: each element is reduced once, by one member, in a
fixed order, then copied to the others (or every member reduces the same blocks in the same
order). Which collective the members are in, and in which order, is ``Collectives``' business:
these only move and add the bytes, on the host (``work``, ``raw``: a flat tensor and its bytes).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import torch

from macfleet import hostops
from macfleet.host_buffers import HostBuffers
from macfleet.shm import split_evenly
from macfleet.transport import Channel, Ring

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


class RingAlgorithms:
    """all_reduce, broadcast and all_gather on any ring of this rank's, with its tuning knobs."""

    def __init__(self, host: HostBuffers, extra_streams: int, chunk_bytes: int = 4 << 20,
                 small_bytes: int = SMALL_BYTES, min_part_bytes: int = 256 << 10,
                 inline_bytes: int = hostops.INLINE_BYTES, zero_copy_bytes: int = ZERO_COPY_BYTES,
                 all_streams: bool = True) -> None:
        """``extra_streams``: channels beyond the first of the rings (each large part beyond the
        first runs on a thread of its own). ``inline_bytes``: pieces up to this size are added
        on the calling thread alone (``macfleet.hostops``). ``zero_copy_bytes``: the ring sends
        pieces at least this large without copying them (``Ring.settle``). ``all_streams``:
        else only two-member rings use streams beyond the first."""
        self.chunk_bytes = chunk_bytes
        self.small_bytes = small_bytes
        self.min_part_bytes = min_part_bytes
        self.inline_bytes = inline_bytes
        self.zero_copy_bytes = zero_copy_bytes
        self.all_streams = all_streams
        self.last_algorithm = ""  # which path the last all_reduce took (for benchmarks)
        self._host = host
        self._pool = ThreadPoolExecutor(extra_streams, thread_name_prefix="macfleet-ring") if extra_streams else None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def broadcast(self, ring: Ring, op_id: int, work: torch.Tensor, raw: memoryview, root: int,
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

    def all_reduce(self, ring: Ring, op_id: int, work: torch.Tensor, raw: memoryview, reducer: Reducer,
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
        self.all_gather(ring, op_id, blocks.view(-1), raw, even_spans(n, numel), meta)
        work.copy_(blocks[0])
        for k in range(1, n):  # ring order, so every rank computes the same bits
            reducer(work, blocks[k])

    def _reduce_pair(self, ring: Ring, op_id: int, work: torch.Tensor, raw: memoryview, reducer: Reducer,
                     meta: dict) -> None:
        """The one pass between two members: each sends its tensor as it is and reduces the
        other's straight into it. a + b is b + a to the bit (so are max and min), so both get
        the same result without the ring-ordered blocks of ``_reduce_small``, and two copies of
        the tensor fewer: a member's whole exchange when two Macs train a small model. Each
        piece is added from the message it came in, as the ring adds: received into a buffer
        first, it was copied once more (0.12 ms a MiB on the device machine, a third of the
        exchange's time at 1 MiB)."""
        ch, size = ring.channels[0], work.element_size()
        ch.begin(op_id)
        pieces = _chunks(0, work.numel(), self._chunk_elems(work))
        for a, b in pieces:
            ch.send(raw[a * size: b * size], meta)  # copied into the message: the reduction below may overwrite it
        for a, b in pieces:
            ch.recv_header((b - a) * size, meta)
            reducer(work[a:b], torch.frombuffer(ch.recv_frame().buffer, dtype=work.dtype))

    def all_gather(self, ring: Ring, op_id: int, flat: torch.Tensor, raw: memoryview,
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

    def _chunk_elems(self, t: torch.Tensor) -> int:
        return max(1, self.chunk_bytes // t.element_size())


def even_spans(n: int, per: int) -> list[tuple[int, int]]:
    """Element ranges of ``n`` blocks of ``per`` elements each, laid end to end."""
    return [(k * per, (k + 1) * per) for k in range(n)]


def _chunks(start: int, end: int, step: int) -> list[tuple[int, int]]:
    return [(a, min(a + step, end)) for a in range(start, end, step)]
