"""The rank side of ``macfleet bench allreduce``: time macfleet's and gloo's all-reduce side by side.

Both run in the same processes, on the same tensors and sizes, taking turns (``timed``); every
result of both is checked against the exact sum. Rank 0 reports a row per (size, library).
With ``--shared-tensors`` the tensors are ``macfleet.host_tensor`` allocations (memory this
host's ranks share, as DataParallel's buckets are), which gloo reduces like any other.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from typing import Callable

import torch
import torch.distributed as dist

import macfleet
from macfleet.env import physical_memory
from macfleet.knobs import parse_size
from macfleet.runtime import host_tensor, report, runtime

HELD_PER_SIZE = 4  # tensors of the size timed that each rank holds at once (memory_shortfalls)
BLOCK = 8  # timed calls of one library before the other's turn
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def timed(fns: list[Callable[[torch.Tensor], object]], tensor: torch.Tensor,
          budget_s: float) -> list[tuple[float, int]]:
    """Median seconds per call of each of ``fns`` and the number of calls, over as many calls as
    fit in ``budget_s`` per library (at least 3; every rank runs the same count, so the collective
    calls line up).

    The libraries take turns in blocks of ``BLOCK`` calls, each block after an untimed call of
    its own: a slow spell of a shared machine then falls on all of them alike (timing all of one
    library's calls before the other's moved their ratio by up to 2x between runs on the device
    machine), while every timed call still finds the caches as its own library's last call left
    them, as back-to-back calls do. Call by call, each library found the other's data in the
    cache (a 300 MiB L3 there), which cost the shared-memory path a third of its speed-up."""
    once = []
    for fn in fns:
        fn(tensor)  # warm-up (buffers, connections)
        started = time.perf_counter()
        fn(tensor)
        once.append(max(time.perf_counter() - started, 1e-6))
    count = torch.tensor([max(3, min(200, int(budget_s * len(fns) / sum(once))))])
    macfleet.all_reduce(count, "max")
    calls = int(count.item())
    times: list[list[float]] = [[] for _ in fns]
    while len(times[0]) < calls:
        for fn, spent in zip(fns, times):
            fn(tensor)  # back from the other library's turn
            for _ in range(min(BLOCK, calls - len(spent))):
                macfleet.barrier()
                started = time.perf_counter()
                fn(tensor)
                spent.append(time.perf_counter() - started)
    worst = torch.tensor([sorted(spent)[len(spent) // 2] for spent in times], dtype=torch.float64)
    macfleet.all_reduce(worst, "max")  # a collective is as slow as its slowest rank
    return [(float(seconds), len(spent)) for seconds, spent in zip(worst.tolist(), times)]


def memory_shortfalls(largest: str, hosts: list[tuple[str, int | None]]) -> list[str]:
    """The hosts (one entry per rank: its host and that host's memory) whose ranks cannot hold
    the largest size: a rank holds some 4 tensors of a size (the one reduced, its starting
    values, the exact sum, and what the libraries add), 3.2 to 3.7 GiB at 1 GiB on Linux. Past a
    host's memory the allocation fails with a traceback, or the system kills the ranks (Linux's
    OOM killer) after minutes of swapping, with the smaller sizes already timed for nothing."""
    ranks = Counter(hosts)
    short = []
    for (host, memory), count in ranks.items():
        needed = HELD_PER_SIZE * parse_size(largest) * count
        if memory is not None and needed > memory:
            short.append(f"{count} rank{'s' if count > 1 else ''} on {host} would hold about {needed / 2**30:.1f} "
                         f"GiB, and it has {memory / 2**30:.1f} GiB")
    return short


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
    # A host with one address per cable (its agent adds its own ends of them) is in a ring of
    # cables, where not every Mac reaches every other: gloo, which connects every rank to every
    # other over one interface, would wait for its connections for 30 minutes.
    env = runtime().env
    hosts = macfleet.all_gather_object((env.host, len(env.data_addrs), physical_memory()))
    cabled = sorted({host for host, n, _ in hosts if n > 1})
    if cabled and not args.no_gloo:
        args.no_gloo = True
        if rank == 0:
            print(f"timing macfleet alone: {', '.join(cabled)} {'has' if len(cabled) == 1 else 'have'} one address "
                  f"per cable, and gloo connects every rank to every other over one interface", file=sys.stderr,
                  flush=True)
    dtype = DTYPES[args.dtype]
    largest = max(args.sizes.split(","), key=parse_size).strip()
    short = memory_shortfalls(largest, [(host, memory) for host, _, memory in hosts])
    if short:  # every rank knows; rank 0 says it, once
        sys.exit(f"--sizes up to {largest}: {'; '.join(short)} ({HELD_PER_SIZE} tensors of that size a rank): give "
                 f"smaller --sizes, or fewer ranks on {'that host' if len(short) == 1 else 'those hosts'}"
                 if rank == 0 else 0)
    if not args.no_gloo:
        dist.init_process_group("gloo", rank=rank, world_size=world)  # MASTER_ADDR/PORT from the launcher
    rows = []
    for text in args.sizes.split(","):
        size = parse_size(text)
        numel = max(1, size // dtype.itemsize)
        base = torch.arange(7, dtype=dtype).repeat(-(-numel // 7))[:numel]  # 0..6 over and over
        expected = base.mul(world).add_(sum(range(world)))  # rank r contributes base + r
        libraries = [("macfleet", lambda t: macfleet.all_reduce(t))]
        if not args.no_gloo:
            libraries.append(("gloo", lambda t: dist.all_reduce(t)))
        # one tensor per size, refilled before each use
        tensor = host_tensor(numel, dtype) if args.shared_tensors else torch.empty(numel, dtype=dtype)
        algorithms = {}
        for name, fn in libraries:
            check = tensor.copy_(base).add_(rank)
            fn(check)
            if not torch.equal(check, expected):
                raise SystemExit(f"{name} all_reduce of {size} bytes gave a wrong result")
            algorithms[name] = runtime().collectives.last_algorithm if name == "macfleet" else "gloo default"
        results = timed([fn for _, fn in libraries], tensor.copy_(base).add_(rank), args.budget)
        for (name, _), (seconds, calls) in zip(libraries, results):
            rows.append({"library": name, "bytes": numel * dtype.itemsize, "seconds": seconds, "calls": calls,
                         "algorithm": algorithms[name], "busbw_gbs": 2 * (world - 1) / world * numel * dtype.itemsize
                         / seconds / 1e9})
        if rank == 0:  # progress, size by size (a run up to 256 MiB at 8 ranks takes a minute); the table,
            # on stdout, follows at the end
            print(f"{text.strip()}: " + ", ".join(f"{name} {seconds * 1e3:.3f} ms" for (name, _), (seconds, _)
                                                  in zip(libraries, results)), file=sys.stderr, flush=True)
    if rank == 0:
        local = runtime().collectives.local  # this host's shared memory, if its ranks share it
        report({"world": world, "dtype": args.dtype, "rows": rows, "shared_tensors": args.shared_tensors,
                "streams": os.environ.get("MACFLEET_STREAMS", "auto"), "shm": os.environ.get("MACFLEET_SHM", "1"),
                "slot_bytes": local.slot_bytes if local is not None else None})
    macfleet.barrier()
    if not args.no_gloo:
        dist.destroy_process_group()
    macfleet.shutdown()


if __name__ == "__main__":
    main()
