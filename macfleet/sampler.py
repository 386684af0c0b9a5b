"""A sampler that gives each rank its own shard of a dataset, reshuffled identically per epoch."""

from __future__ import annotations

import array
import collections
import hashlib
import math
import operator
from typing import Any, Iterator, Sequence, Sized

import torch
from torch.utils.data import Sampler, Subset

from macfleet.history import call_site, warn_at_script, where

# this process's samplers of the job made at each line: a sampler is known across ranks by its
# line and its number there (a script may make one on some ranks only, or one anew each epoch)
_made_at: collections.Counter[str] = collections.Counter()


class DistributedSampler(Sampler[int]):
    """Like ``torch.utils.data.DistributedSampler``, without needing torch.distributed.

    Every rank draws the same permutation (seeded with ``seed + epoch``) and takes every
    ``world_size``-th index from its rank on. The shard is padded with the permutation's first
    indices so every rank runs the same number of steps (``drop_last`` drops the tail instead):
    unequal step counts would leave one rank waiting in a collective the others never start.
    ``state_dict`` records the epoch and how far the shard has been consumed, so a restarted job
    resumes mid-epoch: after ``load_state_dict``, the usual ``set_epoch(epoch)`` at the top of
    the saved epoch starts where the checkpoint left off (once; later epochs start at 0).

    ``shares`` (whole numbers, one per rank, the same list on every rank) give faster Macs more
    of the data: of every ``sum(shares)`` indices, rank r takes ``shares[r]``. With a batch
    size of ``b * shares[r]`` on each rank, every rank still runs the same number of steps;
    pass the same ``shares`` to ``DataParallel`` so that gradients are weighted to match.

    Every rank must shard the same dataset: each takes its part of a shuffle of its own
    dataset's indices, so datasets of different lengths (an incomplete copy on one Mac) make
    parts that overlap and miss samples. A sampler of the job's ranks (``num_replicas`` and
    ``rank`` not given) tells the launcher its dataset's length, which samples of its base a
    ``Subset`` holds (a ``random_split``'s part) and its options, and the launcher warns when
    the ranks' differ. An epoch's order taken twice without ``set_epoch`` in between (a loop that
    never calls it, so every epoch is shuffled alike) is warned of, once, by rank 0's sampler.
    """

    def __init__(self, dataset: Sized | int, num_replicas: int | None = None, rank: int | None = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False,
                 shares: Sequence[int] | None = None) -> None:
        from_job = num_replicas is None and rank is None
        if num_replicas is None or rank is None:
            from macfleet import runtime  # only when not given: a plain script needs no job

            rt = runtime.runtime()
            num_replicas = rt.world_size if num_replicas is None else num_replicas
            rank = rt.rank if rank is None else rank
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is outside num_replicas {num_replicas}")
        given = [1] * num_replicas if shares is None else list(shares)
        try:
            shares = [operator.index(s) for s in given]
        except TypeError:
            shares = []  # a fraction, say: refused below
        if len(shares) != num_replicas or min(shares) < 1:
            raise ValueError(f"shares must be {num_replicas} whole numbers above 0 (one per rank), not {given}")
        self.parts = sum(shares)  # the indices of every round of the permutation
        self.mine = range(sum(shares[:rank]), sum(shares[:rank + 1]))  # this rank's places in a round
        self.length = dataset if isinstance(dataset, int) else len(dataset)
        self.num_replicas, self.rank = num_replicas, rank
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        if from_job and num_replicas > 1:
            order = {"seed": str(operator.index(seed)) if hasattr(seed, "__index__") else str(seed),
                     "shuffle": str(bool(shuffle)), "drop_last": str(bool(drop_last)), "shares": str(shares)}
            site = where(*call_site())
            _made_at[site] += 1
            runtime.note_dataset(site, _made_at[site], self.length, subset_digest(dataset), order)
        self.epoch = 0
        self.start = 0  # samples of this epoch's shard already consumed (for resume)
        self._resume: tuple[int, int] | None = None  # (epoch, start) from load_state_dict, for set_epoch
        self._taken = False  # whether this epoch's order was taken since set_epoch (or the start)
        self._warned = False
        self.rounds = self.length // self.parts if drop_last else math.ceil(self.length / self.parts)
        self.num_samples = self.rounds * len(self.mine)

    def __iter__(self) -> Iterator[int]:
        if self.shuffle and self._taken and self.rank == 0 and not self._warned:
            # torch's sampler has the same trap, silently; said once, by one rank
            self._warned = True
            warn_at_script(f"DistributedSampler: the order of epoch {self.epoch} was taken again without "
                           f"set_epoch(), so every epoch gets the same shuffle; call sampler.set_epoch(epoch) at "
                           f"the start of each epoch, as with torch's")
        self._taken = True
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.length, generator=g, device="cpu").tolist()
        else:
            order = list(range(self.length))
        total = self.rounds * self.parts
        if total > len(order):
            order += (order * math.ceil(total / max(1, len(order))))[: total - len(order)]
        # this rank's places of every round, round after round (one place: a plain slice)
        places = [order[place:total:self.parts] for place in self.mine]
        shard = places[0] if len(places) == 1 else [i for one_round in zip(*places, strict=True) for i in one_round]
        return iter(shard[self.start:])

    def __len__(self) -> int:
        return self.num_samples - self.start

    def set_epoch(self, epoch: int, start: int | None = None) -> None:
        """Call at the start of every epoch, with the same value on every rank. ``start``: how
        many samples of this rank's shard to skip (default: those a loaded checkpoint had
        consumed, if it was saved in this epoch; else none)."""
        resume, self._resume = self._resume, None
        self._taken = False
        if start is None:
            start = resume[1] if resume is not None and resume[0] == epoch else 0
        self.epoch, self.start = epoch, start

    def state_dict(self, consumed: int = 0) -> dict[str, Any]:
        """Where this rank is in the epoch; with the layout of a round (``parts`` indices, this
        rank's ``places`` of them), so a job of another size can find the same place."""
        return {"epoch": self.epoch, "start": self.start + consumed, "seed": self.seed,
                "parts": self.parts, "places": len(self.mine)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume where ``state`` left off. Saved by a job of another size (or other shares),
        the place is converted: the rounds it had consumed are so many indices of the epoch's
        permutation, and this sampler skips as many of its own rounds as they fill (rounded
        down: at most a round's worth of samples is seen twice, none is skipped)."""
        self.epoch, self.start, self.seed = int(state["epoch"]), int(state["start"]), int(state["seed"])
        parts, places = int(state.get("parts", self.parts)), int(state.get("places", len(self.mine)))
        if (parts, places) != (self.parts, len(self.mine)):
            rounds = min((self.start // places) * parts // self.parts, self.rounds)  # a whole epoch: its end
            self.start = rounds * len(self.mine)
        self._resume = (self.epoch, self.start)


def subset_digest(dataset: object) -> str | None:
    """Which samples of its base a ``Subset`` (a ``random_split``'s part) holds, down a chain of
    them, as a digest; None for any other dataset. Ranks that split with their own generators
    (macfleet seeds rank r's with seed + r) hold different parts, of the same length."""
    digest = None
    while isinstance(dataset, Subset):
        indices = dataset.indices
        values = indices.tolist() if isinstance(indices, torch.Tensor) else indices
        digest = digest or hashlib.sha256()
        try:
            digest.update(array.array("q", values).tobytes() + b"/")
        except (TypeError, ValueError, OverflowError):  # indices of a kind of their own: not compared
            return None
        dataset = dataset.dataset
    return None if digest is None else digest.hexdigest()[:16]
