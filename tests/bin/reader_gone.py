"""A rank for a launcher whose reader has gone: 1.5 s of all-reduces (long enough for the
launcher's last line, the pace line), then more than a pipe holds (64 KiB) written to the
stream named by argv[1], through the agent to the launcher's; then "finished" on the other."""

import sys
import time

import torch

import macfleet

flooded = sys.argv[1]
macfleet.init()
started = time.monotonic()
done = torch.zeros(1)
while not done.item():
    done.fill_(time.monotonic() - started > 1.5)
    macfleet.all_reduce(done, "max")  # every rank stops after the same one
for _ in range(200):
    print("x" * 1000, file=getattr(sys, flooded), flush=True)
print("finished", file=sys.stdout if flooded == "stderr" else sys.stderr, flush=True)
