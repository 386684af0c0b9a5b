"""Train a fixed model for K steps on shards of one fixed batch; rank 0 saves the parameters.

``oracle.py STEPS OUT``. Shared with the test, which trains the same model on the whole batch
in one process: both must end with the same parameters.
"""

import sys

import torch
from torch import nn

import macfleet

BATCH = 24


def make_model():
    torch.manual_seed(1234)
    return nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 3))


def make_batch():
    g = torch.Generator().manual_seed(99)
    return torch.randn(BATCH, 10, generator=g), torch.randint(0, 3, (BATCH,), generator=g)


class MomentumSGD:
    """``torch.optim.SGD(lr=0.1, momentum=0.9)``'s update (``momentum=0``: plain SGD), written
    out: torch's first optimizer imports torch._dynamo, about 2 s of each rank's start on a
    2-core machine, and the suite starts these ranks by the dozen. Every comparison uses it on
    both sides; the scripts that test what DataParallel does with an optimizer (join's state,
    checkpoints, the DDP port, the example) keep torch's."""

    def __init__(self, params, lr: float = 0.1, momentum: float = 0.9) -> None:
        self.params, self.lr, self.momentum = list(params), lr, momentum
        self.buffers: dict[torch.Tensor, torch.Tensor] = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        for p in self.params:
            if p.grad is None:
                continue
            if not self.momentum:
                buffer = p.grad
            elif p not in self.buffers:
                buffer = self.buffers[p] = p.grad.clone()
            else:
                buffer = self.buffers[p].mul_(self.momentum).add_(p.grad)
            p.add_(buffer, alpha=-self.lr)


def make_optimizer(model):
    return MomentumSGD(model.parameters())


def main():
    steps, out = int(sys.argv[1]), sys.argv[2]
    macfleet.init()
    rank, world = macfleet.rank(), macfleet.world_size()
    model = macfleet.DataParallel(make_model())
    optimizer = make_optimizer(model)
    x, y = make_batch()
    shard = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
    for _ in range(steps):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x[shard]), y[shard]).backward()
        optimizer.step()
    if rank == 0:
        torch.save(model.module.state_dict(), out)
    macfleet.shutdown()


if __name__ == "__main__":
    main()
