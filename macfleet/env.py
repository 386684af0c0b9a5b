"""The environment contract between the agent and a training process.

The agent (``macfleet.workers.agent``) builds these variables in one place and
``WorkerEnv.from_environ`` parses them here. torchrun's names are kept so a
torchrun script runs unchanged under ``macfleet launch``.

=================================  ==========================================================
variable                           meaning
=================================  ==========================================================
RANK, WORLD_SIZE                   global rank and number of processes (as torchrun)
LOCAL_RANK, LOCAL_WORLD_SIZE       rank among, and number of, the processes on this host
MASTER_ADDR, MASTER_PORT           the job's torch.distributed store, on rank 0's host, for
                                   scripts that use torch.distributed themselves
TORCHELASTIC_USE_AGENT_STORE       True, as under torchrun: that store is served by rank 0's
                                   agent for the whole job, not by rank 0, so every rank is a
                                   client (and an ``init_method`` other than env:// or
                                   tcp://MASTER_ADDR:MASTER_PORT finds no store)
TORCHELASTIC_RESTART_COUNT         the same as MACFLEET_RESTART_COUNT (older torch reads it there)
MACFLEET_COORDINATOR               control-plane endpoint, ``tcp://host:port``
MACFLEET_JOB_ID                    job identity; every message carries it. With MACFLEET_AGENT_PID
                                   it marks what the ranks start: the agent stops a process
                                   started with both, in a session of its own, at the job's end
MACFLEET_RESTART_COUNT             restart round, 0 for the first
MACFLEET_DEVICE                    ``auto`` (mps, then cuda, then cpu), ``mps``, ``cuda``, ``cpu``
MACFLEET_SEED                      base seed; rank r seeds its generators with seed + r
MACFLEET_MEMORY_FRACTION           this process's share of its GPU's memory (0 = no cap). Set by
                                   the agent where ``--memory-fraction`` was given; otherwise
                                   ``macfleet.init`` sets it to ``shared_memory_fraction`` of the
                                   processes on the rank's device (unset for a process alone); on
                                   a Mac a lower high watermark of the user's own takes its place
                                   (``mps_cap``)
MACFLEET_ERROR_FILE                where an uncaught exception is written as JSON
MACFLEET_STACKS_FILE               where faulthandler dumps the rank's stacks when its agent asks
                                   (SIGUSR2): a rank that holds the GIL for good cannot answer
MACFLEET_DATA_ADDR                 the addresses this host's ring sockets bind to, comma-separated,
                                   the main one first (several: one subnet per cable)
MACFLEET_SHARES                    each rank's part of every step, comma-separated (``share=`` in a
                                   hostfile; ``macfleet.shares()``); unset: equal parts
MACFLEET_HOST                      this host's name in the job (for messages)
MACFLEET_TIMELINE                  1 under ``launch --timeline``: the rank records when its
                                   collectives and DataParallel's steps ran (``macfleet.timeline``)
MACFLEET_AGENT_PID                 the agent's pid: a worker whose parent is gone stops itself
MACFLEET_AGENT_FD                  a pipe that only the agent can write to, and never does: at its
                                   EOF the rank's keeper stops the rank's process group
MACFLEET_JOB_SECRET                per-job HMAC key; ``macfleet.init`` removes it from
                                   ``os.environ`` so the script's own children never see it
MACFLEET_SHM_DIR                   the agent's per-job directory (shared-memory segment, error files)
MACFLEET_RANK_PID                  set by the rank's bootstrap to its own pid: a process that sees
                                   another pid is a subprocess of the rank (a DataLoader worker)
GLOO_SOCKET_IFNAME                 the data address's interface, for scripts using gloo themselves
OMP_WAIT_POLICY                    PASSIVE: spinning OpenMP threads starve the communication threads
COLUMNS, LINES                     the launcher's terminal, less the ``[rank K]`` prefix, where the
                                   launcher's output is one (progress bars fill the line)
MALLOC_MMAP_THRESHOLD_,            32 and 64 MiB: glibc keeps freed ZeroMQ messages for reuse
MALLOC_TRIM_THRESHOLD_             instead of page-faulting fresh memory for every one
PYTORCH_MPS_HIGH_WATERMARK_RATIO,  set by the agent before the child imports torch, because
PYTORCH_MPS_LOW_WATERMARK_RATIO,   torch reads them once, at import or first MPS use; a
PYTORCH_ENABLE_MPS_FALLBACK        watermark the user set is kept, and the other fitted to it
                                   (``mps_watermarks``; again at init, for plain ``python``)
=================================  ==========================================================

Tuning knobs a user may set (forwarded to every host): ``MACFLEET_STREAMS`` (socket pairs per
ring direction), ``MACFLEET_CHUNK_BYTES`` (pipeline chunk), ``MACFLEET_SMALL_BYTES`` (below
this an all-reduce on a ring takes the one-pass latency path; one host's ranks use shared
memory for every size), ``MACFLEET_SHM=0`` (no shared memory),
``MACFLEET_SHM_SLOT_BYTES`` (shared-memory slot per rank), ``MACFLEET_SHM_GATHER_BYTES`` (where a
host's ranks' tensors come to at most this much together, every rank reduces all of them itself,
after one barrier), ``MACFLEET_SHM_OBJECTS`` (``1``:
segments are POSIX shared-memory objects, the default on macOS; ``0``: files in the agent's
directory), ``MACFLEET_MIN_PART_BYTES`` (a large all-reduce over sockets runs in parts at once,
one per socket pair, each at least this much per rank), ``MACFLEET_INLINE_BYTES`` (up to this size a collective's host arithmetic runs on
its own thread, not on torch's OpenMP team; a
ring over sockets compares the pieces it adds), ``MACFLEET_ZERO_COPY_BYTES`` (a ring over
sockets sends pieces at least this large without copying them),
``MACFLEET_SCRATCH_DIR`` (where each host's agent makes the job's directory of error files and
segment files; default /dev/shm where it exists, a RAM filesystem, else the temp dir),
``MACFLEET_TIMEOUT`` (seconds a
collective may make no progress), ``MACFLEET_RENDEZVOUS_TIMEOUT``, ``MACFLEET_CONNECT_TIMEOUT``
(seconds the ring's connections may take to come up once every rank has joined; default 30).

A script run with plain ``python train.py`` has none of these and gets world size 1.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, MutableMapping

from macfleet.errors import ConfigError

DEVICES = ("auto", "mps", "cuda", "cpu")

# The variables the agent sets for each rank over ``--env``'s: a value given there was dropped
# without a word. Each with what to do instead; ``launch`` refuses them in ``--env``.
_THE_JOBS = "it is the job's own; leave it out"
AGENT_SETS: dict[str, str] = {
    **dict.fromkeys(("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"), "give --nproc, --hosts or --hostfile"),
    **dict.fromkeys(("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE"),
                    "rank 0's agent serves the job's torch.distributed store there; leave it out"),
    "MACFLEET_DEVICE": "give --device", "MACFLEET_SEED": "give --seed",
    "MACFLEET_DATA_ADDR": "give --data-addr or --data-iface",
    **dict.fromkeys(("MACFLEET_COORDINATOR", "MACFLEET_JOB_ID", "MACFLEET_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT",
                     "MACFLEET_ERROR_FILE", "MACFLEET_STACKS_FILE", "MACFLEET_HOST", "MACFLEET_AGENT_PID",
                     "MACFLEET_AGENT_FD", "MACFLEET_SHM_DIR", "MACFLEET_JOB_SECRET"), _THE_JOBS),
}


def physical_memory() -> int | None:
    """This host's memory in bytes (on a Mac, its GPU's too), or None where the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def shared_memory_fraction(processes: int) -> float | None:
    """Each process's share of a GPU's memory by default, where ``processes`` share the GPU:
    0.9 of it split evenly, the rest left to the system (a Mac's GPU memory is the machine's).
    None, no cap, for a process that has its GPU to itself."""
    return round(0.9 / processes, 4) if processes > 1 else None


