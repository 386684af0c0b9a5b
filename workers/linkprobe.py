"""The rank side of ``macfleet doctor``: measure this rank's ring link and report it.

Run as a job with one rank per host. Every rank measures the link to its clockwise
neighbour while the others do the same (as in a ring step, every link busy at once):
latency as the median time of small exchanges, bandwidth as a bulk transfer of
``--megabytes`` in 1 MiB frames. It reports the numbers and this host's device facts to the
launcher, which prints the table.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import macfleet
from macfleet.runtime import report, runtime


def exchange(nbytes: int, frame: int, rounds: int) -> list[float]:
    """Time ``rounds`` exchanges of ``nbytes`` with both neighbours on the clockwise channel."""
    collectives = runtime().collectives
    assert collectives is not None
    ch = collectives.rings[0].channels[0]  # one rank per host: the ring of all ranks, or of the hosts' leaders
    payload = bytearray(frame)
    times = []
    for _ in range(rounds):
        ch.begin(collectives.next_op())
        started = time.perf_counter()
        sent = 0
        trackers = []
        while sent < nbytes:
            n = min(frame, nbytes - sent)
            tracker = ch.send(memoryview(payload)[:n])
            if tracker is not None:
                trackers.append(tracker)
            ch.recv_header(n)
            ch.recv_frame()
            sent += n
        for tracker in trackers:
            tracker.wait()
        times.append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--megabytes", type=int, default=64)
    args = parser.parse_args()
    macfleet.init(device="cpu")
    facts = {
        "mps": bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()),
        "cuda": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "torch": torch.__version__,
    }
    if macfleet.world_size() > 1:
        exchange(64, 64, 20)  # warm up connections
        latency = statistics.median(exchange(64, 64, 200))
        macfleet.barrier()
        nbytes = args.megabytes << 20
        seconds = min(exchange(nbytes, 1 << 20, 3))
        facts.update(latency_us=latency * 1e6, gbit_s=nbytes * 8 / seconds / 1e9)
    report(facts)
    macfleet.barrier()
    macfleet.shutdown()


if __name__ == "__main__":
    main()
