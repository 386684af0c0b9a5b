"""Copies of a DataParallel, as scripts make them: ``copies.py OUT``.

After one step every rank makes ``AveragedModel(model)`` (an EMA of the weights, which
deep-copies the DataParallel) and ``copy.deepcopy(model)`` (a student trained beside the model,
as a DataParallel of its own; copied inside the model's ``no_sync()`` block); rank 0 alone
deep-copies a snapshot and evaluates it, and pickles the whole model with ``torch.save(model)``.
Then every rank trains the model and the student for ``STEPS`` steps, updating the EMA. Rank 0
saves what each ended with to ``OUT/copies.pt`` (the pickle: ``OUT/whole.pt``); the test trains
the same in one process on the whole batch."""

import copy
import sys

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel

import macfleet

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import oracle  # noqa: E402

STEPS = 3


def step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()


def main() -> None:
    out = sys.argv[1]
    macfleet.init()
    rank, world = macfleet.rank(), macfleet.world_size()
    model = macfleet.DataParallel(oracle.make_model())
    optimizer = oracle.make_optimizer(model)
    x, y = oracle.make_batch()
    shard = slice(rank * oracle.BATCH // world, (rank + 1) * oracle.BATCH // world)
    step(model, optimizer, x[shard], y[shard])
    ema = AveragedModel(model)
    with model.no_sync():  # the block is the model's: the copy averages
        student = copy.deepcopy(model)
    student_optimizer = oracle.make_optimizer(student)
    if rank == 0:  # alone: a copy needs no other rank until its first training forward
        snapshot = copy.deepcopy(model).eval()
        with torch.no_grad():
            assert torch.equal(snapshot(x), model.module(x))
        torch.save(model, f"{out}/whole.pt")
    for _ in range(STEPS):
        step(model, optimizer, x[shard], y[shard])
        ema.update_parameters(model)
        step(student, student_optimizer, x[shard], y[shard])
    if rank == 0:
        torch.save({"model": model.module.state_dict(), "ema": ema.module.module.state_dict(),
                    "student": student.module.state_dict(), "snapshot": snapshot.module.state_dict()},
                   f"{out}/copies.pt")
    macfleet.shutdown()


if __name__ == "__main__":
    main()
