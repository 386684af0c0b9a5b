"""Ring sockets: one channel per (direction, stream), PUSH to the next rank, PULL from the previous.

A rank binds one PULL per channel on its data address (on each, where its Mac has one per
cable) and connects one PUSH per channel to its neighbour's PULL, at the neighbour's address on
the subnet they share. Clockwise channels carry data to rank r+1, counter-clockwise ones to
rank r-1, so both directions of every link carry traffic. Every wait polls with a deadline
and checks the job's liveness, so a dead or silent peer is an error, never a hang.

Anyone can connect to a bound PULL socket. Messages are therefore signed (``macfleet.wire``)
and checked against the schedule (job, sender, op, sequence) before the payload is touched;
anything else is drained, counted in ``dropped`` and ignored.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import zmq

from macfleet import knobs, netaddr, wire
from macfleet.errors import CollectiveTimeout, JobAborted, PeerLost, ProtocolError, RendezvousError

POLL_SLICE_MS = 100  # how often a blocked wait looks at the abort flag
HEADER_SLACK = 64 * 1024
# Every rank has registered when the ring connects, so a connection that is not up in this long
# will not come up: a firewall drops it, or the address is not reachable from here.
CONNECT_TIMEOUT_S = 30.0  # MACFLEET_CONNECT_TIMEOUT
SEND_FIRST_FRAME = int(zmq.SNDMORE | zmq.NOBLOCK)  # once: or-ing pyzmq's enum flags costs a microsecond a call


def _described(fields: dict[str, Any]) -> str:
    """A collective as its messages name it: "all_reduce of 8 float32, from DataParallel"."""
    dtype = str(fields.get("dtype", "")).removeprefix("torch.")
    what = str(fields.get("c", "?"))
    if "numel" in fields:
        what = f"{what} of {fields['numel']} {dtype}".rstrip()
    if isinstance(fields.get("root"), int):
        what = f"{what} from rank {fields['root']}"
    return f"{what}, from {fields['by']}" if fields.get("by") else what


class Liveness:
    """The job's health as this process knows it; set by the control thread, read by every wait."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reason: str | None = None
        self.failed_rank: int | None = None
        # A rank of the job is stopped in a debugger (the coordinator says so): the others may
        # wait for it as long as someone steps through its code, so waits have no deadline.
        self.held = False
        # When data last reached this rank (a message of a collective, a barrier passed): the
        # heartbeat says how long ago, so a long exchange over a slow link is not taken for a stall.
        self.moved_at = time.monotonic()

    def moved(self) -> None:
        self.moved_at = time.monotonic()

    def abort(self, reason: str, failed_rank: int | None = None) -> None:
        with self._lock:
            if self.reason is None:
                self.reason, self.failed_rank = reason, failed_rank

    def check(self) -> None:
        if self.reason is None:
            return
        if self.failed_rank is not None:
            # the launcher's reason mostly names the rank itself ("rank 0 (mini1) failed with exit code 2")
            named = self.reason.startswith(f"rank {self.failed_rank} ")
            raise PeerLost(self.reason if named else f"rank {self.failed_rank} failed: {self.reason}",
                           rank=self.failed_rank)
        raise JobAborted(self.reason)


@dataclass(frozen=True)
class ChannelId:
    clockwise: bool
    stream: int
    ring: str = ""  # "" for the ring of all ranks, "h" for the ring of host leaders

    @property
    def name(self) -> str:
        return f"{self.ring}{'cw' if self.clockwise else 'ccw'}{self.stream}"


