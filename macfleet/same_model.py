"""Every rank must wrap the same model in DataParallel; where they do not, say which layer differs.

DataParallel starts every rank from rank 0's parameters and buffers, sent in one message per
dtype, and averages gradients in buckets laid out from the parameters that train. A model built
differently on one rank (a vocabulary or class count read from a file that differs between
Macs, a layer frozen on one rank alone) was found only as collectives of different sizes:
"rank 1 is in broadcast of 79 float32 ... while rank 0 is in broadcast of 72 float32", naming
no layer. As DDP does before its first broadcast, the ranks first compare what they wrap: one
all-gather of a digest, and only where the digests differ, the layouts themselves, so that
every rank raises the same error naming the first difference.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from macfleet import objects
from macfleet import runtime as rt
from macfleet.collectives import digest
from macfleet.errors import ConfigError


@dataclass(frozen=True)
class Entry:
    """One parameter or buffer of the wrapped model, as every rank must have it."""

    kind: str  # "parameter" or "buffer"
    name: str
    shape: tuple[int, ...]
    dtype: str
    trains: bool  # requires_grad; False for a buffer

    def __str__(self) -> str:
        return f"{self.kind} {self.name!r}"

    @property
    def shaped(self) -> str:
        return f"{list(self.shape)} {self.dtype}"


def layout(module: nn.Module) -> list[Entry]:
    """What must be alike on every rank: each parameter's and buffer's name, shape and dtype, in
    registration order, and which parameters train."""
    return [Entry("parameter", name, tuple(p.shape), _dtype(p), p.requires_grad)
            for name, p in module.named_parameters()] + \
        [Entry("buffer", name, tuple(b.shape), _dtype(b), False) for name, b in module.named_buffers()]


def check_same_model(module: nn.Module) -> None:
    """A collective: raises ``ConfigError`` on every rank if any rank's ``module`` differs from
    rank 0's in its layout."""
    mine = layout(module)
    mine_digest = torch.tensor([digest(mine)], dtype=torch.int64, device="cpu")
    digests = rt.all_gather(mine_digest, name="model layout").flatten().tolist()
    if len(set(digests)) > 1:  # every rank sees it, so every rank takes part in the gather below
        raise ConfigError(difference(objects.all_gather_object(mine)))


def difference(layouts: list[list[Entry]]) -> str:
    """The error for ranks whose layouts differ from rank 0's: which ranks, and the first
    difference of the first of them."""
    others = [r for r in range(1, len(layouts)) if layouts[r] != layouts[0]]
    if not others:
        raise ValueError("the layouts do not differ")
    r = others[0]
    ranks = f"rank {r}" if len(others) == 1 else f"ranks {', '.join(map(str, others))}"
    return (f"{ranks} wrap{'s' if len(others) == 1 else ''} a different model from rank 0's in DataParallel: "
            f"{_first_difference(layouts[0], layouts[r], r)}. Every rank must build the same model, with the "
            f"same layers training: DataParallel starts every rank from rank 0's parameters and buffers, and "
            f"averages gradients laid out alike on every rank")


def _first_difference(ours: list[Entry], theirs: list[Entry], r: int) -> str:
    """Parameters first, then buffers: a layer more on one rank is named as what it adds."""
    for kind in ("parameter", "buffer"):
        mine_all, other_all = [e for e in ours if e.kind == kind], [e for e in theirs if e.kind == kind]
        for mine, other in zip(mine_all, other_all):
            if mine == other:
                continue
            if (mine.name, mine.shape, mine.dtype) == (other.name, other.shape, other.dtype):
                trains, frozen = (r, 0) if other.trains else (0, r)  # the same parameter, training on one rank only
                return f"{mine} trains on rank {trains} and is frozen (requires_grad=False) on rank {frozen}"
            if mine.name == other.name:
                return f"{mine} is {other.shaped} on rank {r} and {mine.shaped} on rank 0"
            return f"rank {r} has {other} ({other.shaped}) where rank 0 has {mine} ({mine.shaped})"
        if len(mine_all) != len(other_all):
            more, fewer = (0, r) if len(mine_all) > len(other_all) else (r, 0)
            extra = (mine_all if more == 0 else other_all)[min(len(mine_all), len(other_all))]
            return (f"rank {more} has {max(len(mine_all), len(other_all))} {kind}s and rank {fewer} has "
                    f"{min(len(mine_all), len(other_all))}; the first one rank {fewer} lacks is {extra} "
                    f"({extra.shaped})")
    raise ValueError("the layouts do not differ")


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")
