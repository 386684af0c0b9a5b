"""The client end of the control plane: a signed DEALER socket to the coordinator.

Used by agents (from their main loop) and by training processes (from one background
thread, see ``macfleet.runtime``). A ZeroMQ socket belongs to one thread; callers keep it so.
"""

from __future__ import annotations

import time
from typing import Any

import zmq

from macfleet import netaddr, protocol, wire


class ControlClient:
    def __init__(self, ctx: zmq.Context, endpoint: str, secret: bytes, job_id: str, sender: str) -> None:
        self.secret = secret
        self.job_id = job_id
        self.sender = sender
        self.dropped = 0
        self._seq = 0
        self._last_seq = -1
        self.socket = ctx.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 1000)
        self.socket.setsockopt(zmq.MAXMSGSIZE, protocol.CONTROL_MAX_BYTES)
        self.socket.setsockopt(zmq.SNDHWM, 10000)
        self.socket.setsockopt(zmq.RECONNECT_IVL, 100)
        self.socket.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        netaddr.allow_ipv6(self.socket, endpoint)
        self.socket.connect(endpoint)

    def send(self, kind: str, **fields: Any) -> None:
        self._seq += 1
        mac, header = wire.pack(
            self.secret, {"job": self.job_id, "kind": kind, "from": self.sender, "seq": self._seq, **fields}
        )
        # The socket queues while disconnected (HWM is large), so a send never blocks for long;
        # NOBLOCK turns a full queue into an error instead of a hang.
        self.socket.send_multipart([mac, header], flags=zmq.NOBLOCK)

    def recv(self, timeout_s: float) -> dict[str, Any] | None:
        """The next authenticated message from the coordinator, or None at the deadline."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self.socket.poll(int(left * 1000) + 1, zmq.POLLIN):
                return None
            frames = self.socket.recv_multipart()
            try:
                if len(frames) != 2:
                    raise wire.BadMessage("wrong frame count")
                fields = wire.unpack(self.secret, frames[0], frames[1])
                seq = fields.get("seq")
                if fields.get("job") != self.job_id or not isinstance(seq, int) or seq <= self._last_seq:
                    raise wire.BadMessage("other job or replayed")
            except wire.BadMessage:
                self.dropped += 1
                continue
            self._last_seq = seq
            return fields

    def close(self) -> None:
        self.socket.close()
