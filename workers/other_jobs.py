"""The other macfleet jobs running on this host, which share its GPU, memory and processors.

Each job sizes its ranks' share of the GPU's memory as if it were alone on the host (0.9 split
among its own ranks, or ``--memory-fraction``), so two jobs on one Mac may together ask for more
memory than the Mac has: past it, unified memory pages, many times slower (mps-facts.md section
2). And a job forgotten in another terminal slows the next one without a word.

So each agent leaves a note in its per-job directory (``NOTE``): its job, ranks, script and
start. It holds a lock on the note for as long as it lives, which the system lets go however the
agent ends (SIGKILL included), so a note left by a dead agent is told from a live one without
trusting a pid. An agent that starts reads the locked notes of the other jobs' directories in
the same scratch root (its directory's parent) and says what they are (``sharing``).
"""

from __future__ import annotations

import fcntl
import glob
import json
import os
import sys
import time
from dataclasses import asdict, dataclass

from macfleet.env import shared_memory_fraction
from macfleet.protocol import AgentSpec

NOTE = "agent.json"


@dataclass(frozen=True)
class JobNote:
    """What an agent tells the other jobs' agents on its host."""

    job_id: str
    pid: int  # the agent's, by which the user finds the job (ps)
    ranks: int  # the job's ranks on this host
    script: str
    started: float  # time.time() when the agent started
    device: str  # the job's --device (auto, mps, cuda, cpu)
    memory_fraction: float | None  # its --memory-fraction; None: the default share


def check_in(directory: str, spec: AgentSpec) -> str | None:
    """Leave this agent's note in its per-job ``directory``, locked until this process ends;
    return what to say of the other jobs running on this host, None where there are none."""
    script = f"-m {spec.args[0]}" if spec.script == "-m" else spec.script
    leave_note(directory, JobNote(spec.job_id, os.getpid(), spec.slots, script, time.time(), spec.device,
                                  spec.memory_fraction))
    others = running(os.path.dirname(directory), spec.job_id)
    return sharing(spec.host, others, spec.slots, spec.device, spec.memory_fraction, gpus_here()) if others else None


def gpus_here() -> int:
    """The GPUs this host's ranks may train on, as seen without torch (the agent never imports
    it): a Mac's one, the NVIDIA GPUs that Linux's driver lists, else none (``--device auto``
    then trains on the CPU)."""
    return 1 if sys.platform == "darwin" else len(glob.glob("/proc/driver/nvidia/gpus/*"))


def leave_note(directory: str, note: JobNote) -> int:
    """Write ``note`` into ``directory`` and lock it; returns the descriptor, whose lock lasts
    until it is closed or the process ends. Not inherited by the ranks (os.open's default), so
    the lock says whether this agent lives, not its ranks."""
    fd = os.open(os.path.join(directory, NOTE), os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, json.dumps(asdict(note)).encode())
    return fd


def running(root: str, job_id: str) -> list[JobNote]:
    """The notes in ``root``'s per-job directories of live agents of other jobs than ``job_id``
    (a restart of the same job is not another job), oldest first."""
    notes = []
    for path in glob.glob(os.path.join(glob.escape(root), "macfleet-*", NOTE)):
        if os.path.basename(os.path.dirname(path)).startswith(f"macfleet-{job_id}-"):
            continue
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue  # its job ended meanwhile, or another user's
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                continue  # nobody holds it: its agent is gone, and its keepers will remove the directory
            except BlockingIOError:
                pass
            notes.append(JobNote(**json.loads(os.read(fd, 1 << 16))))
        except (OSError, ValueError, TypeError):
            pass  # written this instant, or by another macfleet version
        finally:
            os.close(fd)
    return sorted(notes, key=lambda note: note.started)


def sharing(host: str, others: list[JobNote], ranks: int, device: str, fraction: float | None, gpus: int,
            now: float | None = None) -> str:
    """What the agent on ``host`` (with ``gpus`` GPUs), starting ``ranks`` ranks on ``device``
    with ``--memory-fraction fraction``, says of ``others``."""
    now = time.time() if now is None else now
    jobs = "; ".join(f"{_count(note.ranks, 'rank')} of {note.script}, started {_ago(now - note.started)} ago "
                     f"(its agent: pid {note.pid})" for note in others)
    what = "another macfleet job is" if len(others) == 1 else f"{len(others)} other macfleet jobs are"
    text = f"macfleet agent on {host}: {what} running here: {jobs}. The jobs share this host, so each trains slower"
    # Each job's ranks on the host's first GPU, the busiest (a job's local ranks take the GPUs in
    # turn from it), with their --memory-fraction; --device auto is the CPU where there is no GPU.
    everyone = [(note.ranks, note.device, note.memory_fraction) for note in others] + [(ranks, device, fraction)]
    on_gpu = [(len(range(0, n, max(gpus, 1))), share) for n, on, share in everyone
              if on != "cpu" and (gpus or on != "auto")]
    total = sum(n for n, _ in on_gpu)
    asked = sum(n * _share(share, n) for n, share in on_gpu)
    if asked <= 1:
        return text
    return (f"{text}; and where they train on its GPU, each job caps its ranks' share of the GPU's memory as if "
            f"it were alone, together {asked:.2f} times its memory: past what it has, they run out of memory "
            f"(CUDA) or the Mac pages (many times slower). Where the models are large, give each job "
            f"--memory-fraction so that the shares of the {total} ranks on one GPU add up to 0.9 at most "
            f"({int(900 / total) / 1000:g} each)")


def _share(fraction: float | None, ranks: int) -> float:
    """A rank's share of its GPU's memory where a job has ``ranks`` ranks on it (a rank alone on
    its GPU has no cap: all of it)."""
    return fraction if fraction is not None else shared_memory_fraction(ranks) or 1.0


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _ago(seconds: float) -> str:
    minutes = max(0, int(seconds)) // 60
    if minutes < 1:
        return "under a minute"
    if minutes < 60:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60} min"
