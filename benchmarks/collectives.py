"""Broadcast and all-gather: macfleet against torch.distributed (gloo), side by side.

    python benchmarks/collectives.py [--nprocs 2,4,8] [--sizes 256,4K,64K,1M,16M] [--budget 0.5]
                                     [--json FILE] [--launch "--hosts mac1:2,mac2:2 ..."]

DataParallel broadcasts the model's buffers at every training forward and SyncBatchNorm
all-gathers each layer's statistics at every forward: small collectives whose latency adds to
every step. For each N one job (``macfleet launch --nproc N`` this file) times macfleet's and
gloo's broadcast (from the last rank, so no rank is both the source and the ring's first) and
all-gather on the same processes and tensors, taking turns as ``macfleet bench allreduce`` does
(``timed``), and checks every result of both against the exact one. Reported: the slowest
rank's median time per call and the ratio. Set ``MACFLEET_SHM=0`` for macfleet over sockets only.
``--launch`` runs one job with these ``macfleet launch`` options instead of one per N (across
Macs: ``--hosts`` and the ssh options).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path


def rank_main(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    import macfleet
    from macfleet.knobs import parse_size
    from macfleet.workers.benchallreduce import timed

    macfleet.init(device="cpu")
    rank, world = macfleet.rank(), macfleet.world_size()
    dist.init_process_group("gloo", rank=rank, world_size=world)
    src = world - 1
    rows = []
    for text in args.sizes.split(","):
        numel = max(1, parse_size(text) // 4)
        mine = torch.arange(numel, dtype=torch.float32) + rank * numel  # every rank's differs
        everyone = torch.arange(world * numel, dtype=torch.float32).view(world, numel)
        gathered = torch.empty(world, numel)
        kinds = {
            "broadcast": ([lambda t: macfleet.broadcast(t, src), lambda t: dist.broadcast(t, src)], everyone[src]),
            "all_gather": ([lambda t: gathered.copy_(macfleet.all_gather(t)),
                            lambda t: dist.all_gather(list(gathered), t)], everyone),
        }
        for kind, (fns, want) in kinds.items():
            for library, fn in zip(("macfleet", "gloo"), fns):
                t = mine.clone()
                fn(t)
                got = t if kind == "broadcast" else gathered
                if not torch.equal(got, want):
                    raise SystemExit(f"{library} {kind} of {text} gave a wrong result")
            results = timed(fns, mine.clone(), args.budget)  # a broadcast's source sends the same each call
            rows += [{"collective": kind, "world": world, "bytes": numel * 4, "library": library, "seconds": s,
                      "calls": calls} for library, (s, calls) in zip(("macfleet", "gloo"), results)]
    if rank == 0 and args.out:
        Path(args.out).write_text(json.dumps(rows))
    dist.destroy_process_group()
    macfleet.shutdown()


def orchestrate(args: argparse.Namespace) -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        layouts = [shlex.split(args.launch)] if args.launch else [["--nproc", n] for n in args.nprocs.split(",")]
        for k, layout in enumerate(layouts):
            out = Path(tmp) / f"{k}.json"
            subprocess.run([sys.executable, "-m", "macfleet.launcher.cli", "launch", *layout, "--device", "cpu",
                            os.path.abspath(__file__), "--rank-mode", "--out", str(out), "--sizes", args.sizes,
                            "--budget", str(args.budget)], check=True)
            rows += json.loads(out.read_text())
    path = "sockets only" if os.environ.get("MACFLEET_SHM") == "0" else "shared memory on"
    print(f"broadcast and all-gather, float32, macfleet ({path}) against gloo (slowest rank's median per call)")
    print(f"{'collective':<11} {'N':>2} {'bytes':>9} {'macfleet ms':>12} {'gloo ms':>9} {'speed-up':>9}")
    for ours, theirs in zip(rows[::2], rows[1::2]):
        print(f"{ours['collective']:<11} {ours['world']:>2} {ours['bytes']:>9} {ours['seconds'] * 1e3:>12.3f} "
              f"{theirs['seconds'] * 1e3:>9.3f} {theirs['seconds'] / ours['seconds']:>8.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nprocs", default="2,4,8")
    parser.add_argument("--sizes", default="256,4K,64K,1M,16M")
    parser.add_argument("--budget", type=float, default=0.5, help="seconds of timing per size, collective and library")
    parser.add_argument("--json", default=None)
    parser.add_argument("--launch", default="", help="macfleet launch options for one job instead of --nprocs")
    parser.add_argument("--rank-mode", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    rank_main(args) if args.rank_mode else orchestrate(args)


if __name__ == "__main__":
    main()