MPS_HIGH, MPS_LOW = "PYTORCH_MPS_HIGH_WATERMARK_RATIO", "PYTORCH_MPS_LOW_WATERMARK_RATIO"


def mps_watermarks(fraction: float | None, env: Mapping[str, str]) -> dict[str, str]:
    """What to add to a rank's environment ``env`` for torch's MPS allocator: its hard cap (the
    high watermark) at ``fraction`` of the GPU's memory, and the level where it starts to free
    its cache (the low one) at 0.8 of the lowest cap. torch reads both once, at the first MPS
    allocation, so they must be set before the rank starts (mps-facts.md section 2).

    A value the user set (in their environment or with --env) is kept, and the other is made to
    fit it: torch stops the rank at its first allocation with "invalid low watermark ratio" where
    the low watermark is above the high one (or above 2.0 where the high one is 0, no cap), so a
    high one under 1.4 (torch's default low one) set alone fails too. A user's high watermark of
    0.3 with two ranks on a Mac (a share of 0.45 each) gets a low one of 0.24, not 0.36; a user's
    low one of 0.5 gets a high one of 0.5, not 0.45 (the rank's ``set_per_process_memory_fraction``
    at init brings the cap down to its share, which torch does not check against the low one)."""
    high, low = _ratio(env.get(MPS_HIGH)), _ratio(env.get(MPS_LOW))
    out: dict[str, str] = {}
    if MPS_HIGH not in env and fraction is not None:
        high = max(fraction, low or 0.0)
        out[MPS_HIGH] = str(high)
    caps = [cap for cap in (high, fraction) if cap]  # 0 and None are no cap
    if MPS_LOW not in env and caps:
        out[MPS_LOW] = str(round(0.8 * min(caps), 4))
    return out


