"""What one machine's memory and loopback TCP allow an all-reduce of N ranks, at most.

    python benchmarks/roofline.py [--nprocs 2,4,8] [--sizes 16M,64M,256M] [--json FILE]

``macfleet bench allreduce`` says how fast macfleet is against gloo. This says how fast any
all-reduce of N processes on this machine could be, so that a speed-up that falls short can be
told apart from one that the machine does not allow. Three bounds, each as a bus bandwidth
(2(N-1)/N x bytes / time, the unit of ``bench``):

- **Shared memory, private tensors.** N processes (each with the launcher's threads, the
  machine's cores over N, and ``OMP_WAIT_POLICY=PASSIVE``, as ranks get them) each copy a
  private tensor of each size into another, all at once, with torch. An all-reduce of private
  tensors must at least read each rank's tensor once and write each rank's result once: the
  same memory traffic as that copy. What it moves through shared memory besides can stay in
  the cache the cores share, if the slots are small enough (``macfleet.shm``). So no such
  all-reduce beats the slowest rank's copy, and the ceiling is 2(N-1)/N x bytes / that time.
- **Shared memory, counting the slots.** The slots' traffic is not free either: a rank writes
  what the others need into its slot, reads the others' parts of its share, writes the sum
  for them and reads theirs, (3 - 2/N) x bytes through the cache besides the copy's, and
  these passes cannot be left out (no rank can read another's private memory). Timed as
  copies of one slot (``macfleet.shm.default_slot_bytes``, what ``bench`` uses), by all N
  processes at once, that traffic adds (3 - 2/N) / 2 slot copies per slot of the tensor. The
  copy and those passes together are what macfleet's path through shared memory cannot go
  under (barriers and torch's calls come on top).
- **Loopback TCP.** N processes in a ring, each sending each size to the next while it
  receives as much from the one before, over as many connections as it has threads, with
  plain blocking sockets (``sendall``, ``recv_into``), a thread for each direction of each.
  A ring all-reduce sends 2(N-1)/N x bytes per rank, so no ring over loopback TCP beats the
  rate at which each rank sends here (before it adds anything up).

All three are upper bounds, not predictions: the all-reduce also waits at barriers and adds,
and its passes compete with each other for the same memory. (On a Mac, whose shared cache
macOS does not report, the slot is the ranks' default there too: the largest.)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import socket
import sys
import threading
import time
from pathlib import Path

PIECE = 4 << 20  # bytes per send call


def copier(nbytes: int, repeats: int, start: mp.Barrier, out: mp.Queue) -> None:
    import torch

    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    for _ in range(2):  # pages mapped and teams woken before the clock starts
        dst.copy_(src)
    start.wait()
    began = time.perf_counter()
    for _ in range(repeats):
        dst.copy_(src)
    out.put(time.perf_counter() - began)


def ringer(rank: int, world: int, ports, flows: int, nbytes: int, repeats: int, start: mp.Barrier,
           out: mp.Queue) -> None:
    """``ports``: a shared array where each process of the ring says where it listens."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=flows)
    ports[rank] = listener.getsockname()[1]
    start.wait()  # every rank listens
    nxt = [socket.create_connection(("127.0.0.1", ports[(rank + 1) % world])) for _ in range(flows)]
    prev = [listener.accept()[0] for _ in range(flows)]
    part = nbytes // flows
    payload, inbox = memoryview(bytearray(part)), [memoryview(bytearray(part)) for _ in range(flows)]
    start.wait()  # the ring is whole

    failed: list[BaseException] = []

    def send(s: socket.socket) -> None:
        try:
            for _ in range(repeats):
                for a in range(0, part, PIECE):
                    s.sendall(payload[a:a + PIECE])
        except OSError as exc:
            failed.append(exc)

    def receive(s: socket.socket, into: memoryview) -> None:
        for _ in range(repeats):
            got = 0
            while got < part:
                n = s.recv_into(into[got:], part - got)
                if n == 0:
                    failed.append(ConnectionError("the previous process closed its socket"))
                    return
                got += n

    began = time.perf_counter()
    threads = [threading.Thread(target=send, args=(s,)) for s in nxt]
    threads += [threading.Thread(target=receive, args=(s, b)) for s, b in zip(prev, inbox)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failed:  # a time measured over a broken ring would read as a ceiling
        raise SystemExit(f"process {rank} of the ring: {failed[0]}")
    out.put(time.perf_counter() - began)
    for s in nxt + prev + [listener]:
        s.close()


def together(target, n: int, args_of) -> list[float]:
    """Run ``target`` in ``n`` spawned processes at once; their elapsed times (a process that
    dies stops the run, rather than leave the others waiting for it at the barrier)."""
    ctx = mp.get_context("spawn")
    start, out = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args_of(i), start, out)) for i in range(n)]
    for p in procs:
        p.start()
    times: list[float] = []
    try:
        while len(times) < n:
            try:
                times.append(out.get(timeout=1))
            except queue.Empty:
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise SystemExit(f"a process of the {target.__name__} run exited with {dead[0]}") from None
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return times


