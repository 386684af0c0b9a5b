"""The control protocol: what launcher, agents and workers say to each other.

Everything here crosses a process (and often a host) boundary, so it is plain data:
dataclasses that travel as JSON or msgpack maps, and message kinds as strings.

Flow of one job::

    agent  -> coordinator   hello    {host_index, facts, master_port}
    coord  -> agent         start    {master_addr, master_port}        (once every agent said hello)
    worker -> coordinator   register {rank, endpoints, pid, host,      (endpoints: its rings' sockets,
                                      data_addr, local_rank, device}   none for a Mac's later ranks)
    coord  -> worker        peers    {table}                           (once every rank registered)
    worker/agent -> coord   beat     {progress, waiting, quiet_s,      (every HEARTBEAT_S; a worker's
                                      held}                            collective in progress, how long
                                                                       since data reached it, why it
                                                                       waits for a person: pdb, input())
    agent  -> coordinator   exit     {rank, pid, code, signal, error,  (per worker exit, once its last
                                      tail}                            lines are read)
    coord  -> agent 0       end      {}                                (every rank has exited: it may
                                                                       close the torch.distributed store)
    agent  -> coordinator   done     {}                                (all its workers have exited)
    worker -> coordinator   bye      {last_op, waited_s, ran_s,        (shutdown: stop watching my beats;
                                      step_s, share, stood_by_s}       DataParallel's work per step, share,
                                                                       time out of batches in join())
    worker -> coordinator   report   {rank, data}                      (measurements, for macfleet doctor)
    worker -> coordinator   dataset  {site, made, length,              (a DistributedSampler, the made-th
                                      subset, order}                   made at line site: its dataset's
                                                                       length, a Subset's digest, its
                                                                       options; the ranks' must agree)
    worker -> coordinator   batch    {forward, digest, told}           (at each of a rank's first training
                                                                       forwards: a digest of its inputs,
                                                                       ``macfleet.batches``; the ranks'
                                                                       should differ)
    worker -> coordinator   sources  {files, round}                    (a host's first rank, at init (1) and
                                                                       its first training step (2): the
                                                                       digests of the script's own modules
                                                                       it imported, ``macfleet.sources``)
    worker -> coordinator   trace    {events, dropped}                 (with launch --timeline: what it
                                                                       recorded since, ``macfleet.timeline``)
    coord  -> agent         beat     {}                                (every HEARTBEAT_S: the launcher lives)
    coord  -> agent         stdin    {data, eof}                       (the launcher's stdin, for every rank)
    coord  -> everyone      abort    {reason, rank}                    (any failure, or Ctrl-C)
    coord  -> worker        hold     {on}                              (a rank waits for a person, or no
                                                                       longer: waits for it have no deadline)
    coord  -> worker        stacks   {}                                (a stall names it: where is it?)
    worker -> coordinator   stacks   {rank, text, cpu_s, outside}      (its threads' stacks, its and its
                                                                       children's processor time, what its
                                                                       main thread waits on: whereabouts)
    coord  -> agents        stacks   {rank}                            (a rank went silent: dump its stacks)
    agent  -> coordinator   stacks   {rank, text}                      (faulthandler's dump of them, tidied)

An exit is cut to fit one message (``WorkerExit.fitted``): a header holds 16 KiB.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any

HELLO = "hello"
START = "start"
REGISTER = "register"
PEERS = "peers"
BEAT = "beat"
EXIT = "exit"
DONE = "done"
END = "end"
ABORT = "abort"
BYE = "bye"
REPORT = "report"
DATASET = "dataset"
BATCH = "batch"
BATCH_FORWARDS = 3  # a rank's first training forwards noted in batch messages (``macfleet.batches``)
SOURCES = "sources"
STDIN = "stdin"
HOLD = "hold"
TRACE = "trace"
STACKS = "stacks"  # to a rank: say where your threads are; to an agent {rank}: dump them; from either: where

HEARTBEAT_S = 1.0
# Control messages are small; anything bigger is an attack or a bug (libzmq would otherwise
# allocate whatever size a peer declares).
CONTROL_MAX_BYTES = 1 << 20


@dataclass
class AgentSpec:
    """What the launcher tells one agent, as one JSON line on the agent's stdin.

    The secret travels here (stdin, over ssh for remote hosts), never in argv.
    """

    job_id: str
    coordinator: str
    secret_hex: str
    host_index: int
    host: str
    # The addresses its ranks train over, the main one first; several where each cable has a
    # subnet of its own. Empty: the address this host routes to the coordinator from.
    data_addrs: list[str]
    rank_base: int
    slots: int
    world_size: int
    script: str
    args: list[str]
    device: str = "auto"
    seed: int = 0
    memory_fraction: float | None = None
    cwd: str = "."
    python: str = "python3"
    restart_count: int = 0
    env: dict[str, str] = field(default_factory=dict)
    grace_s: float = 3.0
    prefix_host: bool = False  # several hosts: prefix lines with the host too
    data_iface: str | None = None  # bind the data plane to this interface's address instead
    heartbeat_timeout_s: float = 10.0  # the agent stops its ranks when the launcher is silent this long
    log_dir: str | None = None  # also write each rank's output to rank-K.log here (relative to cwd)
    show_ranks: list[int] | None = None  # the ranks whose output reaches the terminal (None: all)
    neighbour_addrs: list[str] = field(default_factory=list)  # the data addresses of the hosts before and after

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "AgentSpec":
        return cls(**json.loads(text))


@dataclass
class WorkerExit:
    """One training process's end, as the agent saw it."""

    rank: int
    host: str
    pid: int
    code: int  # exit status; 128 + signal number when killed by a signal
    signal: str | None
    time: float
    error: dict[str, Any] | None = None  # the error file's JSON, if the process wrote one
    tail: list[str] = field(default_factory=list)  # last stderr lines, when there is no error file
    stopped: str | None = None  # why its agent stopped it, when the agent did so on its own
    peak_rss: int | None = None  # bytes: the most memory the process held resident at once
    host_memory: int | None = None  # bytes: the host's physical memory

    def to_fields(self) -> dict[str, Any]:
        return asdict(self)

    def fitted(self) -> "WorkerExit":
        """This exit cut to fit one control message (a header of at most 16 KiB). An exception
        whose message holds a tensor's repr, or a stderr line with no end, made it larger: the
        coordinator dropped it, and the job waited for an exit that never came. The start and
        the end of each text are kept (a traceback ends with the exception), and the last lines
        of the tail."""
        error = None if self.error is None else {
            key: _cut(value, ERROR_BYTES.get(key, FIELD_BYTES)) if isinstance(value, str)
            else value for key, value in self.error.items()}
        tail: list[str] = []
        for line in reversed(self.tail):
            line = _cut(line, FIELD_BYTES)
            if sum(len(t.encode()) for t in tail) + len(line.encode()) > TAIL_BYTES:
                break
            tail.insert(0, line)
        return replace(self, error=error, tail=tail, stopped=_cut(self.stopped, FIELD_BYTES) if self.stopped else None)

    @classmethod
    def from_fields(cls, fields: dict[str, Any]) -> "WorkerExit":
        names = cls.__dataclass_fields__
        picked = {k: fields[k] for k in names if k in fields}
        picked["tail"] = list(picked.get("tail") or ())
        return cls(**picked)


FIELD_BYTES, TAIL_BYTES = 1 << 10, 4 << 10  # of an exit: well inside a header, with these
ERROR_BYTES = {"traceback": 6 << 10, "collectives": 2 << 10}
# The last line of a rank's collectives in its error report when it failed while it stood by
# inside DataParallel.join() (``History.note``): the launcher's report then says what that means.
STOOD_BY = "(this rank had run out of batches and stood by for the others inside DataParallel.join())"
# What marks, in that list, the collective the rank left by an exception (``History.lines``):
# the launcher's report reads which collective each rank failed in (``hints``).
FAILED_HERE = " [failed here]"


def _cut(text: str, limit: int) -> str:
    """``text`` in at most about ``limit`` bytes of UTF-8: its first quarter and the rest from its end."""
    data = text.encode()
    if len(data) <= limit:
        return text
    head = limit // 4
    return (f"{data[:head].decode(errors='ignore')}\n... ({len(data) - limit} bytes cut) ...\n"
            f"{data[len(data) - (limit - head):].decode(errors='ignore')}")
