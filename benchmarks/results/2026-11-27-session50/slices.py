"""All-reduce of a run of elements of a ``macfleet.host_tensor``, against the whole tensor:
``macfleet launch --nproc N slices.py``. Rank 0 prints the median ms of each, and the path the
run took. Session 50: the run is reduced where it is (before, through the slots)."""

import statistics
import time

import macfleet
from macfleet.runtime import runtime

macfleet.init()
n = 16 << 20  # 64 MiB of float32
buf = macfleet.host_tensor(n)
results = {}
for label, view in (("whole", buf), ("first half", buf[: n // 2]), ("middle half", buf[n // 4: 3 * n // 4])):
    times = []
    for _ in range(12):
        view.fill_(macfleet.rank() + 1)
        macfleet.barrier()
        began = time.perf_counter()
        macfleet.all_reduce(view)
        times.append(time.perf_counter() - began)
    want = sum(range(1, macfleet.world_size() + 1))
    assert bool((view == want).all()), label
    results[label] = (statistics.median(times[2:]) * 1e3, runtime().collectives.last_algorithm, view.numel() * 4 >> 20)
if macfleet.rank() == 0:
    for label, (ms, path, mib) in results.items():
        print(f"{label:12} {mib:3d} MiB {ms:7.2f} ms  {path}")
macfleet.shutdown()
