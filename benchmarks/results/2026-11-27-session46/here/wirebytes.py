"""Rank script: bytes each rank's veth sends, and time, per 24 MiB all-reduce: macfleet, then gloo."""
import os, time
import torch, torch.distributed as dist
import macfleet
macfleet.init()
dist.init_process_group("gloo")
rank = macfleet.rank()
dev = [d for d in os.listdir("/sys/class/net") if d.startswith("mfv")][0]
def tx(): return int(open(f"/sys/class/net/{dev}/statistics/tx_bytes").read()), int(open(f"/sys/class/net/{dev}/statistics/tx_packets").read())
t = torch.ones(6 << 20)  # 24 MiB
K = 6
for lib in ("macfleet", "gloo", "macfleet", "gloo"):
    fn = (lambda: macfleet.all_reduce(t)) if lib == "macfleet" else (lambda: dist.all_reduce(t))
    fn(); macfleet.barrier(); dist.barrier()
    b0, p0 = tx(); s = time.perf_counter()
    for _ in range(K): fn()
    el = time.perf_counter() - s
    b1, p1 = tx()
    t.fill_(1.0)
    print(f"rank {rank} {lib:8s} {(b1-b0)/K/2**20:8.3f} MiB sent/call ({(b1-b0)/K/(24*2**20):.4f} of payload), {(p1-p0)/K:7.0f} packets/call, {1000*el/K:7.2f} ms/call", flush=True)
