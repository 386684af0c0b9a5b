"""``reshard.py MODE PATH [MODE PATH]``: a checkpoint written by a job of one size, loaded by another.

``save``: the model (seeded 1), an SGD step taken, and the sampler 7 samples into epoch 2 of
120. ``load``: a model seeded otherwise loads it; every rank prints one JSON line with what
it resumed: step, epoch, its sampler's first index and remaining length, and whether the
parameters are the saved ones. ``load A save B`` does both in one job, in that order (a
rank's start is mostly importing torch), so that one job reads one size's checkpoint and
writes its own. ``missing PATH``: a load from a file that is not there, whose error each rank prints.
"""

import json
import sys

import torch
from torch import nn

import macfleet


def make(seed):
    torch.manual_seed(seed)
    return nn.Linear(6, 3)


def new_sampler():
    return macfleet.DistributedSampler(120, shuffle=True, seed=5)


def save(path):
    sampler = new_sampler()
    model = make(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(2, 6)).sum().backward()
    opt.step()
    sampler.set_epoch(2)
    macfleet.checkpoint.save(path, model, opt, step=7, epoch=2, sampler=sampler, sampler_consumed=7)


def missing(path):
    """Load from a file rank 0 does not have: every rank names rank 0's reason (the others said
    only that rank 0 could not read it, and the first of them to fail was the root cause)."""
    try:
        macfleet.checkpoint.load(path, make(2))
    except macfleet.ConfigError as exc:
        print("MISSING", exc, flush=True)


def load(path):
    sampler = new_sampler()
    model = make(2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    resumed = macfleet.checkpoint.load(path, model, opt, sampler)
    sampler.set_epoch(resumed.epoch)
    saved = make(1)
    torch.optim.SGD(saved.parameters(), lr=0.1, momentum=0.9)
    saved(torch.ones(2, 6)).sum().backward()
    with torch.no_grad():
        for p in saved.parameters():
            p -= 0.1 * p.grad
    same = all(torch.allclose(a, b) for a, b in zip(model.parameters(), saved.parameters()))
    print(json.dumps({"rank": macfleet.rank(), "step": resumed.step, "epoch": resumed.epoch, "left": len(sampler),
                      "params": same, "momentum": bool(opt.state)}), flush=True)


macfleet.init()
for mode, path in zip(sys.argv[1::2], sys.argv[2::2], strict=True):
    {"save": save, "load": load, "missing": missing}[mode](path)
macfleet.shutdown()
