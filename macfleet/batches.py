"""Ranks that train on the same batches, whatever their data comes from.

The loaders check (``macfleet.loaders``) sees one mistake in the script: a DataLoader that
reads a whole map-style dataset. Others it cannot see, and each leaves ranks training on the
same samples with nothing to show for it:
- an ``IterableDataset`` (webdataset, a streamed Hugging Face dataset) that does not split
  itself among the ranks: every rank streams all of it;
- a part cut by ``macfleet.local_rank()`` where ``macfleet.rank()`` was meant: on two Macs,
  rank 0 and rank 2 read the same part;
- a part a rank reads from its own files, or copies out of the whole, that is the same part on
  every rank.
What all of these show is the inputs themselves. At each of its first ``FORWARDS`` training
forwards, a rank's DataParallel sends the launcher a digest of the inputs (``inputs_digest``),
and the launcher names the ranks whose inputs were the same (``launcher.agreement.same_batches``).
Through the launcher rather than a collective: the notes cost the training loop no wait, and
a rank out of batches inside ``join()``, which makes no forward, only leaves the check unsaid.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import fields, is_dataclass
from typing import Any, Iterator

import torch

from macfleet import protocol
from macfleet import runtime as rt
from macfleet.collectives import host_memory

# training forwards noted (3): past a warm-up on a dummy batch, which is alike on every rank
FORWARDS = protocol.BATCH_FORWARDS
HEAD_BYTES = 1 << 16  # read of each tensor: its first rows, the batch's first samples (``_head``)
MOST_TENSORS = 8


class BatchNotes:
    """This process's notes of its first training forwards, whichever DataParallel made them."""

    def __init__(self) -> None:
        self.noted = 0

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any], told: bool) -> None:
        """Note the inputs of one training forward, while fewer than ``FORWARDS`` are noted.
        ``told``: rank 0 has warned of a loader that reads a whole dataset, the same mistake."""
        if self.noted >= FORWARDS:
            return
        self.noted += 1
        rt.note_batch(self.noted, inputs_digest(args, kwargs), told)


NOTES = BatchNotes()


def inputs_digest(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """A digest of a forward's tensors (in tuples, lists, dicts and dataclasses, as DDP finds
    them): of their shapes and dtypes, and of their first rows, which hold the batch's first
    samples and so differ between ranks that read different data. None where the inputs hold
    no tensor this can read."""
    digest = hashlib.blake2b(digest_size=12)
    found = False
    for tensor in itertools.islice(tensors_in((args, kwargs)), MOST_TENSORS):
        head = _head(tensor)
        if head is None:
            continue
        digest.update(repr((tuple(tensor.shape), str(tensor.dtype))).encode())
        if head.numel():
            digest.update(host_memory(head))
        found = True
    return digest.hexdigest() if found else None


def _head(tensor: torch.Tensor) -> torch.Tensor | None:
    """The tensor's first ``HEAD_BYTES`` (its first rows, or the start of the first where a row
    is larger: a video clip's), flat and contiguous in host memory; None for one whose memory
    cannot be read so (sparse, nested, meta, a subclass's)."""
    if tensor.layout != torch.strided or tensor.is_meta or type(tensor) is not torch.Tensor:
        return None
    head = tensor.detach()
    if head.dim() > 0 and head.shape[0] > 1:
        row = max(1, head[0].numel() * head.element_size())
        head = head[:max(1, HEAD_BYTES // row)]
    # on the device, then a blocking copy of those bytes alone to the host (mps-facts: copies
    # blocking unless proven); a CPU batch's leading rows are a view, read where they are
    head = head.contiguous().reshape(-1)[:max(1, HEAD_BYTES // head.element_size())]
    return head.cpu()


def tensors_in(value: Any) -> Iterator[torch.Tensor]:
    """The tensors in a forward's inputs or outputs: a tensor, or tuples, lists, dicts (Hugging
    Face's ``ModelOutput`` is one) and dataclasses of them."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from tensors_in(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from tensors_in(item)
    elif is_dataclass(value) and not isinstance(value, type):
        for f in fields(value):
            yield from tensors_in(getattr(value, f.name))
