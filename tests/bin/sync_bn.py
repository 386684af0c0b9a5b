"""One training step of an ``nn.SyncBatchNorm`` (converted as for DDP) on batches of different
sizes and statistics, for each case of ``sync_bn.py OUT_DIR NAME=SIZES:DTYPE...`` (images per
rank, and float32 or float64), one after another in one job.
Each rank saves its input's gradient, its parameters' (averaged) gradients and its running
statistics to ``OUT_DIR/NAME-RANK.pt``; the test compares them with one ``nn.BatchNorm2d`` on
every rank's batch at once."""

import sys

import torch
from torch import nn

import macfleet


def make_norm(dtype: torch.dtype = torch.float32) -> nn.BatchNorm2d:
    torch.manual_seed(0)
    norm = nn.BatchNorm2d(3, dtype=dtype)
    with torch.no_grad():  # not the default 1 and 0, so a wrong use of either shows
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-1, 1)
    return norm


def batch(rank: int, images: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank r's images and the weights of its loss, each rank's drawn apart and shifted and
    scaled, so its statistics differ from the others'."""
    g = torch.Generator().manual_seed(10 + rank)
    x = torch.randn(images, 3, 4, 5, generator=g, dtype=dtype) * (rank + 1) + rank
    return x, torch.randn(x.shape, generator=g, dtype=dtype)


def main() -> None:
    macfleet.init()
    rank = macfleet.rank()
    for case in sys.argv[2:]:
        name, spec = case.split("=")
        images, dtype_name = spec.split(":")
        sizes, dtype = [int(n) for n in images.split(",")], getattr(torch, dtype_name)
        net = nn.SyncBatchNorm.convert_sync_batchnorm(nn.Sequential(make_norm(dtype)))
        model = macfleet.DataParallel(net)
        x, weights = batch(rank, sizes[rank], dtype)
        x.requires_grad_(True)
        (model(x) * weights).sum().backward()
        norm = net[0]
        torch.save({"x.grad": x.grad, "weight.grad": norm.weight.grad, "bias.grad": norm.bias.grad,
                    "running_mean": norm.running_mean, "running_var": norm.running_var},
                   f"{sys.argv[1]}/{name}-{rank}.pt")


if __name__ == "__main__":
    main()
