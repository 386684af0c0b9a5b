"""One 4 KiB ring message sent and received in turn on one thread: plain socket, bare pyzmq, macfleet's Channel."""
import time, zmq
from macfleet import wire
from macfleet.transport import Channel, ChannelId, Liveness
ctx = zmq.Context(io_threads=2)
live = Liveness()
a = Channel(ctx, ChannelId(True, 0), 0, ["127.0.0.1"], 1 << 30, b"s" * 32, "job", live, 30.0, io_threads=(0, 1))
b = Channel(ctx, ChannelId(True, 0), 1, ["127.0.0.1"], 1 << 30, b"s" * 32, "job", live, 30.0, io_threads=(0, 1))
a.place([0, 1]); b.place([0, 1]); a.connect(b.endpoint); b.connect(a.endpoint)
meta = {"c": "all_reduce", "numel": 4096, "dtype": "torch.float32", "by": ""}
raw = memoryview(bytearray(4096)); p, q = a.push, b.pull; n = 20000
a.send(b"x"); b.recv_header(1); b.recv_frame()
def run(name, body):
    for _ in range(300): body()
    t = time.perf_counter()
    for i in range(n): body()
    print(f"{name:40s} {(time.perf_counter() - t) / n * 1e6:6.1f} us")
def bare():
    p.send(b"m" * 32, zmq.SNDMORE); p.send(b"h" * 60, zmq.SNDMORE); p.send(raw, copy=True)
    q.poll(1000, zmq.POLLIN); q.recv(copy=False); q.recv(copy=False); q.recv(copy=False)
def bare_blocking():
    p.send(b"m" * 32, zmq.SNDMORE); p.send(b"h" * 60, zmq.SNDMORE); p.send(raw, copy=True)
    q.recv(copy=False); q.recv(copy=False); q.recv(copy=False)
def bare_multipart():
    p.send_multipart([b"m" * 32, b"h" * 60, raw], copy=True)
    q.recv_multipart(copy=False)
def pollout():
    p.poll(1000, zmq.POLLOUT); bare()
def packed():
    mac, hdr = wire.pack(a.secret, {**meta, "job": "job", "op": 1, "seq": 0, "src": 0, "n": 4096})
    p.send(mac, zmq.SNDMORE); p.send(hdr, zmq.SNDMORE); p.send(raw, copy=True)
    q.poll(1000, zmq.POLLIN); m = q.recv(copy=False); h = q.recv(copy=False); q.recv(copy=False)
    wire.unpack(a.secret, m.buffer, h.buffer)
def channel():
    a.begin(5); b.begin(5); a.send(raw, meta); b.recv_header(4096, meta); b.recv_frame()
for name, body in [("bare pyzmq, poll then recv", bare), ("bare pyzmq, blocking recv", bare_blocking),
                   ("bare multipart", bare_multipart), ("bare + POLLOUT poll", pollout),
                   ("bare + pack/unpack", packed), ("Channel send/recv_header/recv_frame", channel),
                   ("bare pyzmq, poll then recv", bare)]:
    run(name, body)
import socket
srv = socket.create_server(("127.0.0.1", 0)); c = socket.create_connection(srv.getsockname()); s, _ = srv.accept()
buf = bytearray(4096 + 92); data = bytes(4096 + 92)
def plain():
    c.sendall(data); got = 0
    while got < len(buf):
        got += s.recv_into(memoryview(buf)[got:])
run("plain TCP socket", plain)
