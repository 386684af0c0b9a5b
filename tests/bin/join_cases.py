"""Ranks with different numbers of batches inside ``model.join()``: ``join_cases.py CASE[,CASE...] OUTDIR``.

Rank r trains on ``batches(r)`` batches (rank 0, the buffers' usual source, runs out first).
The model has a BatchNorm, so its buffers move, and the optimizer has momentum, so its state
does. The cases run one after another in the job, each with a model of its own. After each
block every rank saves its parameters, buffers and momentum to OUTDIR/CASE/rank{r}.pt (with
``training-thread``, OUTDIR/CASE/training-thread/rank{r}.pt); the test trains the same steps in
one process (``reference``) and compares.

Cases: ``even`` (every rank has the same batches: nothing to shadow), ``metric-even`` (the
same, as ``own-buffers`` below, and the script averages its loss between forward and backward,
while the round may still be on the bucket thread), ``uneven`` (rank 1's
steps after rank 0's last take 0.5 s longer each, work that rank 0 stands by for; every rank
saves how long it stood by and how long it waited),
``accumulate`` (each step is two micro-batches, the first under ``no_sync()``),
``own-buffers`` (the same with ``broadcast_buffers=False`` and one bucket per module: forward
leaves the round to the bucket thread and does not wait for it),
``divide-by-training`` (``divide_by_initial_world_size=False``), ``fp16`` (wire compression),
``throw`` (``throw_on_early_termination=True``: every rank stops at rank 0's last batch; the
rank saves the step it stopped at), ``metric`` (the script averages its loss each step, a
collective a rank out of batches cannot shadow), ``sync-bn`` (a SyncBatchNorm in the model),
``no-sync-differs`` (rank 1 alone takes its first step under ``no_sync()``), ``two-forwards``
(two forwards before each backward, as a siamese loss makes: more than a rank out of batches
can shadow).

The model trains on ``macfleet.device()`` (CUDA on the device machine, under ``--device
cuda``); a third argument ``training-thread`` makes every device copy from the thread that
runs backward, as on MPS.
"""

import os
import sys
import time

import torch
from torch import nn

import macfleet
from macfleet.runtime import runtime

import oracle  # tests/bin: its written-out SGD

STEPS = {0: 2, 1: 5, 2: 3}  # batches per rank; JOIN_STEPS=N0,N1,... gives other counts, for any world size
BATCH = 8
SLOW_STEP_S = 0.5


def batches(case, rank):
    if case in ("even", "metric-even"):
        return 4
    given = os.environ.get("JOIN_STEPS")
    return int(given.split(",")[rank]) if given else STEPS[rank]


def make_model(case="uneven"):
    torch.manual_seed(4321)
    norm = nn.SyncBatchNorm(16) if case == "sync-bn" else nn.BatchNorm1d(16)
    return nn.Sequential(nn.Linear(10, 16), norm, nn.Tanh(), nn.Linear(16, 3))


# The cases that end in join()'s error, before any state is saved. They take no optimizer into
# join(), and a written-out SGD: torch's first optimizer imports torch._dynamo, which costs each
# rank's start as much as importing torch (four jobs of three ranks in the suite).
REFUSED = ("metric", "sync-bn", "no-sync-differs", "two-forwards")


def make_optimizer(model, case="uneven"):
    """torch's SGD with momentum, whose state join() must carry over (oracle's for a refused case)."""
    if case in REFUSED:
        return oracle.MomentumSGD(model.parameters())
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(BATCH, 10, generator=g), torch.randint(0, 3, (BATCH,), generator=g)


def train_step(case, model, x, y):
    if case in ("accumulate", "own-buffers"):
        with model.no_sync():
            (nn.functional.cross_entropy(model(x[:4]), y[:4]) / 2).backward()
        (nn.functional.cross_entropy(model(x[4:]), y[4:]) / 2).backward()
        return
    if case == "no-sync-differs" and macfleet.rank() == 1:
        with model.no_sync():
            nn.functional.cross_entropy(model(x), y).backward()
        return
    if case == "two-forwards":
        (nn.functional.cross_entropy(model(x), y) + nn.functional.cross_entropy(model(-x), y)).backward()
        return
    loss = nn.functional.cross_entropy(model(x), y)
    if case.startswith("metric"):
        macfleet.all_reduce(loss.detach().clone(), "avg", name="loss")
    loss.backward()


def main():
    cases, out = sys.argv[1].split(","), sys.argv[2]
    macfleet.init()
    if sys.argv[3:] == ["training-thread"]:
        runtime().device.copies_from_training_thread = True
    for case in cases:
        run(case, os.path.join(out, case, *sys.argv[3:]))
    macfleet.shutdown()


def run(case, out):
    rank, device = macfleet.rank(), macfleet.device()
    collectives = runtime().collectives
    stood_by, waited = collectives.stood_by_s, collectives.waited_s  # the earlier cases'
    wrap = {"compression": "fp16"} if case == "fp16" else \
        {"broadcast_buffers": False, "bucket_cap_mb": 1e-4, "first_bucket_mb": 1e-4} \
        if case in ("own-buffers", "metric-even") else {}
    model = macfleet.DataParallel(make_model(case).to(device), **wrap)
    optimizer = make_optimizer(model, case)
    options = {} if case in REFUSED else {"optimizer": optimizer}
    if case == "divide-by-training":
        options["divide_by_initial_world_size"] = False
    if case == "throw":
        options["throw_on_early_termination"] = True
    steps = 0
    try:
        with model.join(**options):
            for step in range(batches(case, rank)):
                optimizer.zero_grad()
                if case == "uneven" and rank == 1 and step >= batches(case, 0):
                    time.sleep(SLOW_STEP_S)  # a longer step's work, which rank 0 stands by for
                train_step(case, model, *(t.to(device) for t in batch(rank, step)))
                optimizer.step()
                steps += 1
    except macfleet.UnevenInputs as exc:
        print(f"rank {rank} stopped after {steps} steps: {exc}", flush=True)
    state = {"model": {k: v.cpu() for k, v in model.module.state_dict().items()},
             # none where no step was taken (a rank out of batches at the start stops every rank at once)
             "momentum": [optimizer.state[p].get("momentum_buffer", torch.zeros_like(p)).cpu()
                          for p in model.module.parameters()],
             "steps": steps, "stood_by_s": collectives.stood_by_s - stood_by, "waited_s": collectives.waited_s - waited}
    os.makedirs(out, exist_ok=True)
    torch.save(state, f"{out}/rank{rank}.pt")


if __name__ == "__main__":
    main()
