"""What the launcher prints when a job ends badly: one root cause, then the rest in brief."""

from __future__ import annotations

from macfleet.launcher.coordinator import Failure
from macfleet.protocol import WorkerExit


def describe(exit_: WorkerExit) -> str:
    how = f"was killed by {exit_.signal} (exit code {exit_.code})" if exit_.signal else f"exited with code {exit_.code}"
    return f"rank {exit_.rank} (host {exit_.host}, pid {exit_.pid}) {how}"


def failure_report(root: Failure, exits: dict[int, WorkerExit], world_size: int) -> str:
    lines = ["", "=" * 72, "macfleet: job failed", "root cause (first failure):"]
    if root.exit is not None:
        lines.append("  " + describe(root.exit))
        error = root.exit.error
        if error and error.get("traceback"):
            lines += ["  " + line for line in str(error["traceback"]).rstrip().splitlines()]
        elif root.exit.tail:
            lines.append("  no error file; last lines of its stderr:")
            lines += ["  " + line for line in root.exit.tail]
    else:
        lines.append("  " + root.reason)
    others = []
    for rank in range(world_size):
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
    lines.append("=" * 72)
    return "\n".join(lines)
