"""``DataParallel.join()``: training on when ranks have different numbers of batches.

Without it, a rank that runs out of batches first leaves its loop while the others wait in
their next gradient average for it, and the job stops with a report naming that rank. Inside
``with model.join():`` (torch DDP's ``join()``, the same arguments) it stays in the block's
exit instead and shadows the others' steps: it takes part in the collectives their steps make
(the buffers' broadcast, each gradient bucket's average) with zero gradients, so every step
completes. The average is divided by the whole job, as DDP's is
(``divide_by_initial_world_size=False``: by the ranks still training). When every rank has
left its loop, each gets the parameters, buffers and (where ``optimizer`` is passed) optimizer
state of a rank that trained to the end, so that all start the next epoch equal.

Each training forward inside the block first makes one small all-reduce, a ``Round``: every
rank says whether it still trains, whether this step averages gradients (``no_sync`` skips
it) and whether its model changed; a rank past its last batch says no to all three. So every
rank knows, at the same collective, which ranks train, what their step will exchange, and
which of them the buffers come from (rank 0 may be the one that ran out). Where forward needs
none of that, the round runs on the bucket thread and forward goes on (``Join.agree``).

What a rank out of batches cannot shadow is refused, at the same round on every rank: a model
whose parameters changed after a rank joined (its buckets would differ), and SyncBatchNorm
(whose statistics need a batch from every rank); and, on each training rank, a second forward
before a backward (the shadow takes each round for a step of its own). Collectives the script
makes itself (a metric averaged each step) have no shadow either: the ranks then stand in
different collectives, which stops the job with that report.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Callable, Sequence

import torch
from torch import nn

from macfleet import runtime as rt
from macfleet.errors import ConfigError, UnevenInputs
from macfleet.objects import broadcast_bytes

if TYPE_CHECKING:
    from macfleet.parallel import DataParallel


@dataclass(frozen=True)
class Round:
    """What the ranks said at one training forward inside ``join()``."""

    training: tuple[int, ...]  # the ranks that still train, ascending
    syncing: int  # how many of them average gradients in this step
    changed: int  # how many have a model whose parameters changed since its buckets were laid out

    @property
    def source(self) -> int:
        """The rank buffers, and at the end the whole model, come from: rank 0 while it trains."""
        return self.training[0]


class Join:
    """The context manager ``DataParallel.join()`` returns."""

    def __init__(self, model: DataParallel, optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None,
                 divide_by_initial_world_size: bool, enable: bool, throw_on_early_termination: bool) -> None:
        self.model = model
        self.optimizers = [] if optimizer is None else \
            [optimizer] if isinstance(optimizer, torch.optim.Optimizer) else list(optimizer)
        self.divide_by_initial_world_size = divide_by_initial_world_size
        self.enable = enable and model.runtime.world_size > 1
        self.throw = throw_on_early_termination
        self.world = model.runtime.world_size
        self.last = tuple(range(self.world))  # who trained in the last round in which anyone did
        self._pending: Callable[[], None] | None = None  # waits for a round on the bucket thread

    def __enter__(self) -> Join:
        if not self.enable:
            return self
        if self.model._join is not None:
            raise ConfigError("join() blocks of one DataParallel do not nest")
        for name, m in self.model.module.named_modules():
            if isinstance(m, nn.SyncBatchNorm):
                raise ConfigError(
                    f"join() cannot shadow SyncBatchNorm {name!r}: its statistics need a batch from every rank. "
                    f"Give every rank the same number of batches (macfleet.DistributedSampler does)")
        self.model._join = self
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if not self.enable:
            return
        try:
            if kind is None:  # an exception leaves at once, as DDP's join: no rank waits for this one
                self._settle()
                with rt.standing_by():
                    self._shadow()
        finally:
            self.model._join = None
            self.model._weigh(1.0)

    def agree(self, syncing: bool, changed: bool) -> Round | None:
        """This training rank's round (its forward): who trains and what the step exchanges.

        A training rank needs the answer at once only to broadcast buffers from the right rank,
        to stop (``throw_on_early_termination``), to divide by the ranks still training, or when
        its model changed. Otherwise the round goes to the bucket thread, ahead of this step's
        buckets, and forward does not wait for it (None): a second meeting of all ranks in every
        step, besides the gradients', cost a small CNN 8-34% of its step on the device machine."""
        self._settle()
        model = self.model
        if model._step.forwards > 1:
            raise ConfigError(
                "inside join() each training forward must be followed by its backward: a rank out of batches "
                "shadows one forward and one backward per step, as with DDP's join(), and cannot tell a second "
                "forward from the next step. Run both inputs in one forward (torch.cat), or train without join()")
        if (changed or self.throw or not self.divide_by_initial_world_size
                or (model.broadcast_buffers and any(b.numel() for b in model._known_buffers))):
            return self._round(True, syncing, changed)
        self._pending = model._ahead_of_buckets(lambda: self._round(True, syncing, False))
        return None

    def _settle(self) -> None:
        """Wait for the round that went to the bucket thread, if one is under way."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending()

    def _round(self, training: bool, syncing: bool, changed: bool) -> Round:
        said = torch.zeros(self.world + 2, dtype=torch.float64, device="cpu")
        if training:
            said[self.model.runtime.rank] = 1
            said[-2], said[-1] = float(syncing), float(changed)
        with torch.no_grad(), rt.on_behalf_of("DataParallel (join)"):
            rt.all_reduce(said, "sum", name="join")
        counts = said.tolist()
        round_ = Round(tuple(r for r in range(self.world) if counts[r] > 0), int(counts[-2]), int(counts[-1]))
        if not round_.training:
            return round_
        self.last = round_.training
        if 0 < round_.syncing < len(round_.training):
            raise ConfigError(
                f"{round_.syncing} of the {len(round_.training)} training ranks average gradients in this step and "
                f"the others are in no_sync(): every rank must accumulate the same steps")
        gone = sorted(set(range(self.world)) - set(round_.training))
        if gone and self.throw:
            raise UnevenInputs(f"rank{'s' * (len(gone) > 1)} {', '.join(map(str, gone))} ran out of inputs "
                               f"(join(throw_on_early_termination=True) stops every rank here)")
        if gone and round_.changed:
            raise ConfigError(
                f"the model's parameters changed (frozen, unfrozen or added) inside join() after rank "
                f"{gone[0]} ran out of inputs, which cannot make the same change: change the model outside join()")
        if not self.divide_by_initial_world_size:  # the average over the ranks still training
            weights = self.model._weights
            self.model._weigh(sum(weights) / sum(weights[r] for r in round_.training))
        return round_

    def _shadow(self) -> None:
        """Take part in the other ranks' steps until every rank has left its loop."""
        while (round_ := self._round(False, False, False)).training:
            self.model._shadow_step(round_.source, round_.syncing > 0)
        if self.last != tuple(range(self.world)):  # some rank stopped before the end, with older parameters
            self._sync_final(self.last[0])

    def _sync_final(self, source: int) -> None:
        """Every rank gets the model, and the optimizers' state, of a rank that trained to the end."""
        model = self.model
        with torch.no_grad(), rt.on_behalf_of("DataParallel (join)"):
            model._broadcast_state(source)
            for optimizer in self.optimizers:
                blob = b""
                if model.runtime.rank == source:
                    buffer = io.BytesIO()
                    torch.save(optimizer.state_dict(), buffer)
                    blob = buffer.getvalue()
                data = broadcast_bytes(blob, source, name="optimizer state")
                if model.runtime.rank != source and data is not None:
                    # tensors and plain values only (an optimizer's state is no more): bytes off
                    # the network make nothing that runs code
                    optimizer.load_state_dict(torch.load(io.BytesIO(data), map_location="cpu", weights_only=True))
