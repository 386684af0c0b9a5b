"""What the launcher prints when a job ends badly: one root cause, then the rest in brief."""

from __future__ import annotations

import math

from macfleet.launcher.coordinator import Failure, odd_ones, spans
from macfleet.protocol import STOOD_BY, WorkerExit


def describe(exit_: WorkerExit) -> str:
    how = f"was killed by {exit_.signal} (exit code {exit_.code})" if exit_.signal else f"exited with code {exit_.code}"
    return f"rank {exit_.rank} (host {exit_.host}, pid {exit_.pid}) {how}"


def failure_report(root: Failure, exits: dict[int, WorkerExit], world_size: int) -> str:
    lines = ["", "=" * 72, "macfleet: job failed", "root cause (first failure):"]
    if root.exit is not None:
        lines.append("  " + describe(root.exit))
        if root.exit.stopped:  # not the script's doing: say whose, before its (SIGTERM) traceback
            lines.append(f"  {root.exit.stopped}")
        lines += _killed_from_outside(root.exit)
        error = root.exit.error
        if error and error.get("traceback"):
            lines += ["  " + line for line in str(error["traceback"]).rstrip().splitlines()]
            lines += _missing_module_hint(error, root.exit.host)
            lines += _device_memory_hint(error, root.exit.host)
            lines += _process_group_hint(error)
            lines += _no_cuda_hint(error, root.exit.host)
        elif any(line.strip() for line in root.exit.tail):
            lines.append("  no error file; last lines of its stderr:")
            lines += ["  " + line for entry in root.exit.tail for line in entry.splitlines()]
    else:
        lines.append("  " + root.reason)
        lines += ["  " + line for line in root.detail.splitlines()]
    others = []
    for rank in range(world_size if exits else 0):  # no exits: no rank ever started
        e = exits.get(rank)
        if root.exit is not None and rank == root.exit.rank:
            continue
        if e is None:
            others.append(f"  rank {rank}: stopped (no exit reported)")
        elif e.code != 0:
            kind = (e.error or {}).get("type")
            others.append(f"  {describe(e)}" + (f" [{kind}]" if kind else ""))
    if others:
        lines += ["other ranks:", *others]
    if _about_collectives(root):
        lines += collectives_report(exits)
        lines += _join_hint(exits)
    lines += _checkpoint_hint(exits)
    lines.append("=" * 72)
    return "\n".join(lines)


def _killed_from_outside(exit_: WorkerExit) -> list[str]:
    """A SIGKILL that macfleet did not send. Nothing in the rank can say why it came (no
    traceback, no error file), and the most common sender is the system, out of memory: Linux's
    OOM killer, or macOS under memory pressure. Say so, with how much memory the rank held."""
    if exit_.signal != "SIGKILL" or exit_.stopped:
        return []
    held = ""
    if exit_.peak_rss:
        held = f" At its peak this rank held {_gib(exit_.peak_rss)} of memory"
        held += f", of the {_gib(exit_.host_memory)} that {exit_.host} has." if exit_.host_memory else "."
    return [f"  Nothing in macfleet sent that SIGKILL: most often the system sends it when memory runs out (Linux's "
            f"OOM killer, which dmesg names; macOS under memory pressure).{held} A smaller batch or model, or "
            f"fewer ranks on {exit_.host}, needs less."]


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.1f} GiB"


def _missing_module_hint(error: dict, host: str) -> list[str]:
    """A package the script imports that is missing where the rank ran: on a fleet of Macs, most
    often one Mac that lacks what the others have (torch itself, where --python names another
    Python), or a module of the script's own that is not in that Mac's copy of its folder."""
    module = str(error.get("module") or "")
    if error.get("type") != "ModuleNotFoundError" or not module or "." in module:
        return []  # a missing submodule of a package that is there is another story
    python = error.get("executable") or "the ranks' Python"
    if module == "horovod":  # a Horovod script run as it is: macfleet has each of its calls
        return [f"  horovod is not installed for {python} on {host}, and a Horovod script needs it only for its hvd "
                f"calls: macfleet has one for each (hvd.init() is macfleet.init(), hvd.DistributedOptimizer is "
                f"macfleet.DataParallel around the model...: the README's Horovod table)"]
    return [f"  {module} is not installed for {python} on {host}: install it there (every host needs the script's "
            f"packages; a module of the script's own must be in its folder there too), or give --python the Python "
            f"that has it (macfleet doctor checks torch and macfleet on every host)"]