def mps_cap(fraction: float | None, env: Mapping[str, str]) -> float | None:
    """A rank's cap on a Mac: its share ``fraction``, or a high watermark of the user's own where
    that is lower (0.3 of a 16 GB MacBook's memory, set so that it never pages: the share would
    raise it). One above the share, or 0 (no cap), does not lift the share: --memory-fraction
    does. The agent sets the high watermark to the share where the user set none
    (``mps_watermarks``), so one below the share is the user's."""
    high = _ratio(env.get(MPS_HIGH))
    return min(fraction, high) if fraction is not None and high else fraction


def fit_mps_watermarks(fraction: float | None, environ: MutableMapping[str, str]) -> None:
    """A rank's ``environ``, at init on a Mac (before its first MPS allocation, where torch reads
    the watermarks), made one that torch's MPS allocator takes: the watermarks fitted as the
    agent fits them (``mps_watermarks``: under plain ``python`` no agent did), or ConfigError
    where what the user set cannot be, saying what to change. torch's own words ("invalid low
    watermark ratio 0.5") name neither the variable nor the other value."""
    environ.update(mps_watermarks(fraction, environ))
    problem = _watermark_problem(environ)
    if problem:
        raise ConfigError(problem)


def _watermark_problem(env: Mapping[str, str]) -> str | None:
    """What torch's MPS allocator would refuse in ``env`` (fitted: with one watermark set, the
    other fits it, so what is left is a user's pair, a low one above the high one, or a value
    outside torch's 0..2); None where it takes it. torch's default high one, 1.7, stands for an
    unset one."""
    high, low = env.get(MPS_HIGH), env.get(MPS_LOW)
    cap, floor = _number(high), _number(low)
    if cap is not None and not 0 <= cap <= 2:
        return (f"{MPS_HIGH}={high} is outside 0..2, which torch's MPS allocator refuses at its first allocation "
                f"(\"invalid high watermark ratio\"): it is a fraction of the GPU memory macOS recommends "
                f"(recommendedMaxWorkingSetSize), up to 2.0, or 0.0 for no cap")
    limit = 1.7 if cap is None else cap or 2.0  # 0: no cap, and torch then takes a low one up to 2
    if floor is not None and not 0 <= floor <= limit:
        if floor < 0:
            above = "is negative"
        elif cap is None:
            above = "is above torch's default high watermark, 1.7"
        elif cap:
            above = f"is above {MPS_HIGH}={high}"
        else:
            above = "is above 2.0"
        return (f"{MPS_LOW}={low} {above}, which torch's MPS allocator refuses at its first allocation (\"invalid "
                f"low watermark ratio\"): the low watermark, where torch starts to free its cache, must be from 0 "
                f"to the high one, the cap; set it lower, or unset it and macfleet fits it to the cap")
    return None


def _number(text: str | None) -> float | None:
    try:
        return None if text is None else float(text)
    except ValueError:
        return None  # torch reads what strtod makes of it: not ours to judge


