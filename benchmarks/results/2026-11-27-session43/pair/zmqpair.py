"""Two processes exchange one message of S bytes each way per round (as a two-member one pass),
over loopback: pyzmq PUSH/PULL pairs with socket options, and raw TCP sockets for comparison."""
import os, socket, sys, threading, time
import zmq

SIZES = [4 << 10, 256 << 10, 1 << 20, 4 << 20]
ROUNDS = {4 << 10: 2000, 256 << 10: 500, 1 << 20: 300, 4 << 20: 100}

def zmq_side(me, ports, opts, recv_into, copy, q):
    ctx = zmq.Context(2)
    pull = ctx.socket(zmq.PULL); push = ctx.socket(zmq.PUSH)
    for k, v in opts.items():
        for s in (pull, push):
            try: s.setsockopt(getattr(zmq, k), v)
            except zmq.ZMQError as e: q.append(f"{k}: {e}")
    pull.bind(f"tcp://127.0.0.1:{ports[me]}"); push.connect(f"tcp://127.0.0.1:{ports[1 - me]}")
    out = {}
    for size in SIZES:
        buf = bytearray(size); dst = bytearray(size)
        n = ROUNDS[size]
        for r in range(n + 20):
            if r == 20: t = time.perf_counter()
            push.send(b"h", zmq.SNDMORE); push.send(memoryview(buf), copy=copy)
            pull.recv()
            if recv_into: pull.recv_into(dst)
            else: f = pull.recv(copy=False); memoryview(dst)[:] = f.buffer
        out[size] = (time.perf_counter() - t) / n
    ctx.destroy(linger=0)
    return out

def raw_side(me, port, q):
    if me == 0:
        srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); srv.bind(("127.0.0.1", port)); srv.listen(1)
        s, _ = srv.accept()
    else:
        for _ in range(100):
            try: s = socket.create_connection(("127.0.0.1", port)); break
            except OSError: time.sleep(0.05)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    out = {}
    for size in SIZES:
        buf = bytes(size); dst = bytearray(size); mv = memoryview(dst)
        n = ROUNDS[size]
        for r in range(n + 20):
            if r == 20: t = time.perf_counter()
            th = threading.Thread(target=s.sendall, args=(buf,)); th.start()
            got = 0
            while got < size: got += s.recv_into(mv[got:])
            th.join()
        out[size] = (time.perf_counter() - t) / n
    return out

def main():
    variant = sys.argv[1]
    base = 20000 + (os.getpid() % 1000) * 4
    ports = [base, base + 1]
    variants = {
        "default": ({}, True, True),
        "copy-send": ({}, True, False),
        "recv-frame": ({}, False, True),
        "bufs-4M": ({"SNDBUF": 4 << 20, "RCVBUF": 4 << 20}, True, True),
        "batch-1M": ({"IN_BATCH_SIZE": 1 << 20, "OUT_BATCH_SIZE": 1 << 20}, True, True),
    }
    pid = os.fork()
    me = 0 if pid else 1
    q = []
    if variant == "raw":
        out = raw_side(me, base + 2, q)
    else:
        opts, recv_into, copy = variants[variant]
        out = zmq_side(me, ports, opts, recv_into, not copy if False else copy, q)
    if pid:
        os.waitpid(pid, 0)
        print(f"{variant:11s} " + "  ".join(f"{s >> 10}K {v * 1e3:.3f} ms" for s, v in out.items()), *q, flush=True)
    else:
        os._exit(0)

main()