def _device_memory_hint(error: dict, host: str) -> list[str]:
    """A rank out of GPU memory whose GPU other ranks share: macfleet capped it at its share
    (``MACFLEET_MEMORY_FRACTION``), which torch's message does not say, and on a Mac torch's
    advice (``PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0``) cannot lift that cap, which the rank sets
    again at init."""
    fraction = error.get("memory_fraction")
    out_of_memory = error.get("type") == "OutOfMemoryError" or "MPS backend out of memory" in str(error.get("message"))
    if not out_of_memory or not fraction:
        return []  # a GPU of its own: torch's message says all there is
    return [f"  this rank may use {fraction} of its GPU's memory: the ranks that share a GPU split 0.9 of it evenly, "
            f"unless --memory-fraction gives each its share (which torch's PYTORCH_MPS_HIGH_WATERMARK_RATIO does "
            f"not change). A smaller batch or model, fewer ranks on {host}, or a larger --memory-fraction gives it "
            f"room (the shares of one GPU's ranks should add up to 1 at most: on a Mac its memory is the machine's)"]


def _process_group_hint(error: dict) -> list[str]:
    """A script half moved from torch DDP: ``macfleet.init()`` in place of
    ``init_process_group``, and a torch.distributed call left (torch's DistributedSampler, most
    often), which finds no process group. torch's message says to call init_process_group."""
    if "Default process group has not been initialized" not in str(error.get("message")):
        return []
    where = str(error.get("traceback")).replace("\\", "/")
    if "data/distributed.py" in where:
        return ["  torch's DistributedSampler asks torch.distributed for the ranks, which macfleet.init() does not set "
                "up: use macfleet.DistributedSampler, which takes the same options and gives each rank the same "
                "samples as torch's"]
    if "nn/parallel/distributed.py" in where:
        return ["  torch's DistributedDataParallel needs torch.distributed, which macfleet.init() does not set up: "
                "use macfleet.DataParallel(model), which takes DDP's options"]
    return ["  macfleet.init() does not set up torch.distributed: use macfleet's calls in its place (macfleet.rank(), "
            "macfleet.world_size(), macfleet.all_reduce(t), macfleet.barrier(): the README's table has each), or "
            "keep the script's own dist.init_process_group(\"gloo\"), which works under macfleet launch as under "
            "torchrun"]


# What torch raises for a CUDA call where there is no CUDA: a Mac's torch (or a CPU build), and
# a CUDA build on a machine without NVIDIA's driver.
NO_CUDA = ("Torch not compiled with CUDA enabled", "has no attribute '_cuda_", "Found no NVIDIA driver")


def _no_cuda_hint(error: dict, host: str) -> list[str]:
    """A CUDA script moved to Macs that kept its ``.cuda()``, ``device="cuda"`` or
    ``torch.cuda.set_device(local_rank)``, or its DDP on NCCL: a Mac has no CUDA, and torch's
    message does not say what to write instead."""
    message = str(error.get("message"))
    if "doesn't have NCCL built in" in message:
        return [f"  NCCL is for NVIDIA GPUs, and the torch on {host} has none: a DDP script runs under macfleet "
                f"launch with init_process_group(\"gloo\"), its tensors on the CPU, or trains on the Mac's GPU "
                f"with macfleet.init() and macfleet.DataParallel (the README's table)"]
    if not any(said in message for said in NO_CUDA):
        return []
    return [f"  {host} has no CUDA (a Mac's GPU is mps): put the model and tensors on macfleet.device(), the GPU this "
            f"rank drives (mps, cuda or cpu, whichever its host has), in place of .cuda(), device=\"cuda\" and "
            f"torch.cuda.set_device(local_rank)"]


