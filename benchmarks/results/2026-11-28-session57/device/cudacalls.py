# session 57: what the CUDA calls on a single bucket's path cost on the host, each alone
import time, torch
from macfleet.backends import CudaDevice
dev = CudaDevice(0)
flat = torch.randn(56714, device="cuda")
host = dev.host_buffer(56714, torch.float32)
def t(name, fn, n=2000):
    for _ in range(50): fn()
    torch.cuda.synchronize()
    s = time.perf_counter()
    for _ in range(n): fn()
    e = time.perf_counter()
    torch.cuda.synchronize()
    print(f"{name:<40} {(e - s) / n * 1e6:7.1f} us")
t("record_event", dev.record_event)
ev = dev.record_event()
t("to_host (queued)", lambda: dev.to_host(flat, host, ev))
t("to_host + synchronize", lambda: dev.to_host(flat, host, dev.record_event()).synchronize())
t("from_host (queued)", lambda: dev.from_host(host, flat))
t("staged", dev.staged)
side = dev._side_stream()
# (the run also printed "torch.cuda.stream ctx 0.0 us": a line here that timed an empty lambda, removed)
def ctx():
    with torch.cuda.stream(side):
        pass
t("with torch.cuda.stream(side)", ctx)
t("copy_ nb on current stream", lambda: host.copy_(flat, non_blocking=True))
t("Event() + record", lambda: torch.cuda.Event().record())
def whole():
    c = dev.to_host(flat, host, dev.record_event()); c.synchronize(); dev.from_host(host, flat); dev.staged()
t("whole path, no all-reduce", whole)
def direct():
    host.copy_(flat, non_blocking=True); e = torch.cuda.Event(); e.record(); e.synchronize(); flat.copy_(host, non_blocking=True)
t("same on the current stream", direct)
