"""The in-place all-reduce of a shared tensor (DataParallel's buckets on one host), its host
arithmetic done several ways: ``macfleet launch --nproc N inplace.py``. Rank 0 prints the median
ms of each way for 16 and 64 MiB, and of its phases for the current way (reduce into the scratch
piece, divide it, copy it into every row). Every way is checked against the exact average."""

import statistics
import time

import torch

import macfleet
from macfleet import shm
from macfleet.runtime import runtime

macfleet.init()
rank, world = macfleet.rank(), macfleet.world_size()
local = runtime().collectives.local
phases = {"reduce": 0.0, "divide": 0.0, "copy out": 0.0}


def current(self, inputs, outputs, share, op, divide_by, timed=False, piece_bytes=None, fused=False):
    a, b = share
    step = max(1, (piece_bytes or self.slot_bytes) // inputs.element_size())
    for start in range(a, b, step):
        stop = min(start + step, b)
        rows = inputs[:, start:stop]
        if self._scratch.numel() < stop - start:
            self._scratch = torch.empty(step, dtype=inputs.dtype)
        result = self._scratch[: stop - start]
        t0 = time.perf_counter()
        shm._reduce_columns(rows, result, op)
        t1 = time.perf_counter()
        if fused:  # the division on the way out: one pass fewer over the piece
            for j in range(outputs.shape[0]):
                torch.mul(result, 1.0 / divide_by, out=outputs[j, start:stop])
            t2 = t1
        else:
            if divide_by != 1:
                result.div_(divide_by)
            t2 = time.perf_counter()
            outputs[:, start:stop].copy_(result.expand(outputs.shape[0], -1))
        t3 = time.perf_counter()
        if timed:
            phases["reduce"] += t1 - t0
            phases["divide"] += t2 - t1
            phases["copy out"] += t3 - t2


WAYS = {
    "current": dict(),
    "pieces 4M": dict(piece_bytes=4 << 20),
    "pieces 1M": dict(piece_bytes=1 << 20),
    "divide on the way out": dict(fused=True),
    "divide on the way out, pieces 4M": dict(fused=True, piece_bytes=4 << 20),
}
out = {}
for mib in (16, 64):
    buf = macfleet.host_tensor((mib << 20) // 4)
    for name, kw in WAYS.items():
        shm.LocalGroup._reduce_rows = lambda self, i, o, s, op, d, kw=kw: current(self, i, o, s, op, d, **kw)
        times = []
        for it in range(14):
            buf.fill_(rank + 1)
            macfleet.barrier()
            t = time.perf_counter()
            macfleet.all_reduce(buf, "avg")
            times.append(time.perf_counter() - t)
        assert bool((buf == sum(range(1, world + 1)) / world).all()), name
        assert "in place" in runtime().collectives.last_algorithm
        out[(mib, name)] = statistics.median(times[2:]) * 1e3
    for k in phases:
        phases[k] = 0.0
    shm.LocalGroup._reduce_rows = lambda self, i, o, s, op, d: current(self, i, o, s, op, d, timed=True)
    for it in range(12):
        buf.fill_(rank + 1)
        macfleet.barrier()
        macfleet.all_reduce(buf, "avg")
    out[(mib, "phases")] = {k: round(v / 12 * 1e3, 2) for k, v in phases.items()}
    del buf
if rank == 0:
    print(f"N={world} threads={torch.get_num_threads()} slot={local.slot_bytes >> 20} MiB")
    for key, v in out.items():
        print(f"  {key[0]:3d} MiB  {key[1]:34s} {v if isinstance(v, dict) else round(v, 2)}")
macfleet.shutdown()
