"""Does a thread spinning with os.sched_yield() (as LocalGroup.barrier does for 2 ms) let another
thread that needs the GIL (an autograd hook on the training thread) in promptly?"""
import os, sys, threading, time, statistics
import torch

stop = threading.Event()
def spinner(mode):
    x = [0] * 4
    while not stop.is_set():
        if mode == "yield":
            any(x[i] > 1 for i in range(4)); time.monotonic(); os.sched_yield()
        elif mode == "python":
            any(x[i] > 1 for i in range(4)); time.monotonic()
        elif mode == "sleep0":
            any(x[i] > 1 for i in range(4)); time.monotonic(); time.sleep(0)
        elif mode == "nap":
            any(x[i] > 1 for i in range(4)); time.monotonic(); time.sleep(50e-6)

a = torch.randn(64, 64); b = torch.randn(64, 64)
def work(n=300):
    lat = []
    for _ in range(n):
        t = time.perf_counter()
        torch.mm(a, b)  # releases the GIL inside? mm on small tensors: the GIL is released around the op
        time.sleep(20e-6)  # releases the GIL, must take it back
        lat.append(time.perf_counter() - t)
    return lat

for mode in ["none", "yield", "python", "sleep0", "nap", "yield"]:
    stop.clear()
    th = threading.Thread(target=spinner, args=(mode,)) if mode != "none" else None
    if th: th.start()
    time.sleep(0.01)
    lat = work()
    stop.set()
    if th: th.join()
    lat.sort()
    print(f"{mode:7s} median {statistics.median(lat)*1e6:8.1f} us  p90 {lat[int(.9*len(lat))]*1e6:8.1f}  max {lat[-1]*1e6:8.1f}  total {sum(lat)*1e3:7.1f} ms  switchinterval {sys.getswitchinterval()}")