class Channel:
    """One direction of one stream: sends to ``next_rank``, receives from ``prev_rank``.

    ``position`` is this rank's index in the channel's ring order, which is what the ring
    algorithms schedule on (clockwise: the rank; counter-clockwise: the mirrored rank).
    """

    def __init__(self, ctx: zmq.Context, cid: ChannelId, rank: int, data_addrs: list[str], max_frame: int,
                 secret: bytes, job_id: str, liveness: Liveness, timeout_s: float,
                 io_threads: tuple[int, int] | None = None) -> None:
        self.id = cid
        self.rank = rank
        self.next_rank = self.prev_rank = self.position = -1  # see place()
        self.data_addrs = data_addrs
        self.peer_endpoints: list[str] = []  # next_rank's, one per data address; see connect()
        self.peer_endpoint = ""  # the one connected to
        self.secret, self.job_id = secret, job_id
        self.liveness = liveness
        self.timeout_s = timeout_s
        self.dropped = 0
        self._seq_out = 0
        self._seq_in = 0
        self._op = -1
        # (op, meta) of each broadcast this rank was the source of whose last member has yet to
        # answer: see expect_answer
        self._answers: deque[tuple[int, dict[str, Any]]] = deque()
        # (op, meta) of each broadcast whose source is ``next_rank``, and whose answer this rank
        # has still to send it: see owe_answer
        self._owed: deque[tuple[int, dict[str, Any]]] = deque()
        self.pull = ctx.socket(zmq.PULL)
        self.push = ctx.socket(zmq.PUSH)
        # (push, pull) on I/O threads of their own: one thread moves one flow at a time, and a
        # ring step sends and receives at once. Measured against both on one thread (4 ranks
        # over loopback): 12-18% faster at 16-256 MiB (benchmarks/results/2026-11-22-session7).
        if io_threads is not None:
            for sock, thread in zip((self.push, self.pull), io_threads, strict=True):
                sock.setsockopt(zmq.AFFINITY, 1 << thread)  # before bind/connect: applies to new connections
        self.pull.setsockopt(zmq.MAXMSGSIZE, max_frame + HEADER_SLACK)
        self.pull.setsockopt(zmq.LINGER, 0)
        self.pull.setsockopt(zmq.RCVHWM, 0)  # bounded by the schedule; never drop a legit frame
        for addr in data_addrs:  # before any bind: it applies to the socket's later binds
            netaddr.allow_ipv6(self.pull, addr)
        bound = []
        for addr in data_addrs:
            self.pull.bind(f"tcp://{netaddr.bracket(addr)}:*")
            bound.append(self.pull.getsockopt_string(zmq.LAST_ENDPOINT))
        self.endpoint = " ".join(bound)  # what the peer table holds: the previous rank picks one (connect)
        self.push.setsockopt(zmq.LINGER, 0)
        self.push.setsockopt(zmq.SNDHWM, 0)
        self.push.setsockopt(zmq.IMMEDIATE, 1)

    def place(self, members: list[int]) -> None:
        """Take this rank's place in the ring of ``members`` (in ring order)."""
        n, i = len(members), members.index(self.rank)
        step = 1 if self.id.clockwise else -1
        self.next_rank = members[(i + step) % n]
        self.prev_rank = members[(i - step) % n]
        self.position = i if self.id.clockwise else (n - i) % n

    def connect(self, endpoints: str) -> None:
        """Connect to ``next_rank`` at an endpoint it published (``endpoints``, space-separated):
        where it has several, the one on a subnet this rank's Mac has too (``netaddr.nearest``)."""
        self.peer_endpoints = endpoints.split()
        self.peer_endpoint = netaddr.nearest(self.peer_endpoints, self.data_addrs) or self.peer_endpoints[0]
        netaddr.allow_ipv6(self.push, self.peer_endpoint)
        self.push.connect(self.peer_endpoint)

    def unreachable(self, waited_s: float) -> str:
        """Why this channel has no connection to ``next_rank``, as a user can act on it."""
        address, port = netaddr.split_endpoint(self.peer_endpoint)
        said = (f"rank {self.rank} cannot connect to rank {self.next_rank} at {address} port {port} (its data "
                f"port) for {waited_s:.0f} s: {netaddr.probe(address, port)}. ")
        if netaddr.nearest(self.peer_endpoints, self.data_addrs) is None:
            theirs = ", ".join(netaddr.split_endpoint(e)[0] for e in self.peer_endpoints)
            return said + (f"None of rank {self.next_rank}'s data addresses ({theirs}) is on a subnet of this "
                           f"Mac's ({', '.join(self.data_addrs)}): where each cable has a subnet of its own, list "
                           f"the hosts in the order they are cabled, each next to the Macs it has cables to")
        return said + (f"{netaddr.FIREWALL_ADVICE}; otherwise {address} is not reachable from this Mac (`macfleet "
                       f"doctor` checks every link; --data-iface or addr= in a hostfile choose the address to "
                       f"train over)")

    def begin(self, op: int) -> None:
        """Start a new collective on this channel: sequence numbers restart per op. The answers
        this rank owes go first, ahead of the new op's messages, where the source reads them."""
        self.send_owed()
        self._op, self._seq_out, self._seq_in = op, 0, 0

    # -- sending ----------------------------------------------------------------------------
    def send(self, payload: memoryview | bytes | zmq.Frame, meta: dict[str, Any] | None = None,
             copy: bool = True) -> None:
        """Send one payload frame. A received ``zmq.Frame`` is passed on without a copy, whatever
        ``copy`` says: the new message shares its memory.

        ``copy=True``: the payload is copied into the message before this returns, so the
        caller may overwrite its memory at once.
        ``copy=False``: libzmq reads the payload from the caller's memory after this returns,
        and the caller must leave it alone until the peer has received it: until data the peer
        sends later depends on it, or until ``Ring.settle``. Not until libzmq releases the
        message: a 2.4 MB all-reduce between two hosts once hung every time waiting for pyzmq's
        tracker of a message the peer had long received (benchmarks/results/2026-11-22-session6)."""
        self._send(self._op, self._seq_out, payload, meta, copy)
        self._seq_out += 1

    def _send(self, op: int, seq: int, payload: memoryview | bytes | zmq.Frame, meta: dict[str, Any] | None,
              copy: bool) -> None:
        # meta first: the schedule fields must win over a collective's own keys
        fields = {**(meta or {}), "job": self.job_id, "op": op, "seq": seq, "src": self.rank, "n": len(payload)}
        mac, header = wire.pack(self.secret, fields)
        # Try first, poll only where that fails: the queue has no limit (SNDHWM 0), so the send
        # waits only while the connection is down (ZMQ_IMMEDIATE), and a poll of a ready socket
        # costs a few microseconds a message (3.9 us timed alone on the 2-core machine;
        # benchmarks/results/2026-11-29-session64).
        self.liveness.check()
        try:
            self.push.send(mac, SEND_FIRST_FRAME)
        except zmq.Again:
            self._wait(self.push, zmq.POLLOUT, "send to", self.next_rank)
            self.push.send(mac, zmq.SNDMORE)
        self.push.send(header, zmq.SNDMORE)  # the rest of a message whose first frame was taken
        self.push.send(payload, copy=copy)

    def owe_answer(self, meta: dict[str, Any]) -> None:
        """The current op is a broadcast from ``next_rank``, the member after this one, and this
        rank owes it the empty answer that ``expect_answer`` waits for. It goes at the start
        of this channel's next op (``begin``), or at shutdown (``send_owed``), not now: sent
        before the broadcast returned, it added a message's cost to the time this member waits
        for the tensor, the broadcast's time (benchmarks/results/2026-11-26-session34)."""
        self._owed.append((self._op, meta))

    def send_owed(self) -> None:
        while self._owed:
            op, meta = self._owed.popleft()
            self._send(op, 0, b"", meta, copy=True)  # seq 0: nothing else goes to the source on this channel

    # -- receiving --------------------------------------------------------------------------
    def expect_answer(self, meta: dict[str, Any]) -> None:
        """This op is a broadcast from this rank, and ``prev_rank``, the member before it,
        answers with an empty message (``owe_answer``), whose header is checked against ``meta``
        as every piece's is. Otherwise a rank that takes itself for the source only sends, and
        ranks that name different sources (each passing its own rank) would each keep its own
        tensor with no error. The answer is read before anything else this channel receives (the
        next collective's first message, or ``read_answers`` at shutdown), not now: a source
        waiting for it heard nothing for the whole transfer, and the launcher's stall check took
        it for a stuck rank."""
        # Those already here first: a script that only broadcasts from this rank piles none up
        while self._answers and self._read_answer(wait=False):
            pass
        self._answers.append((self._op, meta))

    def answers_due(self) -> list[int]:
        """The ops whose answers are still to be read, oldest first."""
        return [op for op, _ in self._answers]

    def read_answers(self) -> None:
        while self._answers:
            self._read_answer()

    def _read_answer(self, wait: bool = True) -> bool:
        op, meta = self._answers[0]
        try:
            if self._receive(op, 0, 0, meta, wait, answer=True) is None:
                return False
        except ProtocolError:
            # Said once. Read again as the rank leaves the job, what comes next is the other
            # rank's next collective, and it printed a second, misleading error at exit.
            self._answers.clear()
            raise
        self.pull.recv(copy=False)  # its empty payload
        self._answers.popleft()
        return True

    def recv_header(self, nbytes: int, meta: dict[str, Any] | None = None) -> dict[str, Any]:
        """Wait for the next message of this op's schedule; its payload frame is left unread."""
        self.read_answers()
        fields = self._receive(self._op, self._seq_in, nbytes, meta)
        assert fields is not None
        self._seq_in += 1
        return fields

    def _receive(self, op: int, seq: int, nbytes: int, meta: dict[str, Any] | None,
                 wait: bool = True, answer: bool = False) -> dict[str, Any] | None:
        """The header of message ``seq`` of op ``op``; anything else that comes first is dropped.
        Without ``wait``, None where no message is here."""
        while True:
            if wait:
                self._wait(self.pull, zmq.POLLIN, "receive from", self.prev_rank)
            elif not self.pull.poll(0, zmq.POLLIN):
                return None
            frames = [self.pull.recv(copy=False)]
            if frames[0].more:  # a frame says whether more follow: no getsockopt(RCVMORE) call
                frames.append(self.pull.recv(copy=False))
            try:
                fields = self._check(frames, op, seq, nbytes, meta, answer)
            except wire.BadMessage:
                self.dropped += 1
                self._drain()
                continue
            self.liveness.moved()
            return fields

    def recv_frame(self) -> zmq.Frame:
        return self.pull.recv(copy=False)

    def recv_into(self, dest: memoryview) -> None:
        got = self.pull.recv_into(dest)
        if got != len(dest):
            raise ProtocolError(f"rank {self.prev_rank} sent {got} bytes where {len(dest)} were due")

    def _check(self, frames: list[zmq.Frame], op: int, seq: int, nbytes: int,
               meta: dict[str, Any] | None, answer: bool = False) -> dict[str, Any]:
        if len(frames) != 2 or not frames[1].more:
            raise wire.BadMessage("wrong frame count")
        fields = wire.unpack(self.secret, frames[0].buffer, frames[1].buffer)
        if (fields.get("job"), fields.get("src"), fields.get("op"), fields.get("seq")) != (
            self.job_id, self.prev_rank, op, seq
        ):
            ahead = fields.get("op")
            if (fields.get("job"), fields.get("src")) == (self.job_id, self.prev_rank) and isinstance(ahead, int) \
                    and ahead > op:
                # Authentic, and sent after everything the sender had for us in our op: it has
                # made a collective that we have not. Dropped as a replay, it left both ranks
                # waiting for each other until the stall report. (Messages lost with a TCP
                # connection that broke and came back would read the same; between two live
                # processes that takes a peer kernel that forgot the connection, and the job
                # would not have survived it before either.)
                if answer:  # owed, it would have come first: a rank sends what it owes as its next op begins
                    raise ProtocolError(
                        f"rank {self.prev_rank}, the member before rank {self.rank} on the ring, went on to "
                        f"collective #{ahead} ({_described(fields)}) without answering rank {self.rank}'s broadcast "
                        f"#{op} ({_described(meta or {})}): rank {self.prev_rank} took another rank for the source "
                        f"(every rank must name the same source)")
                raise ProtocolError(
                    f"rank {self.prev_rank} is in collective #{ahead} ({_described(fields)}) while rank {self.rank} "
                    f"waits for its data in #{op} ({_described(meta or {})}): rank {self.prev_rank} has made "
                    f"more collectives than rank {self.rank} (every rank must call the same collectives, in the "
                    f"same order)")
            raise wire.BadMessage("not the next message of the schedule")  # e.g. a replay
        # Authentic and in order: a disagreement now is a real mismatch between ranks.
        for key, want in (meta or {}).items():
            if key == "root" and fields.get(key) != want and fields.get("c") == (meta or {}).get("c"):
                raise ProtocolError(
                    f"rank {self.prev_rank} is in {_described(fields)} while rank {self.rank} is in "
                    f"{_described(meta or {})} (collective #{op}): every rank must name the same source")
            if fields.get(key) != want:
                theirs, ours = fields.get("by"), (meta or {}).get("by")
                callers = (f"; rank {self.prev_rank}'s is from {theirs or 'the script'}, rank {self.rank}'s "
                           f"from {ours or 'the script'}") if theirs or ours else ""
                raise ProtocolError(
                    f"rank {self.prev_rank} and rank {self.rank} disagree on a collective's {key}: "
                    f"{fields.get(key)!r} != {want!r}{callers} (every rank must call the same collectives, "
                    f"in the same order, on tensors of the same size and dtype)"
                )
        if fields.get("n") != nbytes:
            raise ProtocolError(f"rank {self.prev_rank} sent {fields.get('n')} bytes where {nbytes} were due")
        return fields

    def _drain(self) -> None:
        while self.pull.getsockopt(zmq.RCVMORE):
            self.pull.recv(copy=False)

    def _wait(self, sock: zmq.Socket, event: int, what: str, peer: int) -> None:
        deadline = time.monotonic() + self.timeout_s
        while not sock.poll(POLL_SLICE_MS, event):
            self.liveness.check()
            if self.liveness.held:
                deadline = time.monotonic() + self.timeout_s
            if time.monotonic() > deadline:
                raise CollectiveTimeout(
                    f"rank {self.rank}: no progress for {self.timeout_s:.0f} s waiting to {what} rank {peer} "
                    f"on channel {self.id.name} (op {self._op}, {self.dropped} frames dropped); "
                    f"is rank {peer} stuck or behind?")
        self.liveness.check()

    def close(self, flush: bool = False) -> None:
        """``flush``: what this rank still sends is delivered after the close, for up to the
        collective timeout (ZeroMQ's linger; ``zmq.Context.term`` waits for it)."""
        self.push.close(linger=int(self.timeout_s * 1000) if flush else 0)
        self.pull.close(linger=0)


