"""Open files: what the launcher and a host's agent hold for a job, and the soft limit raised to
cover it.

A shell on a Mac starts with a limit of 256 open files (``ulimit -n``), far below its hard
limit. An agent holds about seven for each of its ranks (the pipes to the rank, and those of
the threads that copy its output), one more with ``--log-dir``; the launcher holds one
connection for each rank and a few pipes for each host. Past the limit the next pipe failed
with EMFILE halfway through starting a job: 30-odd ranks on one Mac ended in the agent's
traceback. As servers do, each raises its soft limit to what it needs where the hard limit
allows, and refuses the job before anything starts where it does not.
"""

from __future__ import annotations

import resource

# Measured on Linux (``ls /proc/PID/fd``): an agent held 13 + 7 per rank with --log-dir, the
# launcher 15 + 1 per rank. The margins cover a rank being started (8 more for a moment, its
# ends of the pipes) and macOS, where ZeroMQ wakes its threads through socket pairs (two
# descriptors) instead of eventfds; they are small, so as not to refuse a job that would run.
AGENT_BASE, AGENT_PER_RANK = 24, 8
LAUNCHER_BASE, LAUNCHER_PER_RANK, LAUNCHER_PER_HOST = 24, 1, 4


def agent_needs(slots: int) -> int:
    return AGENT_BASE + AGENT_PER_RANK * slots


def launcher_needs(ranks: int, hosts: int) -> int:
    return LAUNCHER_BASE + LAUNCHER_PER_RANK * ranks + LAUNCHER_PER_HOST * hosts


def refusal(who: str, ranks: int, needed: int) -> str | None:
    """Raise this process's soft limit on open files to ``needed`` where it is lower and the hard
    limit allows (its children inherit it). None when the limit is enough now; else why ``who``
    ("the launcher", or "it" after an agent names its host) cannot start its ``ranks`` ranks."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return None
    if hard == resource.RLIM_INFINITY or hard >= needed:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
            return None
        except (ValueError, OSError):
            pass  # macOS refuses more than kern.maxfilesperproc, even under an unlimited hard limit
    return (f"{who} needs about {needed} open files for {ranks} ranks, and the limit on open files is {soft}, "
            f"which only an administrator can raise (ulimit -Hn shows it): raise it, or start fewer ranks")
