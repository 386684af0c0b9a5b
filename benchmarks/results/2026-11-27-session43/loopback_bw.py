import socket, os, time, sys
N = 1 << 30; CH = 4 << 20
a, b = socket.socketpair(socket.AF_UNIX) if sys.argv[1] == "unix" else (None, None)
if sys.argv[1] == "tcp":
    srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1)
    a = socket.create_connection(srv.getsockname()); b, _ = srv.accept()
pid = os.fork()
if pid == 0:
    buf = bytearray(CH); mv = memoryview(buf); got = 0
    while got < N:
        got += b.recv_into(mv)
    os._exit(0)
buf = bytes(CH); t = time.perf_counter(); sent = 0
while sent < N:
    a.sendall(buf); sent += CH
os.waitpid(pid, 0)
print(sys.argv[1], f"{N / (time.perf_counter() - t) / 1e9:.2f} GB/s one way")
