import time, torch, macfleet, os
from macfleet.transport import Channel
macfleet.init()
acc = {}
def wrap(name):
    f = getattr(Channel, name)
    def g(self, *a, **k):
        t = time.perf_counter_ns(); r = f(self, *a, **k); acc[name] = acc.get(name, 0) + time.perf_counter_ns() - t; return r
    setattr(Channel, name, g)
for n in ("send", "recv_header", "recv_into", "begin", "_check"):
    wrap(n)
import zmq, macfleet.wire as wire
fw = Channel._wait
def w(self, sock, event, *a):
    t = time.perf_counter_ns(); fw(self, sock, event, *a); k = "wait_out" if event == zmq.POLLOUT else "wait_in"; acc[k] = acc.get(k, 0) + time.perf_counter_ns() - t
Channel._wait = w
fp = wire.pack
def pk(*a):
    t = time.perf_counter_ns(); r = fp(*a); acc["pack"] = acc.get("pack", 0) + time.perf_counter_ns() - t; return r
wire.pack = pk
t = torch.ones(int(os.environ.get("NUMEL", "1")))
for _ in range(500): macfleet.all_reduce(t)
acc.clear()
n = 5000
s = time.perf_counter()
for _ in range(n): macfleet.all_reduce(t)
el = time.perf_counter() - s
if macfleet.rank() == 0:
    print(f"{el/n*1e6:.1f} us per all_reduce; " + ", ".join(f"{k} {v/n/1e3:.1f}" for k, v in acc.items()))