class Ring:
    """All channels of this rank in one ring: bound at construction (so the endpoints can be
    published), connected once the peer table says who the members are."""

    def __init__(self, ctx: zmq.Context, rank: int, data_addrs: list[str], streams: int, max_frame: int,
                 secret: bytes, job_id: str, liveness: Liveness, timeout_s: float, name: str = "") -> None:
        self.rank = rank
        self.members: list[int] = []
        self.world = 0
        self.liveness = liveness
        ids = [ChannelId(clockwise, s, name) for s in range(streams) for clockwise in (True, False)]
        threads = ctx.get(zmq.IO_THREADS)
        self.channels = [
            Channel(ctx, cid, rank, data_addrs, max_frame, secret, job_id, liveness, timeout_s,
                    io_threads=((2 * k) % threads, (2 * k + 1) % threads) if threads > 1 else None)
            for k, cid in enumerate(ids)
        ]

    def endpoints(self) -> dict[str, str]:
        return {ch.id.name: ch.endpoint for ch in self.channels}

    def connect(self, table: dict[int, dict[str, str]], members: list[int]) -> None:
        self.members, self.world = members, len(members)
        for ch in self.channels:
            ch.place(members)
            peer = table.get(ch.next_rank, {})
            if ch.id.name not in peer:
                raise RendezvousError(f"rank {ch.next_rank} published no endpoint for channel {ch.id.name}")
            ch.connect(peer[ch.id.name])

    def handshake(self, timeout_s: float | None = None) -> None:
        """Exchange one message on every channel, so that an unreachable neighbour fails init
        within ``timeout_s``, not step 1 after the collective timeout. A rank that cannot
        connect knows it first and says why; the neighbour it cannot reach, which only sees
        silence, waits a little longer, so the report's root cause is the one that explains."""
        timeout_s = timeout_s or knobs.seconds("MACFLEET_CONNECT_TIMEOUT", CONNECT_TIMEOUT_S)
        deadline = time.monotonic() + timeout_s
        for ch in self.channels:
            ch.begin(-1)
            # ZMQ_IMMEDIATE: the socket takes a message only once its connection is up
            while not ch.push.poll(POLL_SLICE_MS, zmq.POLLOUT):
                self.liveness.check()
                if time.monotonic() > deadline:
                    raise RendezvousError(ch.unreachable(timeout_s))
            ch.send(b"hello")
        for ch in self.channels:
            while not ch.pull.poll(POLL_SLICE_MS, zmq.POLLIN):
                self.liveness.check()
                if time.monotonic() > deadline + 2 * netaddr.PROBE_TIMEOUT_S:
                    raise RendezvousError(
                        f"rank {self.rank}: rank {ch.prev_rank} did not reach this rank's data port "
                        f"({ch.endpoint}) within {timeout_s:.0f} s; a firewall here may block incoming "
                        f"connections (see rank {ch.prev_rank}'s error)")
            ch.recv_header(5)
            ch.recv_frame()

    def back(self, ch: Channel) -> Channel:
        """The channel of ``ch``'s stream that runs the other way round the ring: it sends to
        the member ``ch`` receives from."""
        return next(c for c in self.channels if c.id.stream == ch.id.stream and c.id.clockwise != ch.id.clockwise)

    def settle(self, op: int, used: list[Channel]) -> None:
        """End op ``op``'s zero-copy sends on the ``used`` channels: tell every member we
        received from that we have all of it, and wait for the members we sent to to say the
        same. After this no message of the op still reads our memory, so the caller may reuse it.

        The word goes back on ``back(ch)``; a back channel that carried none of the op's data
        starts the op here. Every member calls this with the same channels (they follow from
        the tensor's size), so every settle word has its reader."""
        pairs = [(ch, self.back(ch)) for ch in used]  # one back channel per channel: no two share one
        for _, back in pairs:
            if back not in used:
                back.begin(op)
        for ch, back in pairs:
            back.send(b"", {"c": "settle", "of": ch.id.name})
        for ch, back in pairs:  # ch's receiver answers on its own back(ch), which arrives on ours
            back.recv_header(0, {"c": "settle", "of": ch.id.name})
            back.recv_frame()

    def answers_due(self) -> list[int]:
        return [op for ch in self.channels for op in ch.answers_due()]

    def send_owed(self) -> None:
        for ch in self.channels:
            ch.send_owed()

    def read_answers(self) -> None:
        for ch in self.channels:
            ch.read_answers()

    @property
    def dropped(self) -> int:
        return sum(ch.dropped for ch in self.channels)

    def close(self, flush: bool = False) -> None:
        for ch in self.channels:
            ch.close(flush)
