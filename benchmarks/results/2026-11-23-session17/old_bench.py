"""The rank side of ``macfleet bench allreduce``: time macfleet's and gloo's all-reduce side by side.

Both run in the same processes, on the same tensors and sizes, one after the other; every
result of both is checked against the exact sum. Rank 0 reports a row per (size, library).
With ``--shared-tensors`` the tensors are ``macfleet.host_tensor`` allocations (memory this
host's ranks share, as DataParallel's buckets are), which gloo reduces like any other.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist

import macfleet
from macfleet.runtime import host_tensor, report, runtime

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    return int(float(text[:-1]) * units[text[-1]]) if text and text[-1] in units else int(text)


def timed(fn, tensor: torch.Tensor, budget_s: float) -> tuple[float, int]:
    """Median seconds per call, over as many calls as fit in ``budget_s`` (at least 3; every rank
    runs the same count, so the collective calls line up)."""
    fn(tensor)  # warm-up (buffers, connections)
    started = time.perf_counter()
    fn(tensor)
    once = max(time.perf_counter() - started, 1e-6)
    count = torch.tensor([max(3, min(200, int(budget_s / once)))])
    macfleet.all_reduce(count, "max")
    times = []
    for _ in range(int(count.item())):
        macfleet.barrier()
        started = time.perf_counter()
        fn(tensor)
        times.append(time.perf_counter() - started)
    worst = torch.tensor([sorted(times)[len(times) // 2]])
    macfleet.all_reduce(worst, "max")  # a collective is as slow as its slowest rank
    return float(worst.item()), len(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="4K,1M,16M,64M")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    parser.add_argument("--budget", type=float, default=1.0, help="seconds of timing per size and library")
    parser.add_argument("--no-gloo", action="store_true")
    parser.add_argument("--shared-tensors", action="store_true")
    args = parser.parse_args()
    macfleet.init(device="cpu")
    rank, world = macfleet.rank(), macfleet.world_size()
    if not args.no_gloo:
        dist.init_process_group("gloo", rank=rank, world_size=world)  # MASTER_ADDR/PORT from the launcher
    dtype = DTYPES[args.dtype]
    rows = []
    for size in (parse_size(s) for s in args.sizes.split(",")):
        numel = max(1, size // dtype.itemsize)
        base = (torch.arange(numel) % 7).to(dtype)
        expected = (base * world + sum(range(world))).to(dtype)  # rank r contributes base + r
        libraries = [("macfleet", lambda t: macfleet.all_reduce(t))]
        if not args.no_gloo:
            libraries.append(("gloo", lambda t: dist.all_reduce(t)))
        # one tensor per size, refilled before each use
        tensor = host_tensor(numel, dtype) if args.shared_tensors else torch.empty(numel, dtype=dtype)
        for name, fn in libraries:
            check = tensor.copy_(base + rank)
            fn(check)
            if not torch.equal(check, expected):
                raise SystemExit(f"{name} all_reduce of {size} bytes gave a wrong result")
            algorithm = runtime().collectives.last_algorithm if name == "macfleet" else "gloo default"
            seconds, calls = timed(fn, tensor.copy_(base + rank), args.budget)
            rows.append({"library": name, "bytes": numel * dtype.itemsize, "seconds": seconds, "calls": calls,
                         "algorithm": algorithm, "busbw_gbs": 2 * (world - 1) / world * numel * dtype.itemsize
                         / seconds / 1e9})
    if rank == 0:
        for r in rows:
            print(f"OLD {r['bytes'] >> 20}M {r['library']} {r['seconds'] * 1e3:.2f} ms", flush=True)
        report({"world": world, "dtype": args.dtype, "rows": rows, "shared_tensors": args.shared_tensors,
                "streams": os.environ.get("MACFLEET_STREAMS", "auto"), "shm": os.environ.get("MACFLEET_SHM", "1")})
    macfleet.barrier()
    if not args.no_gloo:
        dist.destroy_process_group()
    macfleet.shutdown()


if __name__ == "__main__":
    main()
