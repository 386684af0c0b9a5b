"""Memory bandwidth of one thread copying 256 MiB (read + write counted), in N processes at once."""
import os, time
import torch

torch.set_num_threads(1)
a = torch.empty(64 << 20); b = torch.empty_like(a); b.copy_(a)
t = time.perf_counter()
for _ in range(10):
    b.copy_(a)
print(f"pid {os.getpid()}: {2 * 10 * a.numel() * 4 / (time.perf_counter() - t) / 1e9:.1f} GB/s (read+write)")
