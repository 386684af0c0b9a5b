"""A GAN's training loop, its discriminator frozen while the generator trains through it:
``freeze_thaw.py STEPS``. Both models are DataParallels; every rank also trains copies of them
in one process on the whole batch (the oracle), and prints one JSON line: the largest
difference from the oracle, and whether the discriminator kept its buckets through the steps
(frozen whole, it has no gradient to average, and nothing to lay out anew)."""

import copy
import json
import sys

import torch
from torch import nn
from torch.nn.functional import softplus

import macfleet


def discriminator_steps(d, g, real, z, opt_d):
    opt_d.zero_grad()
    fake = g(z).detach()
    (softplus(-d(real)).mean() + softplus(d(fake)).mean()).backward()
    opt_d.step()


def generator_steps(d, g, z, opt_g):
    for p in d.parameters():
        p.requires_grad_(False)
    opt_g.zero_grad()
    softplus(-d(g(z))).mean().backward()
    opt_g.step()
    for p in d.parameters():
        p.requires_grad_(True)


def main() -> None:
    steps = int(sys.argv[1])
    macfleet.init()
    rank, world = macfleet.rank(), macfleet.world_size()
    torch.manual_seed(0)
    g_ref = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 4))
    d_ref = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 1))
    g, d = macfleet.DataParallel(copy.deepcopy(g_ref)), macfleet.DataParallel(copy.deepcopy(d_ref))
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (g, d, g_ref, d_ref)]
    buckets = d.buckets
    data = torch.Generator().manual_seed(1)
    for _ in range(steps):
        real, z = torch.randn(4 * world, 4, generator=data) + 2, torch.randn(4 * world, 4, generator=data)
        discriminator_steps(d, g, real[rank::world], z[rank::world], opts[1])
        generator_steps(d, g, z[rank::world], opts[0])
        discriminator_steps(d_ref, g_ref, real, z, opts[3])  # the mean over ranks' shards is the whole batch's
        generator_steps(d_ref, g_ref, z, opts[2])
    ours = [p for m in (g, d) for p in m.parameters()]
    theirs = [p for m in (g_ref, d_ref) for p in m.parameters()]
    diff = max((a - b).abs().max().item() for a, b in zip(ours, theirs, strict=True))
    print(json.dumps({"rank": rank, "max_diff": diff, "kept_buckets": d.buckets is buckets}), flush=True)


if __name__ == "__main__":
    main()
