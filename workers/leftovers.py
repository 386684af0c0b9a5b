"""Processes that the ranks started in sessions of their own, found and stopped at the job's end.

The agent stops each rank's process group, which holds what the rank started, but a process
started with ``start_new_session=True`` (``setsid``, a daemon that forks twice) leaves the group
and outlived the job: a TensorBoard holding its port, a data server holding memory, into the
next attempt of a job that restarts. Such a process keeps the environment it was started with,
and the rank's holds this agent's ``MACFLEET_JOB_ID`` and ``MACFLEET_AGENT_PID`` (as Jenkins
finds a build's processes by its ``BUILD_ID``). ``ps`` shows each process's environment as it
was at its start, on Linux and macOS alike, and only for the user's own processes. A process
meant to outlive the job is started without ``MACFLEET_JOB_ID`` in its environment."""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import time

from macfleet.whereabouts import output_of

# ps's option for the environment, after the command line: macOS's says -E, Linux's (procps) the
# BSD-style e. The ranks' keepers (bootstrap.py) use it too.
PS_ENVIRONMENT = "-E" if sys.platform == "darwin" else "e"


@dataclasses.dataclass(frozen=True)
class Leftover:
    pid: int
    program: str  # the name it was started by, for the agent's line


def find(job_id: str, agent_pid: int, groups: set[int]) -> list[Leftover]:
    """The processes started with this agent's ranks' environment, outside the ranks' process
    groups (``groups``, which the agent stops itself)."""
    marks = {f"MACFLEET_JOB_ID={job_id}", f"MACFLEET_AGENT_PID={agent_pid}"}
    found = []
    for line in _ps_with_environment().splitlines():
        fields = line.split()  # pid, pgid, then the arguments and the environment, space-separated
        if len(fields) < 3 or not (fields[0].isdigit() and fields[1].isdigit()):
            continue
        pid, group = int(fields[0]), int(fields[1])
        if pid != os.getpid() and group not in groups and marks <= set(fields[2:]):
            found.append(Leftover(pid, os.path.basename(fields[2])))
    return found


def stop(job_id: str, agent_pid: int, groups: set[int], grace_s: float) -> list[Leftover]:
    """SIGTERM each process ``find`` gives, SIGKILL those still there ``grace_s`` later (the
    ranks' own grace, for a service to finish what it holds); what was found. A process that
    has ended is no longer found, a zombie included (it has no environment left), so the wait
    ends as soon as they all have."""
    found = find(job_id, agent_pid, groups)
    for sig in (signal.SIGTERM, signal.SIGCONT):  # a stopped process must wake up to end
        _signal(found, sig)
    deadline = time.monotonic() + grace_s
    pids = {left.pid for left in found}
    while pids and time.monotonic() < deadline:
        time.sleep(0.05)
        pids &= {left.pid for left in find(job_id, agent_pid, groups)}
    _signal([left for left in found if left.pid in pids], signal.SIGKILL)
    return found


def _signal(processes: list[Leftover], sig: int) -> None:
    for left in processes:
        try:
            os.kill(left.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass  # ended meanwhile


def _ps_with_environment() -> str:
    """Every process's pid, process group and command line followed by its environment."""
    return output_of(["ps", "-A", PS_ENVIRONMENT, "-ww", "-o", "pid=,pgid=,command="])
