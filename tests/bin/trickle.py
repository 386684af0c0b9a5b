"""A slow download's server: ``trickle.py SECONDS`` prints its port, then answers one HTTP
request with a byte every 0.2 s for SECONDS (a large file over a slow link, as a client sees
it: always waiting on the network, never computing)."""

import socket
import sys
import time

listener = socket.create_server(("127.0.0.1", 0))
print(listener.getsockname()[1], flush=True)
conn, _ = listener.accept()
conn.recv(65536)  # the request
count = int(float(sys.argv[1]) / 0.2)
conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % count)
for _ in range(count):
    conn.sendall(b"x")
    time.sleep(0.2)
