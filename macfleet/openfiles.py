"""Open files: what the launcher and a host's agent hold for a job, and the soft limit raised to
cover it.

A shell on a Mac starts with a limit of 256 open files (``ulimit -n``), far below its hard
limit. An agent holds about seven for each of its ranks (the pipes to the rank, and those of
the threads that copy its output), one more with ``--log-dir``; the launcher holds one
connection for each rank and a few pipes for each host. Past the limit the next pipe failed
with EMFILE halfway through starting a job: 30-odd ranks on one Mac ended in the agent's
traceback. As servers do, each raises its soft limit to what it needs where the hard limit
allows, and refuses the job before anything starts where it does not.

The ranks inherit their agent's limit, and need their own share: a rank on the CPU held 14
descriptors before its script opened any, one with a CUDA device about 55 (the driver's), and
each holds two more and one per rank of its host for the barrier's doorbells
(``macfleet.doorbells``). Past that the script's own files and data loaders come. So the agent
asks for at least ``RANKS_SOFT``, where the hard limit allows, and refuses only where the hard
limit is below what a rank needs before its script opens anything.
"""

from __future__ import annotations

import resource

# Measured on Linux (``ls /proc/PID/fd``): an agent held 13 + 7 per rank with --log-dir, the
# launcher 15 + 1 per rank. The margins cover a rank being started (8 more for a moment, its
# ends of the pipes) and macOS, where ZeroMQ wakes its threads through socket pairs (two
# descriptors) instead of eventfds; they are small, so as not to refuse a job that would run.
AGENT_BASE, AGENT_PER_RANK = 24, 8
LAUNCHER_BASE, LAUNCHER_PER_RANK, LAUNCHER_PER_HOST = 24, 1, 4
RANK_BASE = 64  # a rank's own before its doorbells (about 55 on CUDA, measured on the device machine)
RANKS_SOFT = 1024  # what an agent raises its soft limit to where it is lower, for its ranks' scripts


def agent_needs(slots: int) -> int:
    """What an agent of ``slots`` ranks needs, and what each of its ranks needs, whichever is more."""
    return max(AGENT_BASE + AGENT_PER_RANK * slots, RANK_BASE + 2 + slots)


def launcher_needs(ranks: int, hosts: int) -> int:
    return LAUNCHER_BASE + LAUNCHER_PER_RANK * ranks + LAUNCHER_PER_HOST * hosts


def refusal(who: str, ranks: int, needed: int, wanted: int = 0) -> str | None:
    """Raise this process's soft limit on open files to ``wanted`` (at least ``needed``) where
    it is lower, as far as the hard limit allows (its children inherit it). None when the limit
    is at least ``needed`` now; else why ``who`` ("the launcher", or "it" after an agent names
    its host) cannot start its ``ranks`` ranks."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = max(needed, wanted)
    if soft == resource.RLIM_INFINITY or soft >= target:
        return None
    if hard != resource.RLIM_INFINITY:
        target = min(target, hard)
    if target >= needed:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return None
        except (ValueError, OSError):
            pass  # macOS refuses more than kern.maxfilesperproc, even under an unlimited hard limit
    if soft >= needed:
        return None
    return (f"{who} needs about {needed} open files for {ranks} ranks, and the limit on open files is {soft}, "
            f"which only an administrator can raise (ulimit -Hn shows it): raise it, or start fewer ranks")
