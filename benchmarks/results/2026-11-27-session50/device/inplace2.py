"""The in-place all-reduce (average) of a shared tensor, second round: the division made on the
way out in one call (``torch.div`` of the expanded sum into every row: the same bits as dividing
the sum, then copying it), with the sum over rows as one ``torch.sum`` (as now) or as a chain of
adds. ``macfleet launch --nproc N inplace2.py``; rank 0 prints median ms, and the phases."""

import statistics
import time

import torch

import macfleet
from macfleet import shm
from macfleet.runtime import runtime

macfleet.init()
rank, world = macfleet.rank(), macfleet.world_size()
local = runtime().collectives.local
phases = {}


def way(self, inputs, outputs, share, op, divide_by, timed=False, div_out=False, chain=False):
    a, b = share
    step = max(1, self.slot_bytes // inputs.element_size())
    for start in range(a, b, step):
        stop = min(start + step, b)
        rows = inputs[:, start:stop]
        if self._scratch.numel() < stop - start:
            self._scratch = torch.empty(step, dtype=inputs.dtype)
        result = self._scratch[: stop - start]
        t0 = time.perf_counter()
        if chain:
            shm._combine(list(rows), result, op)
        else:
            shm._reduce_columns(rows, result, op)
        t1 = time.perf_counter()
        if div_out:
            torch.div(result.expand(outputs.shape[0], -1), divide_by, out=outputs[:, start:stop])
        else:
            result.div_(divide_by)
            outputs[:, start:stop].copy_(result.expand(outputs.shape[0], -1))
        t2 = time.perf_counter()
        if timed:
            phases["reduce"] = phases.get("reduce", 0.0) + t1 - t0
            phases["out"] = phases.get("out", 0.0) + t2 - t1


WAYS = {"current": {}, "divide on the way out": {"div_out": True},
        "divide on the way out, chained adds": {"div_out": True, "chain": True}}
out = {}
for mib in (16, 64):
    buf = macfleet.host_tensor((mib << 20) // 4)
    for rnd in range(2):
        for name, kw in WAYS.items():
            shm.LocalGroup._reduce_rows = lambda self, i, o, s, op, d, kw=kw: way(self, i, o, s, op, d, **kw)
            times = []
            for it in range(12):
                buf.copy_(torch.arange(buf.numel()) % 977 + rank)
                macfleet.barrier()
                t = time.perf_counter()
                macfleet.all_reduce(buf, "avg")
                times.append(time.perf_counter() - t)
            want = ((torch.arange(buf.numel()) % 977) * world + sum(range(world))) / world
            assert torch.equal(buf, want.float()) or bool((buf - want).abs().max() < 1e-3), name
            assert "in place" in runtime().collectives.last_algorithm
            out.setdefault((mib, name), []).append(round(statistics.median(times[2:]) * 1e3, 2))
    for name, kw in WAYS.items():
        phases.clear()
        shm.LocalGroup._reduce_rows = lambda self, i, o, s, op, d, kw=kw: way(self, i, o, s, op, d, timed=True, **kw)
        for it in range(10):
            buf.fill_(rank + 1)
            macfleet.barrier()
            macfleet.all_reduce(buf, "avg")
        out[(mib, name + " phases")] = {k: round(v / 10 * 1e3, 2) for k, v in phases.items()}
    del buf
if rank == 0:
    print(f"N={world} threads={torch.get_num_threads()} slot={local.slot_bytes >> 20} MiB")
    for key, v in out.items():
        print(f"  {key[0]:3d} MiB  {key[1]:44s} {v}")
macfleet.shutdown()