def _about_collectives(root: Failure) -> bool:
    """Whether the job failed because its ranks called different collectives."""
    if root.exit is not None:
        return (root.exit.error or {}).get("type") == "ProtocolError"
    return "different collectives" in root.reason


def _join_hint(exits: dict[int, WorkerExit]) -> list[str]:
    """What it means when a rank failed while it stood by inside ``join()``: it had run out of
    batches and shadows only DataParallel's collectives, and the others made one of their own."""
    if not any(STOOD_BY in _collectives_of(e) for e in exits.values()):
        return []
    return ["a rank that has run out of batches inside model.join() takes part only in DataParallel's own collectives "
            "(its round, the buffers, the gradients): make the script's other collectives (a metric, a checkpoint) "
            "after the join() block, or give every rank the same number of batches"]


def _checkpoint_hint(exits: dict[int, WorkerExit]) -> list[str]:
    """Ranks that parted at a checkpoint some of them made and the others did not (they were
    in another collective, or had finished): a DDP script guards its ``torch.save`` with ``if
    rank == 0``, and kept in front of macfleet's ``checkpoint.save``, a collective, that guard
    leaves the other ranks out of it."""
    failed_in = {rank: line.split(" [failed here]")[0] for rank, e in exits.items()
                 for line in _collectives_of(e).splitlines() if "[failed here]" in line}
    at_checkpoint = {rank for rank, line in failed_in.items() if line.endswith(CHECKPOINT_CALLERS)}
    elsewhere = {rank for rank, e in exits.items() if rank not in at_checkpoint and (rank in failed_in or e.code == 0)}
    if not (at_checkpoint and elsewhere):
        return []
    return ["checkpoint.save and checkpoint.load are collectives: every rank calls them, and rank 0 alone writes "
            "or reads the file (where a DDP script saves under `if rank == 0:`, call macfleet.checkpoint.save on "
            "every rank)"]


CHECKPOINT_CALLERS = ("from checkpoint.save", "from checkpoint.load")


def _collectives_of(e: WorkerExit) -> str:
    """The rank's last collectives, as its error report gave them ("" if it gave none)."""
    return str((e.error or {}).get("collectives") or "")


def collectives_report(exits: dict[int, WorkerExit]) -> list[str]:
    """Each rank's last collectives, ranks whose lists agree together: where the lists part is
    where the script's ranks went different ways (a metric only rank 0 reduces, say)."""
    groups: dict[str, list[int]] = {}
    for rank, e in sorted(exits.items()):
        made = _collectives_of(e)
        if made:
            groups.setdefault(made, []).append(rank)
    if not groups:
        return []
    lines = ["last collectives of each rank (oldest first; #N is the collective's number, the same on every rank):"]
    for k, (made, ranks) in enumerate(groups.items()):
        if k == LISTED_RANKS:
            lines.append(f"  ... and {sum(len(r) for r in list(groups.values())[k:])} more ranks")
            break
        lines.append(f"  rank{'s' if len(ranks) > 1 else ''} {spans(ranks)}:")
        lines += ["    " + line for line in made.splitlines()]
    return lines


VERSION_KEYS = ("torch", "macfleet")


def versions_differ(facts: list[dict]) -> bool:
    return any(len({str(f.get(key)) for f in facts}) > 1 for key in VERSION_KEYS)


def scripts_differ(facts: list[dict]) -> bool:
    """Whether the hosts' copies of the script differ (a ``-m`` module's are not compared)."""
    return len({f.get("script") for f in facts} - {None}) > 1