def _ratio(text: str | None) -> float | None:
    """A watermark's value, or None where it is unset or no value torch takes."""
    value = _number(text)
    return value if value is not None and 0 <= value <= 2 else None  # else _watermark_problem says so


def oversubscribed(fraction: float, processes: int, device: str) -> str | None:
    """A warning where ``--memory-fraction`` lets the ``processes`` that share ``device`` ask
    for more than all of its memory together (mps-facts.md, rule 4: their shares should add up
    to 1 at most, less room for the host's own use); None where they fit."""
    if fraction * processes <= 1:
        return None
    return (f"warning: --memory-fraction {fraction:g} for each of the {processes} ranks that share {device} lets "
            f"them ask for {fraction * processes:.2f} times its memory together: past what it has, they run out of "
            f"memory (CUDA) or the machine pages (a Mac, whose GPU memory is the machine's: many times slower). "
            f"Give at most {int(1000 / processes) / 1000:g} (without it each gets "
            f"{shared_memory_fraction(processes):g}), or run fewer ranks on it")


@dataclass(frozen=True)
class WorkerEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    coordinator: str | None = None
    job_id: str = "local"
    restart_count: int = 0
    device: str = "auto"
    seed: int = 0
    memory_fraction: float | None = None
    error_file: str | None = None
    data_addrs: tuple[str, ...] = ("127.0.0.1",)  # the main one first
    shares: tuple[int, ...] | None = None  # None: an equal part each
    host: str = "localhost"
    agent_pid: int | None = None
    secret: bytes = b""

    @property
    def distributed(self) -> bool:
        return self.coordinator is not None and self.world_size > 1

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> "WorkerEnv":
        env = os.environ if environ is None else environ

        def integer(name: str, default: int) -> int:
            raw = env.get(name)
            if raw is None or raw == "":
                return default
            try:
                return int(raw)
            except ValueError:
                raise ConfigError(f"{name}={raw!r} is not an integer") from None

        fraction_raw = env.get("MACFLEET_MEMORY_FRACTION")
        fraction: float | None = None
        if fraction_raw:
            try:
                fraction = float(fraction_raw)
            except ValueError:
                raise ConfigError(f"MACFLEET_MEMORY_FRACTION={fraction_raw!r} is not a number") from None
            if not 0.0 <= fraction <= 1.0:
                raise ConfigError(f"MACFLEET_MEMORY_FRACTION={fraction_raw} must be within [0, 1]")
        device = env.get("MACFLEET_DEVICE", "auto") or "auto"
        if device not in DEVICES:
            raise ConfigError(f"MACFLEET_DEVICE={device!r}: choose one of {', '.join(DEVICES)}")
        world_size = integer("WORLD_SIZE", 1)
        shares_raw = env.get("MACFLEET_SHARES")
        shares = None
        if shares_raw:
            parts = shares_raw.split(",")
            if len(parts) != world_size or not all(p.strip().isdigit() and int(p) >= 1 for p in parts):
                raise ConfigError(f"MACFLEET_SHARES={shares_raw!r} must be {world_size} whole numbers above 0, "
                                  f"one per rank")
            shares = tuple(int(p) for p in parts)
        parsed = cls(
            rank=integer("RANK", 0),
            world_size=world_size,
            local_rank=integer("LOCAL_RANK", 0),
            local_world_size=integer("LOCAL_WORLD_SIZE", 1),
            coordinator=env.get("MACFLEET_COORDINATOR") or None,
            job_id=env.get("MACFLEET_JOB_ID", "local") or "local",
            restart_count=integer("MACFLEET_RESTART_COUNT", 0),
            device=device,
            seed=integer("MACFLEET_SEED", 0),
            memory_fraction=fraction,
            error_file=env.get("MACFLEET_ERROR_FILE") or None,
            data_addrs=tuple(a for a in env.get("MACFLEET_DATA_ADDR", "").split(",") if a) or ("127.0.0.1",),
            host=env.get("MACFLEET_HOST", "localhost") or "localhost",
            agent_pid=integer("MACFLEET_AGENT_PID", 0) or None,
            secret=bytes.fromhex(env.get("MACFLEET_JOB_SECRET", "")),
            shares=shares,
        )
        if not 0 <= parsed.rank < parsed.world_size:
            raise ConfigError(f"RANK={parsed.rank} is outside WORLD_SIZE={parsed.world_size}")
        return parsed
