"""Whether the ranks agree on what they train with, which nothing else would show: their
DistributedSamplers' datasets and options, the inputs of their first training forwards, and
their hosts' copies of the script's modules. The ranks report each (``runtime.note_dataset``,
``macfleet.batches``, ``macfleet.sources``); once every rank's (or host's) report of a kind
has come, the launcher warns of what differs. The job goes on as written: which copy of the
data or the code is right is the user's to say."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from macfleet import protocol, wire
from macfleet.launcher.groups import grouped, odd_ones, ordinal, ranks_text


class Agreement:
    """The reports of the job's ranks, kept until every rank's of a kind has come. Each method
    takes one report (a control message; a malformed one is ``wire.BadMessage``) and returns the
    warning it completes, if any."""

    def __init__(self, world_size: int, num_hosts: int) -> None:
        self.world_size, self.num_hosts = world_size, num_hosts
        # (line, number there) -> rank -> its sampler's, till every rank's has come
        self._datasets: dict[tuple[str, int], dict[int, SamplerNote]] = {}
        self._datasets_said: set[tuple[SamplerNote, ...]] = set()  # the ranks' notes looked at already
        # rank -> digests of the inputs of its first training forwards (``macfleet.batches``)
        self._batches: dict[int, dict[int, str | None]] = {}
        self._batches_told = False  # rank 0 warned of a loader that reads a whole dataset: the same mistake
        # round (1: at init, 2: since, at the first training step) -> host -> its first rank's
        # digests of the script's modules imported
        self._sources: dict[int, dict[str, dict[str, str]]] = {}

    def dataset(self, msg: dict[str, Any]) -> str | None:
        """A rank's DistributedSampler and its dataset (``SamplerNote``): once every rank's made
        at that line (and as many times) has come, how they differ, if they do
        (``samplers_differ``)."""
        sender, site, made = str(msg.get("from")), msg.get("site"), msg.get("made")
        if not sender.startswith("rank-") or not isinstance(site, str) or not isinstance(made, int):
            raise wire.BadMessage("bad dataset note")
        k = (site, made)
        notes = self._datasets.setdefault(k, {})
        notes[int(sender[5:])] = SamplerNote.of(msg)
        if len(notes) < self.world_size:
            return None
        del self._datasets[k]
        said = tuple(notes[rank] for rank in sorted(notes))
        if said in self._datasets_said:  # a sampler made anew each epoch: said once
            return None
        self._datasets_said.add(said)
        return samplers_differ(k, notes)

    def batch(self, msg: dict[str, Any]) -> str | None:
        """A digest of the inputs of a rank's ``forward``-th training forward: once every rank's
        first ``BATCH_FORWARDS`` have come, the ranks that got the same (``same_batches``),
        unless rank 0 has warned of the loader that makes them."""
        sender, forward, digest = str(msg.get("from")), msg.get("forward"), msg.get("digest")
        if not sender.startswith("rank-") or not isinstance(forward, int) or not isinstance(digest, (str, type(None))) \
                or not 1 <= forward <= protocol.BATCH_FORWARDS or len(digest or "") > 64:
            raise wire.BadMessage("bad batch note")
        rank = int(sender[5:])
        self._batches_told = self._batches_told or (rank == 0 and msg.get("told") is True)
        notes = self._batches.setdefault(rank, {})
        notes[forward] = digest
        complete = {r: d for r, d in self._batches.items() if len(d) == protocol.BATCH_FORWARDS}
        if len(notes) != protocol.BATCH_FORWARDS or len(complete) != self.world_size or self._batches_told:
            return None
        return same_batches({r: tuple(d[k] for k in range(1, protocol.BATCH_FORWARDS + 1))
                             for r, d in sorted(complete.items())})

    def sources(self, msg: dict[str, Any], hosts: dict[int, str]) -> str | None:
        """A host's first rank's digests of the script's modules (``macfleet.sources``), those
        imported by init (round 1) or since, by the first training step (round 2); ``hosts``:
        each rank's host. Once every host's of a round have come, the modules whose copies
        differ between hosts. In round 2 a module that some host has not imported is no
        difference: a script may import one on rank 0 alone (its logging), and one missing
        where it is imported fails there."""
        sender, files, round_ = str(msg.get("from")), msg.get("files"), msg.get("round", 1)
        if not sender.startswith("rank-") or not isinstance(files, dict) or round_ not in (1, 2):
            raise wire.BadMessage("bad sources")
        reports = self._sources.setdefault(round_, {})
        reports[hosts.get(int(sender[5:]), sender)] = {str(k): str(v) for k, v in files.items()}
        if len(reports) != self.num_hosts:
            return None
        odd = odd_copies(reports, imported_by_all=round_ == 2)
        if not odd:
            return None
        named = "; ".join(f"{name} on {', '.join(where)}" for name, where in odd[:10])
        which = "modules of the script" if round_ == 1 else "modules that the script imported after macfleet.init()"
        return (f"{which} are not the same on every host (edits not copied to every Mac?), and each host runs its "
                f"own: {named}{' ...' if len(odd) > 10 else ''}")


@dataclass(frozen=True)
class SamplerNote:
    """What a rank's DistributedSampler of the job says of itself (``runtime.note_dataset``):
    its dataset's length, which samples of its base a ``Subset`` holds (a digest; None for
    another dataset), and the options that make its order."""

    length: int
    subset: str | None
    order: tuple[tuple[str, str], ...]  # seed, shuffle, drop_last and shares, each by its name, as text

    @staticmethod
    def of(msg: dict[str, Any]) -> SamplerNote:
        length, subset, order = msg.get("length"), msg.get("subset"), msg.get("order", {})
        if not isinstance(length, int) or not isinstance(subset, (str, type(None))) or not isinstance(order, dict):
            raise wire.BadMessage("bad dataset note")
        return SamplerNote(length, subset, tuple((str(name), str(value)) for name, value in sorted(order.items())))


def samplers_differ(k: tuple[str, int], notes: dict[int, SamplerNote]) -> str | None:
    """How the ranks' DistributedSamplers made at ``k`` (a line, and their number there)
    differ, or None. Each rank takes its part of a shuffle of its own dataset's indices, made by
    its own sampler's options, so a dataset of another length (an incomplete copy on one Mac), a
    ``Subset`` of other samples (a ``random_split`` with each rank's own seed) or other options
    (a seed drawn from each rank's generators) make parts that overlap and miss samples, with
    nothing else to show for it."""
    site, made = k
    notes = dict(sorted(notes.items()))  # groups of ranks named in rank order
    which = f"the DistributedSamplers made at {site}" + (f", the {ordinal(made)} made there" if made > 1 else "")
    lengths = grouped({rank: note.length for rank, note in notes.items()})
    if len(lengths) > 1:
        found = ", ".join(f"{n} on {ranks_text(ranks)}" for n, ranks in lengths.items())
        return (f"the ranks' datasets differ in length ({which}): {found}. Each rank takes its part of a shuffle of "
                f"its own dataset's indices, so the parts overlap and miss samples: every Mac must hold the same "
                f"dataset")
    parts = grouped({rank: note.subset for rank, note in notes.items()})
    if len(parts) > 1:
        found = ("each rank's holds other samples" if len(parts) == len(notes) else
                 "; ".join(f"{ranks_text(ranks)} hold{'' if len(ranks) > 1 else 's'} {'another' if i else 'one set'}"
                           for i, ranks in enumerate(parts.values())))
        return (f"the ranks' datasets are different parts of their data ({which}: a Subset of "
                f"{lengths.popitem()[0]} samples on every rank, but {found}). A random_split splits with the rank's "
                f"own generator, which macfleet seeds with seed + rank, so each rank trains on samples the others "
                f"hold out: split with the same generator on every rank, random_split(dataset, sizes, "
                f"generator=torch.Generator().manual_seed(0))")
    options = []
    for name, _ in next(iter(notes.values())).order:
        values = grouped({rank: dict(note.order).get(name) for rank, note in notes.items()})
        if len(values) > 1:
            options.append(f"{name} " + ", ".join(f"{value} on {ranks_text(ranks)}" for value, ranks in values.items()))
    if not options:
        return None
    return (f"the ranks' DistributedSamplers are made with different options ({which}): {'; '.join(options)}. "
            f"Each rank takes its part of its own sampler's order, so the parts overlap and miss samples: give "
            f"every rank's the same (macfleet seeds rank r's generators with seed + r, so a seed drawn from them "
            f"differs from rank to rank)")


def same_batches(digests: dict[int, tuple[str | None, ...]]) -> str | None:
    """Which ranks got the same inputs as another rank in each of their first training forwards
    (digests in forward order, by rank), or None. A rank whose inputs did not change from one
    forward to the next (one fixed batch, as in a benchmark) or that held no tensor to read is
    let be: only data that moves on from batch to batch and is the same on two ranks is a
    dataset read twice."""
    moving = {rank: d for rank, d in digests.items() if None not in d and len(set(d)) > 1}
    alike = [ranks for ranks in grouped(moving).values() if len(ranks) > 1]
    if not alike:
        return None
    forwards = len(next(iter(digests.values())))
    if len(alike) == 1 and len(alike[0]) == len(digests):
        who = (f"the ranks train on the same batches: the first {forwards} training forwards of every rank got "
               f"the same inputs as every other rank's, so the {len(digests)} ranks together go no faster than one")
    else:
        groups = " and of ".join(ranks_text(ranks) for ranks in alike)
        who = (f"some ranks train on the same batches: the first {forwards} training forwards of {groups} got the "
               f"same inputs{' (each group its own)' if len(alike) > 1 else ''}, so they go through the same samples")
    return (f"{who}. Each rank must read its own part of the data: a DataLoader over a dataset with a length "
            f"takes sampler=macfleet.DistributedSampler(dataset); an IterableDataset must yield each rank its own "
            f"part, split by macfleet.rank() and macfleet.world_size() (not by macfleet.local_rank(), which "
            f"repeats on every Mac)")


def odd_copies(copies: dict[str, dict[str, str]], imported_by_all: bool = False) -> list[tuple[str, list[str]]]:
    """``copies``: each host's digest of each file. The files whose copies differ, each with the
    hosts whose copy is odd (``odd_ones``; a host that has no such file counts as a copy of its
    own, unless ``imported_by_all``: then only the files every host has are compared)."""
    names = set.intersection(*map(set, copies.values())) if imported_by_all else set().union(*copies.values())
    odd = [(name, odd_ones({host: files.get(name) for host, files in copies.items()})) for name in sorted(names)]
    return [(name, hosts) for name, hosts in odd if hosts]
