"""What the launcher prints when a job ends badly: one root cause, then the rest in brief."""

from __future__ import annotations

import math

from macfleet.launcher import hints
from macfleet.launcher.coordinator import Failure
from macfleet.launcher.groups import odd_ones, ranks_text
from macfleet.protocol import WorkerExit


def describe(exit_: WorkerExit) -> str:
    how = f"was killed by {exit_.signal} (exit code {exit_.code})" if exit_.signal else f"exited with code {exit_.code}"
    return f"rank {exit_.rank} (host {exit_.host}, pid {exit_.pid}) {how}"


def failure_report(root: Failure, exits: dict[int, WorkerExit], world_size: int) -> str:
    lines = ["", "=" * 72, "macfleet: job failed", "root cause (first failure):"]
    if root.exit is not None:
        lines.append("  " + describe(root.exit))
        if root.exit.stopped:  # not the script's doing: say whose, before its (SIGTERM) traceback
            lines.append(f"  {root.exit.stopped}")
        lines += hints.after_exit(root.exit)
        error = root.exit.error
        if error and error.get("traceback"):
            lines += ["  " + line for line in str(error["traceback"]).rstrip().splitlines()]
            lines += hints.after_error(error, root.exit.host)
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
    parted = _about_collectives(root)
    if parted:
        lines += collectives_report(exits)
    lines += hints.after_parting(exits, parted)
    lines.append("=" * 72)
    return "\n".join(lines)


def _about_collectives(root: Failure) -> bool:
    """Whether the job failed because its ranks called different collectives."""
    if root.exit is not None:
        return (root.exit.error or {}).get("type") == "ProtocolError"
    return "different collectives" in root.reason


def collectives_report(exits: dict[int, WorkerExit]) -> list[str]:
    """Each rank's last collectives, ranks whose lists agree together: where the lists part is
    where the script's ranks went different ways (a metric only rank 0 reduces, say)."""
    groups: dict[str, list[int]] = {}
    for rank, e in sorted(exits.items()):
        made = hints.collectives_of(e)
        if made:
            groups.setdefault(made, []).append(rank)
    if not groups:
        return []
    lines = ["last collectives of each rank (oldest first; #N is the collective's number, the same on every rank):"]
    for k, (made, ranks) in enumerate(groups.items()):
        if k == LISTED_RANKS:
            lines.append(f"  ... and {sum(len(r) for r in list(groups.values())[k:])} more ranks")
            break
        lines.append(f"  {ranks_text(ranks)}:")
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