def main() -> None:
    from macfleet.knobs import parse_size
    from macfleet.shm import default_slot_bytes, shared_cache_bytes

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nprocs", default="2,4,8")
    parser.add_argument("--sizes", default="16M,64M,256M")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    try:
        worlds = [int(x) for x in args.nprocs.split(",")]
    except ValueError:
        parser.error(f"--nprocs {args.nprocs}: not numbers of processes like 2,4,8")
    try:
        sizes = [(text, parse_size(text)) for text in args.sizes.split(",")]
    except ValueError:
        parser.error(f"--sizes {args.sizes}: not sizes like 16M,64M,256M")
    if min(worlds) < 2:
        parser.error(f"--nprocs {args.nprocs}: an all-reduce needs at least 2 processes")
    if min(nbytes for _, nbytes in sizes) < 1 << 20:
        parser.error(f"--sizes {args.sizes}: bounds are for sizes of 1M and more")
    cores = os.cpu_count() or 1
    rows = []
    print(f"roofline on {cores} cores (copy GB/s: read and written, all ranks; ceilings: bus bandwidth, GB/s)")
    print(f"{'N':>2} {'threads':>7} {'slot':>5} {'size':>5} {'copy ms':>8} {'copy GB/s':>9} {'shm ceiling':>11} "
          f"{'with slots':>10} {'tcp ceiling':>11}")
    for n in worlds:
        threads = max(1, cores // n)
        os.environ.update(OMP_NUM_THREADS=str(threads), OMP_WAIT_POLICY="PASSIVE")
        slot = default_slot_bytes(n, shared_cache_bytes(), cores)
        slot_repeats = max(10, (1 << 30) // slot)
        slot_s = max(together(copier, n, lambda i: (slot, slot_repeats))) / slot_repeats
        for text, nbytes in sizes:
            repeats = max(3, (1 << 30) // nbytes)  # about a GiB a rank
            copy_s = max(together(copier, n, lambda i: (nbytes, repeats))) / repeats
            ports = mp.get_context("spawn").Array("i", n)
            tcp_s = max(together(ringer, n, lambda i: (i, n, ports, threads, nbytes, repeats))) / repeats
            passes_s = copy_s + (3 - 2 / n) / 2 * nbytes / slot * slot_s
            busbw = 2 * (n - 1) / n * nbytes / 1e9  # GB that a bus bandwidth counts in one all-reduce
            row = {"world": n, "threads": threads, "bytes": nbytes, "slot_bytes": slot, "copy_s": copy_s,
                   "slot_copy_s": slot_s, "copy_gbs": n * 2 * nbytes / copy_s / 1e9,
                   "shm_ceiling_busbw_gbs": busbw / copy_s, "shm_with_slots_busbw_gbs": busbw / passes_s,
                   "tcp_ceiling_busbw_gbs": nbytes / tcp_s / 1e9}
            rows.append(row)
            print(f"{n:>2} {threads:>7} {slot >> 20:>4}M {text:>5} {copy_s * 1e3:>8.2f} {row['copy_gbs']:>9.1f} "
                  f"{row['shm_ceiling_busbw_gbs']:>11.2f} {row['shm_with_slots_busbw_gbs']:>10.2f} "
                  f"{row['tcp_ceiling_busbw_gbs']:>11.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    sys.exit(main())
