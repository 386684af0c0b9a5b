"""Training data that every rank reads whole: a ``DataLoader`` with no ``DistributedSampler``.

A script ported from one process keeps its ``DataLoader(dataset, shuffle=True)``, wraps its
model in ``macfleet.DataParallel``, and trains without an error: every rank then goes through
the whole dataset each epoch (in an order of its own; with ``shuffle=False``, the same batches
as every other rank), so an epoch takes as long as it did on one process, and two Macs look no
faster than one. torch's DDP says nothing of it (Lightning swaps in a distributed sampler by
itself). At its first training steps, rank 0's DataParallel looks at the data loaders being
iterated (a ``for`` loop's iterator is alive while its body runs) and warns once if every one
of them reads a whole dataset. What it lets be (an iterable dataset, a rank's own files) the
launcher judges by the ranks' inputs (``macfleet.batches``).
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

from torch.utils.data import DataLoader, RandomSampler, SequentialSampler, Subset, TensorDataset
from torch.utils.data import dataloader as _dataloader

from macfleet.history import warn_at_script

# Training forwards to look at before giving up: a script may run one before its loop (a
# warm-up on a dummy batch, torch.compile's first call), when no loader is being iterated yet.
# A look walks every object the garbage collector tracks: 40 ms in a process that has just
# imported torch, and about 130 ms more for each million objects of the script's (on a 2-core
# machine), so it stops as soon as a loader is being iterated, or where none was ever made.
LOOKS = 3


@dataclass(frozen=True)
class Look:
    iterated: bool  # a DataLoader is being iterated
    made: bool  # a DataLoader exists at all
    whole: object | None  # the sampler of one that reads a whole dataset, where none shards


class WholeDatasetCheck:
    """Rank 0's look, at most ``LOOKS`` times, until a loader is being iterated."""

    def __init__(self) -> None:
        self.looks_left = LOOKS
        self.warned = False  # the launcher's same-batches check then says nothing more of it

    def __call__(self, world_size: int) -> None:
        if self.looks_left <= 0:
            return
        self.looks_left -= 1
        look = look_at_loaders(world_size)
        if look.iterated or not look.made:
            self.looks_left = 0
        if look.whole is not None:
            self.warned = True
            warn_at_script(advice(look.whole, world_size))


CHECK = WholeDatasetCheck()


def look_at_loaders(world_size: int) -> Look:
    """The data loaders of this process, and the samplers of those being iterated. A sampler
    with ``num_replicas`` and ``rank`` shards (macfleet's, torch's, most others'); torch's
    ``RandomSampler`` and ``SequentialSampler`` read the whole dataset, unless that dataset is a
    shard made by hand (``_a_shard``). Any other sampler, and an iterable dataset, may do either:
    it is let be."""
    iterator_types = _subclasses(_dataloader._BaseDataLoaderIter)
    loader_types = _subclasses(DataLoader)
    # type() rather than isinstance: isinstance asks some objects for __class__, which a few of
    # torch's deprecated module attributes answer with a warning
    found = [obj for obj in gc.get_objects() if type(obj) in iterator_types or type(obj) in loader_types]
    iterators = [obj for obj in found if type(obj) in iterator_types]
    whole = None
    for iterator in iterators:
        index_sampler = getattr(iterator, "_index_sampler", None)
        sampler = getattr(index_sampler, "sampler", index_sampler)  # a BatchSampler's, or itself
        if hasattr(sampler, "num_replicas") and hasattr(sampler, "rank"):
            return Look(True, True, None)
        if type(sampler) in (RandomSampler, SequentialSampler) and \
                not _a_shard(getattr(sampler, "data_source", None), world_size):
            whole = sampler
    return Look(bool(iterators), bool(found), whole)


def _a_shard(dataset: object, world_size: int) -> bool:
    """One rank's part, cut by hand: a ``Subset`` of at most a rank's share of its base (a
    ``random_split``'s training part is most of its base, and reads it whole), or a
    ``TensorDataset`` of views that hold at most a rank's share of their tensors' memory
    (``TensorDataset(x[rank::world], y[rank::world])``, or a slice). A part copied out of its
    base (``.clone()``) or read from the rank's own files looks whole, and is warned of."""
    if isinstance(dataset, TensorDataset) and dataset.tensors and dataset.tensors[0].dim() > 0:
        part = dataset.tensors[0]
        row = part[0].numel() * part.element_size() if len(part) else 0
        return len(part) * row * world_size <= part.untyped_storage().nbytes() + world_size * row
    if not isinstance(dataset, Subset):
        return False
    try:
        return len(dataset) * world_size <= len(dataset.dataset) + world_size  # type: ignore[arg-type]
    except TypeError:  # a base without a length
        return True


def advice(sampler: object, world_size: int) -> str:
    try:
        size = f" ({len(sampler):,} samples)"  # type: ignore[arg-type]
    except TypeError:
        size = ""
    if isinstance(sampler, RandomSampler):
        how, fix = "each in its own order", "sampler=macfleet.DistributedSampler(dataset) in place of shuffle=True"
    else:
        how = "each the same batches in the same order, so every rank's gradients are the same"
        fix = "sampler=macfleet.DistributedSampler(dataset, shuffle=False)"
    every = "both ranks" if world_size == 2 else f"all {world_size} ranks"  # two Macs: the usual cluster
    return (f"rank 0 trains from a DataLoader whose {type(sampler).__name__} reads the whole dataset{size}, "
            f"and no DistributedSampler splits it among the ranks: unless each rank's dataset holds only its "
            f"own part, {every} go through all of it every epoch ({how}), so an epoch takes as "
            f"long as on one process. Give the DataLoader {fix}, and call sampler.set_epoch(epoch) as each "
            f"epoch begins")


def _subclasses(cls: type) -> set[type]:
    found = {cls}
    for sub in cls.__subclasses__():
        found |= _subclasses(sub)
    return found