def facts_table(names: list[str], facts: list[dict],
                columns: tuple[str, ...] = ("python", "torch", "macfleet", "os")) -> str:
    """One row per host. In a column whose values differ, ``<-`` marks the odd ones out: the
    values other than the one most hosts share, or every value when no one value leads."""
    marked: dict[str, set[str]] = {}
    for c in columns:
        values = [str(f.get(c)) for f in facts]
        if c != "os":
            marked[c] = {values[i] for i in odd_ones(dict(enumerate(values)))}
    rows = [("host", *columns)]
    for name, f in zip(names, facts, strict=True):
        rows.append((name, *(str(f.get(c)) + (" <-" if str(f.get(c)) in marked.get(c, ()) else "")
                             for c in columns)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows)


# A gap this large between the ranks' waiting shares names who set the pace. Macs of different
# generations differ by 2-4x, which puts the fast ones' share tens of points above the slow
# ones'; a 1-epoch MNIST run of 4 ranks sharing one GPU spread 1-16% on its own (device machine).
PACE_SPREAD = 0.20
COMMUNICATION_BOUND = 0.30  # every rank waiting this much of its time: communication sets the pace
# A job whose ranks all ran less than this (a smoke test, a script that only checks the ring) has
# waited a few milliseconds at most, which is noise, not pace: 3 ms of a 5 ms job read as "60%".
PACE_MIN_RUN_S = 1.0
LISTED_RANKS = 8  # more ranks than this are summed up (least, median, most) rather than listed


STOOD_BY_SHARE = 0.05  # of a rank's time: below this, one batch more or less on some ranks, not worth a line


def stood_by_report(stood_by: dict[int, float], waits: dict[int, tuple[float, float]]) -> list[str]:
    """After a job in which ranks ran out of batches inside ``DataParallel.join()``: the share
    of its time each stood by while the others trained on. Its device sat idle all that time,
    which nothing else says (the pace line leaves it out). Nothing below ``STOOD_BY_SHARE``."""
    shares = _stood_by_shares(stood_by, waits)
    idle = sorted(shares)
    if not idle:
        return []
    listed = ", ".join(f"rank {r} {shares[r]:.0%}" for r in idle[:LISTED_RANKS]) + \
        (f" and {len(idle) - LISTED_RANKS} more ranks" if len(idle) > LISTED_RANKS else "")
    one = len(idle) == 1
    return [f"{'a rank' if one else 'ranks'} out of batches stood by inside join() while the others trained: "
            f"{listed} of {'its' if one else 'their'} time; the same number of batches on every rank "
            f"(macfleet.DistributedSampler) keeps every device busy"]


def _stood_by_shares(stood_by: dict[int, float], waits: dict[int, tuple[float, float]]) -> dict[int, float]:
    """Each rank's share of its time stood by inside join(), where it is ``STOOD_BY_SHARE`` or more."""
    shares = {r: s / (s + waits[r][1]) for r, s in stood_by.items() if r in waits}
    return {r: share for r, share in shares.items() if share >= STOOD_BY_SHARE}


def pace_report(waits: dict[int, tuple[float, float]], hosts: dict[int, str], world_size: int,
                speeds: dict[int, float] | None = None, stood_by: dict[int, float] | None = None) -> list[str]:
    """After a job that finished: what share of its time each rank spent waiting on the others
    and the network, and who set the pace. On a fleet of mixed Macs the slowest one never waits:
    every other rank waits for it at each exchange (Horovod's timeline shows this; the launcher
    can say it in a line), and with every rank's ``speeds`` (DataParallel's measure: its share
    of a step per second of work) it says which shares would even them out. Ranks that ran out
    of batches and ``stood_by`` inside join() are listed but not judged: their waiting share is
    of their few steps, and naming them as the pace setters would say nothing. Nothing when a rank
    did not report, the job was one rank, or it was over too soon to say (``PACE_MIN_RUN_S``)."""
    if world_size < 2 or len(waits) < world_size or max(ran for _, ran in waits.values()) < PACE_MIN_RUN_S:
        return []
    share = {r: waited / ran for r, (waited, ran) in waits.items()}
    multi_host = len(set(hosts.values())) > 1

    def name(r: int) -> str:
        return f"rank {r} ({hosts.get(r, '?')})" if multi_host else f"rank {r}"

    def group(ranks: list[int]) -> str:
        if len(ranks) > LISTED_RANKS:
            return f"{len(ranks)} ranks"
        where = sorted({hosts.get(r, "?") for r in ranks})
        return (f"rank{'s' if len(ranks) > 1 else ''} {', '.join(str(r) for r in sorted(ranks))}"
                + (f" (on {', '.join(where)})" if multi_host else ""))

    order = sorted(share, key=lambda r: (share[r], r))
    if world_size <= LISTED_RANKS:
        listed = ", ".join(f"{name(r)} {share[r]:.0%}" for r in sorted(share))
    else:
        middle = order[len(order) // 2]
        listed = (f"least {share[order[0]]:.0%} ({name(order[0])}), median {share[middle]:.0%}, "
                  f"most {share[order[-1]]:.0%} ({name(order[-1])})")
    lines = [f"share of each rank's time spent waiting on communication and on other ranks: {listed}"]
    idle = _stood_by_shares(stood_by or {}, waits)
    ranks = [r for r in order if r not in idle]
    if len(ranks) < 2:
        return lines
    low, high = share[ranks[0]], share[ranks[-1]]
    if high - low >= PACE_SPREAD:
        slow = [r for r in ranks if share[r] < low + (high - low) / 2]
        fast = [r for r in ranks if r not in slow]
        lines.append(f"{group(slow)} set{'' if len(slow) > 1 else 's'} the pace: {group(fast)} spent up to "
                     f"{high - low:.0%} more of {'their' if len(fast) > 1 else 'its'} time waiting for "
                     f"{'them' if len(slow) > 1 else 'it'}"
                     + ("; DataParallel's shares give faster Macs larger batches" if multi_host else ""))
        suggested = suggest_shares([speeds[r] for r in range(world_size)]) \
            if multi_host and speeds and len(speeds) == world_size else None
        if suggested and len(set(suggested)) > 1:
            by_host: dict[str, set[int]] = {}
            for r, s in enumerate(suggested):
                by_host.setdefault(hosts.get(r, "?"), set()).add(s)
            how = ("pass them to DistributedSampler and DataParallel" if any(len(s) > 1 for s in by_host.values())
                   else "in the hostfile, " + ", ".join(f"{h} share={min(s)}" for h, s in by_host.items())
                   + " (macfleet.shares() hands them to the script)")
            lines.append(f"shares={suggested} would give each rank work in proportion to its speed in this job: "
                         f"{how} (README: Macs of different speeds)")
    elif low >= COMMUNICATION_BOUND:
        lines.append(f"communication sets the pace: every rank spent at least {low:.0%} of its time in it"
                     + ("; DataParallel(compression='fp16') halves the bytes, larger batches mean fewer exchanges, "
                        "and macfleet doctor measures the links between the hosts" if multi_host else ""))
    return lines


def suggest_shares(speeds: list[float], tolerance: float = 0.1, largest_scale: int = 10) -> list[int]:
    """Whole-number shares in proportion to ``speeds`` (each rank's share of a step per second of
    work), as small as keeps every rank within ``tolerance`` of its exact part: [3.1, 1.0] gives
    [3, 1], and [1.6, 1.6, 1.0, 1.0] gives [3, 3, 2, 2] rather than [2, 2, 1, 1]."""
    slowest = min(speeds)
    exact = [s / slowest for s in speeds]
    for scale in range(1, largest_scale + 1):
        shares = [max(1, round(scale * x)) for x in exact]
        if all(abs(share - scale * x) <= tolerance * scale * x for share, x in zip(shares, exact, strict=True)):
            break
    divisor = math.gcd(*shares)
    return [share // divisor for share in shares]
