"""Process-wide state of a training process: ``init``, the collectives, ``shutdown``.

``init`` reads the environment contract (``macfleet.env``), picks and prepares the device,
seeds the generators, and, when launched with a coordinator, registers, receives the peer
table and opens the ring. A background thread keeps the control plane: it sends heartbeats
(with a progress counter, for stall detection), turns the coordinator's abort into an error
in every pending collective, and stops this process if its agent is gone.
"""

from __future__ import annotations

import atexit
import os
import queue
import shutil
import statistics
import sys
import threading
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
import zmq

from macfleet import backends, errorfile, hostops, knobs, protocol, segments, sources, timeline, whereabouts
from macfleet.arguments import check_all_gather, check_all_reduce, check_broadcast
from macfleet.collectives import LEFT, Collectives, error_line
from macfleet.control import ControlClient
from macfleet.env import WorkerEnv, fit_mps_watermarks, mps_cap, oversubscribed, shared_memory_fraction
from macfleet.errors import ConfigError, MacfleetError, ProtocolError, RendezvousError
from macfleet.history import History
from macfleet.ring_algorithms import SMALL_BYTES, ZERO_COPY_BYTES
from macfleet.shm import GATHER_BYTES, LocalGroup, default_slot_bytes, shared_cache_bytes
from macfleet.transport import Liveness, Ring

DEFAULT_TIMEOUT_S = 600.0  # MACFLEET_TIMEOUT
MAX_FRAME_BYTES = 8 << 20  # the largest chunk a peer may send (MAXMSGSIZE on data sockets)
RENDEZVOUS_TIMEOUT_S = 600.0  # MACFLEET_RENDEZVOUS_TIMEOUT
# Timeline events per control message: an event packs to about 250 bytes at the most
# (``timeline`` cuts names), and a message's header holds 16 KiB. 5 messages a turn of the
# control thread (20 turns a second) carry 5,000 events a second: a DataParallel step records
# two a bucket and three more. The launcher writes an event in about 5 us, so 8 ranks at that
# rate take a fifth of its time, and its heartbeats never queue behind a flood; faster, the
# rank keeps what it cannot send yet (``timeline.KEPT``), then counts the rest as left out.
TIMELINE_BATCH = 50
TIMELINE_MESSAGES = 5


@dataclass
class Runtime:
    env: WorkerEnv
    device: backends.Device
    collectives: Collectives | None
    control: "_ControlThread | None"
    ctx: zmq.Context | None  # the control plane's
    # The data plane's, apart: shutdown waits on it alone for the last sends to go out, while the
    # control thread still hears an abort; and heartbeats never queue behind a ring's I/O thread.
    data_ctx: zmq.Context | None = None
    pid: int = field(default_factory=os.getpid)  # a forked child inherits the runtime, not its ownership
    # the script's modules this host's first rank reported at init, in a job of several hosts,
    # until it reports those imported since (``note_sources_again``); None on the other ranks
    sources_sent: set[str] | None = None

    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def world_size(self) -> int:
        return self.env.world_size


_runtime: Runtime | None = None
_left: Runtime | None = None  # the job this process left (shutdown): its facts stay; its place is gone
_left_history: History | None = None  # its last collectives, for an error that shutdown raises


def init(device: str | None = None, streams: int | None = None, timeout_s: float | None = None) -> Runtime:
    """Join the job (or become a job of one). Idempotent: a second call returns the same runtime
    (one that asks for another device is refused: the first call chose it).

    ``device`` overrides ``MACFLEET_DEVICE``; ``streams`` is the number of socket pairs per
    ring direction, used by every ring (default ``MACFLEET_STREAMS``, else two-member rings
    use 2 and larger ones 1); ``timeout_s`` is how long a collective
    may make no progress before ``CollectiveTimeout`` (default ``MACFLEET_TIMEOUT`` or 600 s;
    a dead peer is reported within seconds regardless, through the coordinator).
    """
    global _runtime
    if _runtime is not None:
        # a second init(device="cuda") after a first that chose the CPU was taken, and the
        # script went on believing itself on the GPU
        if device not in (None, "auto") and device != _runtime.device.kind:
            raise ConfigError(f"macfleet.init(device={device!r}): this process joined the job on "
                              f"{_runtime.device.kind} at its first macfleet.init(), which chooses the device")
        return _runtime
    if _left is not None:  # joining again would wait for a rendezvous that is long over, unheard (no secret)
        raise ConfigError(LEFT)
    _refuse_subprocess_of_a_rank()
    env = WorkerEnv.from_environ()
    if env.coordinator is None and env.world_size > 1:
        # torchrun, mpirun or a scheduler set WORLD_SIZE, but no macfleet launcher started us:
        # going on alone would train every rank on its shard with nothing averaged, silently.
        raise ConfigError(
            f"WORLD_SIZE={env.world_size} is set, but this process was not started by macfleet launch "
            f"(MACFLEET_COORDINATOR is not set, as under torchrun): run the script with "
            f"`macfleet launch --nproc {env.world_size} SCRIPT`, or unset WORLD_SIZE to train in one process")
    wrong = knobs.problems(os.environ)  # now, before any socket or segment exists to be cleaned up
    if wrong:
        raise ConfigError("; ".join(wrong))
    os.environ.pop("MACFLEET_JOB_SECRET", None)  # the script's own subprocesses have no business with it
    dev = backends.select(device or env.device, env.local_rank)
    fraction, processes = env.memory_fraction, dev.processes_on_it(env.local_world_size)
    if fraction is None:  # no --memory-fraction: the launcher's default, which needs the device
        fraction = shared_memory_fraction(processes)
        if fraction is not None:
            os.environ["MACFLEET_MEMORY_FRACTION"] = str(fraction)  # as the contract says, for the script
    elif dev.kind != "cpu" and env.local_rank == dev.index:  # the first rank on its GPU says it, once
        warning = oversubscribed(fraction, processes, str(dev.torch_device))
        if warning:
            print(f"macfleet: {warning}", file=sys.stderr, flush=True)
    if dev.kind == "mps":  # before the first MPS allocation (apply_memory_fraction's), where torch reads them
        fit_mps_watermarks(fraction, os.environ)
        capped = mps_cap(fraction, os.environ)
        if capped != fraction:  # a lower cap of the user's own stands
            fraction = capped
            os.environ["MACFLEET_MEMORY_FRACTION"] = str(fraction)
    dev.apply_memory_fraction(fraction)
    dev.seed(env.seed + env.rank)
    if env.coordinator is None:  # plain `python train.py`: a job of one, nobody to talk to
        _runtime = Runtime(env, dev, None, None, None)
        return _runtime

    # Two socket pairs per direction by default: measured on 16 cores, a two-member ring ran
    # 1.1-1.5x faster with them; rings of more members only use the first (see Collectives).
    explicit = streams or knobs.count("MACFLEET_STREAMS", None)
    streams = explicit or 2
    if streams < 1:
        raise ConfigError(f"streams must be >= 1, not {streams}")
    # one I/O thread per ring socket (send and receive, both directions x streams), so no
    # socket waits on another's thread
    data_ctx = zmq.Context(io_threads=min(16, 4 * streams))
    liveness = Liveness()
    timeout_s = timeout_s or knobs.seconds("MACFLEET_TIMEOUT", DEFAULT_TIMEOUT_S)
    ring = local = leaders = None
    # Shared memory: this host's ranks reduce through one segment; across hosts only each host's
    # first rank joins a ring (of "leaders"). Every collective then takes those two, so no ring
    # of all ranks is made: its sockets, I/O threads and handshake would serve nothing.
    # MACFLEET_SHM=0 switches it off (pure ZeroMQ: the ring of all ranks).
    shm_dir = os.environ.get("MACFLEET_SHM_DIR")
    shared_memory = env.world_size > 1 and bool(shm_dir) and knobs.switch("MACFLEET_SHM", True)
    multi_host = env.world_size > env.local_world_size
    try:
        if env.world_size > 1 and not shared_memory:
            ring = Ring(data_ctx, env.rank, list(env.data_addrs), streams, MAX_FRAME_BYTES, env.secret, env.job_id,
                        liveness, timeout_s)
        if shared_memory and env.local_world_size > 1:
            slot_bytes = knobs.nbytes("MACFLEET_SHM_SLOT_BYTES", default_slot_bytes(
                env.local_world_size, shared_cache_bytes(), os.cpu_count()))  # the same on every rank of a host
            local = LocalGroup(shm_dir or "", env.job_id, env.rank - env.local_rank, env.local_world_size,
                               env.local_rank, slot_bytes, liveness, timeout_s, objects=segments.use_objects(),
                               gather_bytes=knobs.nbytes("MACFLEET_SHM_GATHER_BYTES", GATHER_BYTES))
        if shared_memory and multi_host and env.local_rank == 0:
            leaders = Ring(data_ctx, env.rank, list(env.data_addrs), streams, MAX_FRAME_BYTES, env.secret, env.job_id,
                           liveness, timeout_s, name="h")
    except BaseException:
        data_ctx.destroy(linger=0)
        raise
    endpoints = {**(ring.endpoints() if ring else {}), **(leaders.endpoints() if leaders else {})}
    ctx = zmq.Context()
    control = _ControlThread(ctx, env, liveness, str(dev.torch_device))
    control.start()
    try:
        table, local_ranks = control.register(endpoints)
        if ring is not None:
            ring.connect(table, list(range(env.world_size)))
            ring.handshake()
        if local is not None:
            local.attach()
        if leaders is not None:
            leaders.connect(table, sorted(r for r, lr in local_ranks.items() if lr == 0))
            leaders.handshake()
    except BaseException:
        control.stop()
        for closable in (ring, local, leaders):
            if closable is not None:
                closable.close()
        ctx.destroy(linger=0)
        data_ctx.destroy(linger=0)
        raise
    collectives = None
    if env.world_size > 1:
        collectives = Collectives(
            env.rank, env.world_size, liveness, ring,
            chunk_bytes=min(MAX_FRAME_BYTES, knobs.nbytes("MACFLEET_CHUNK_BYTES", 4 << 20)),
            small_bytes=knobs.nbytes("MACFLEET_SMALL_BYTES", SMALL_BYTES),
            min_part_bytes=knobs.nbytes("MACFLEET_MIN_PART_BYTES", 256 << 10),
            inline_bytes=knobs.nbytes("MACFLEET_INLINE_BYTES", hostops.INLINE_BYTES),
            zero_copy_bytes=knobs.nbytes("MACFLEET_ZERO_COPY_BYTES", ZERO_COPY_BYTES),
            local=local, leaders=leaders, shared_memory=shared_memory, all_streams=explicit is not None,
        )
        control.status = collectives.status
    _runtime = Runtime(env, dev, collectives, control, ctx, data_ctx)
    atexit.register(shutdown)
    if multi_host and env.local_rank == 0:  # each Mac runs its own copy of the script's modules
        files = sources.imported_here()
        control.outbox.put((protocol.SOURCES, {"files": files, "round": 1}))
        _runtime.sources_sent = set(files)
    return _runtime


def note_sources_again() -> None:
    """At the first training step, once: the host's first rank reports the script's modules it
    has imported since ``init`` (a script that calls ``macfleet.init()`` first, then imports its
    model), for the launcher to compare as it compared those of ``init``."""
    rt = _runtime
    if rt is None or rt.sources_sent is None or rt.control is None:
        return
    since = {name: digest for name, digest in sources.imported_here().items() if name not in rt.sources_sent}
    rt.sources_sent = None
    rt.control.outbox.put((protocol.SOURCES, {"files": since, "round": 2}))


def _refuse_subprocess_of_a_rank() -> None:
    """A process the rank started (a DataLoader worker started with 'spawn', macOS's default,
    re-runs the script's top level) has the rank's environment, but the rank already holds
    that place in the job: joining again would take it over, and the control thread, seeing
    that its parent is not the agent, took it for an orphan and killed the whole group."""
    owner = os.environ.get("MACFLEET_RANK_PID")
    if not owner or owner == str(os.getpid()):
        return
    rank = os.environ.get("RANK", "?")
    if _rerunning_the_script():
        error = ConfigError(
            f"macfleet.init() was called in a subprocess of rank {rank} (pid {owner}), such as a DataLoader "
            f"worker, which re-runs the script's top level when started with 'spawn' (the default on macOS): "
            f"only the rank's own process joins the job. Call macfleet.init() and train under "
            f"`if __name__ == \"__main__\":` (a worker can read its rank from the RANK variable)")
    else:  # a function the process was started with: the DDP script that spawns its own workers
        error = ConfigError(
            f"macfleet.init() was called in a process that rank {rank} (pid {owner}) started, as "
            f"torch.multiprocessing.spawn starts a DDP script's workers: under macfleet launch each rank is "
            f"one process already, and only the rank's own joins the job. Call the training function in the "
            f"script itself (mp.spawn(main, nprocs=N) becomes main(macfleet.local_rank(), ...)) and give "
            f"macfleet launch --nproc N")
    path = os.environ.get("MACFLEET_ERROR_FILE")
    if path and not os.path.exists(path):  # the rank's report then names this, not "DataLoader worker exited"
        try:
            errorfile.write(path, error)
        except OSError:
            pass
    raise error


def _rerunning_the_script() -> bool:
    """Whether this process is re-running the script's top level, as multiprocessing's 'spawn'
    does in every process it starts (it imports the script as ``__mp_main__``), rather than
    running a function it was started with."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == "__mp_main__":
            return True
        frame = frame.f_back
    return False


def runtime() -> Runtime:
    rt = _runtime
    if rt is None:
        return init()
    if rt.pid != os.getpid() and rt.collectives is not None:
        # A forked child (a DataLoader worker on Linux, or with the 'fork' start method) has the
        # rank's runtime, sockets and shared memory, copied: collectives there ran beside the
        # rank's own, through its sockets and slots, and mixed their bytes.
        raise ConfigError(
            f"a collective in a subprocess of rank {rt.rank} (pid {rt.pid}), such as a DataLoader worker: only "
            f"the rank's own process takes part in the job's collectives. Reduce in the training loop, on what "
            f"the loader returns (macfleet.rank() and macfleet.world_size() still answer here)")
    return rt


def recent_collectives() -> list[str]:
    """This rank's last collectives and the lines that called them, for its exit report."""
    rt = _runtime
    if rt is not None and rt.collectives is not None:
        return rt.collectives.history.lines()
    return _left_history.lines() if _left_history is not None else []


def _orphaned(env: WorkerEnv) -> bool:
    """True if our agent is gone; then we remove its per-job directory (error files, shared
    memory) ourselves, since it no longer can."""
    if not env.agent_pid or os.getppid() == env.agent_pid:
        return False
    directory = os.environ.get("MACFLEET_SHM_DIR", "")
    segments.release(directory)
    shutil.rmtree(directory, ignore_errors=True)
    return True


def script_failed(exc: BaseException) -> None:
    """The script has ended by ``exc`` (the bootstrap calls this): the heartbeats say so, for
    as long as the process has not exited."""
    rt = _runtime
    if rt is not None and rt.collectives is not None and os.getpid() == rt.pid:
        rt.collectives.ended = error_line(exc)


def shutdown() -> None:
    """Deliver what this rank still sends, close sockets and stop the control thread. Safe to
    call twice."""
    global _runtime, _left, _left_history
    rt, _runtime = _runtime, None
    if rt is None or rt.pid != os.getpid():
        return  # nothing to close; or a forked child's exit, whose sockets and job directory are its parent's
    _left = Runtime(rt.env, rt.device, None, None, None)  # what it was, without the means (buffers, sockets)
    if rt.ctx is None:
        # a job of one (plain `python train.py`) has nothing to close, but has left all the same: a
        # collective after this ran there and was refused only under the launcher
        return
    _orphaned(rt.env)
    _left_history = rt.collectives.history if rt.collectives is not None else None
    if rt.collectives is not None:
        rt.collectives.refuse_new()
    mismatch = _last_answers(rt)
    _close_data_plane(rt)
    if rt.control is not None:
        # a finished rank is not a hung one; its last collective tells a rank still waiting in a
        # later one that it waits in vain
        bye: dict[str, Any] = {"last_op": 0}
        c = rt.collectives
        if c is not None:  # how much of its time it waited, and how fast it trained, for the launcher's pace line
            bye = {"last_op": c.last_op, "waited_s": c.waited_s, "ran_s": time.monotonic() - c.started - c.stood_by_s,
                   "step_s": statistics.median(c.step_work_s) if c.step_work_s else None,
                   "share": c.step_share, "stood_by_s": c.stood_by_s, "broken": c.broken}
        rt.control.outbox.put((protocol.BYE, bye))
        rt.control.stop()
    rt.ctx.destroy(linger=0)
    if mismatch is not None:
        raise mismatch


def _last_answers(rt: Runtime) -> ProtocolError | None:
    """The answers to this rank's last broadcasts as their source (``Channel.expect_answer``)
    that no later collective has read: where ranks named different sources for the script's
    last broadcast, the error that says so, raised once the rank has left the job (the
    bootstrap reports it, and the rank exits 1). While the job is healthy only: a peer that is
    gone, or an abort, is another rank's failure, not this one's."""
    collectives, control = rt.collectives, rt.control
    if collectives is None or control is None or control.liveness.reason is not None:
        return None
    due = min((op for ring in collectives.rings for op in ring.answers_due()), default=0)
    try:
        with collectives.waiting():  # for the others, as in a collective (the pace line's shares)
            for ring in collectives.rings:  # first what this rank owes: the others may be waiting for it
                ring.send_owed()
            for ring in collectives.rings:
                ring.read_answers()
    except ProtocolError as exc:
        collectives.history.failed_in = due  # the broadcast it is about, in the report's list
        return exc
    except MacfleetError:
        pass  # the job is failing (a peer lost, an abort, a timeout): the others' reports say why
    return None


def _close_data_plane(rt: Runtime) -> None:
    """Close the ring sockets once what they still hold has gone out.

    A collective may return before its last messages have left: a broadcast's source and a rank
    that passes a chunk on wait for nobody (each rank waits only for what it receives). Dropped
    at exit, they never reached the others: over a 100 Mbit/s link a rank that broadcast 8 MiB
    and ended left the others waiting until the stall report. While the job is healthy they get
    the collective timeout to go out; a peer that is gone takes its queue with it (ZeroMQ drops
    the connection's pipe), and an abort that arrives meanwhile (the control thread still runs)
    ends the wait. If the agent dies meanwhile, the control thread stops this process."""
    control, collectives, data_ctx = rt.control, rt.collectives, rt.data_ctx
    healthy = control is not None and control.liveness.reason is None
    if collectives is not None:
        collectives.close()
        for ring in collectives.rings:
            ring.close(flush=healthy)
        if collectives.local is not None:
            collectives.local.close()
    if data_ctx is None:
        return
    flushed = threading.Event()

    def term() -> None:
        data_ctx.term()  # returns once every socket's linger is over: delivered, or timed out
        flushed.set()

    threading.Thread(target=term, name="macfleet-flush", daemon=True).start()
    # for the network, as in a collective: over a slow link this is a rank's last seconds, which
    # the pace line took for the rank's own work
    with collectives.waiting() if collectives is not None else nullcontext():
        while not flushed.wait(0.05):
            if control is None or control.liveness.reason is not None:
                return  # the job is going down: what is left matters to nobody


class _ControlThread(threading.Thread):
    """Owns this process's control socket; the main thread talks to it through queues."""

    def __init__(self, ctx: zmq.Context, env: WorkerEnv, liveness: Liveness, device: str) -> None:
        super().__init__(name="macfleet-control", daemon=True)
        self.env, self.device = env, device
        self.liveness = liveness
        self.client = ControlClient(ctx, env.coordinator or "", env.secret, env.job_id, f"rank-{env.rank}")
        self.outbox: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        self.inbox: queue.Queue[dict[str, Any]] = queue.Queue()
        self.status: Callable[[], dict[str, Any]] = lambda: {"progress": 0}
        self._stopping = threading.Event()

    def register(self, endpoints: dict[str, str]) -> tuple[dict[int, dict[str, str]], dict[int, int]]:
        """Publish our endpoints; return every rank's endpoints and local rank, once all registered."""
        self.outbox.put((protocol.REGISTER, {"rank": self.env.rank, "endpoints": endpoints, "pid": os.getpid(),
                                             "host": self.env.host, "data_addr": ",".join(self.env.data_addrs),
                                             "local_rank": self.env.local_rank, "device": self.device,
                                             "mps_available": backends.mps_available()}))
        limit = knobs.seconds("MACFLEET_RENDEZVOUS_TIMEOUT", RENDEZVOUS_TIMEOUT_S)
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            self.liveness.check()
            try:
                reply = self.inbox.get(timeout=0.1)
            except queue.Empty:
                continue
            if reply.get("kind") == protocol.PEERS:
                rows = reply["table"]
                return {int(row[0]): dict(row[1]) for row in rows}, {int(row[0]): int(row[2]) for row in rows}
        raise RendezvousError(
            f"rank {self.env.rank}: not every rank registered within {limit:.0f} s "
            f"(coordinator {self.env.coordinator})"
        )

    def run(self) -> None:
        next_beat = 0.0
        try:
            while not self._stopping.is_set():
                while not self.outbox.empty():
                    kind, fields = self.outbox.get_nowait()
                    self.client.send(kind, **fields)
                self._send_timeline(TIMELINE_MESSAGES)
                now = time.monotonic()
                if now >= next_beat:
                    self.client.send(protocol.BEAT, **self.status(), held=whereabouts.held_by_user())
                    next_beat = now + protocol.HEARTBEAT_S
                    self._check_parent()
                msg = self.client.recv(0.05)
                if msg is None:
                    continue
                if msg.get("kind") == protocol.ABORT:
                    rank = msg.get("rank")
                    self.liveness.abort(str(msg.get("reason", "aborted")), rank if rank != self.env.rank else None)
                elif msg.get("kind") == protocol.HOLD:
                    self.liveness.held = bool(msg.get("on"))
                elif msg.get("kind") == protocol.STACKS:  # the others wait for us, and we are elsewhere
                    # with the processor time used so far, and what it waits on: a rank that works
                    # tells itself from a stuck one (whereabouts)
                    self.client.send(protocol.STACKS, rank=self.env.rank, text=whereabouts.stacks(),
                                     cpu_s=whereabouts.processor_s(), outside=whereabouts.waits_outside())
                else:
                    self.inbox.put(msg)
        finally:
            self._send_timeline(None)
            while not self.outbox.empty():  # e.g. the goodbye queued by shutdown()
                kind, fields = self.outbox.get_nowait()
                self.client.send(kind, **fields)
            self.client.close()

    def _send_timeline(self, most: int | None) -> None:
        """The timeline's events recorded since the last call (``macfleet.timeline``), in
        messages of ``TIMELINE_BATCH``; at most ``most`` messages, so that a rank recording
        fast still hears an abort between them (None: all, at the end)."""
        recorder, sent = timeline.RECORDER, 0
        while recorder.on and (most is None or sent < most):
            events = recorder.take(TIMELINE_BATCH)
            if not events:
                break
            try:
                self.client.send(protocol.TRACE, events=events, dropped=recorder.dropped)
            except zmq.Again:  # the launcher is that far behind: a gap in the timeline, not a stall
                recorder.dropped += len(events)
            sent += 1

    def _check_parent(self) -> None:
        # The agent is our parent. If it died (SIGKILL, lost host), nobody will stop us: stop
        # ourselves and anything we started (we lead our own process group).
        if _orphaned(self.env):
            try:
                os.killpg(os.getpgid(0), 9)
            finally:
                os._exit(1)

    def stop(self) -> None:
        self._stopping.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=2)


# -- the public functions, on the process's runtime ----------------------------------------
def _facts() -> Runtime:
    """The runtime, for what this rank is: still known after it has left the job."""
    return _runtime or _left or init()


def rank() -> int:
    return _facts().rank


def world_size() -> int:
    return _facts().world_size


def local_rank() -> int:
    return _facts().env.local_rank


def shares() -> list[int]:
    """Each rank's part of every step, in rank order: ``share=`` of its host in the hostfile
    (equal parts where none is given). Pass it to ``DistributedSampler`` and ``DataParallel``,
    and scale this rank's batch by its own: a faster Mac's ranks then take more of each step.
    Follows the hosts: a job that goes on without one (``--min-hosts``) has the others' shares."""
    env = _facts().env
    return list(env.shares) if env.shares else [1] * env.world_size


def device() -> torch.device:
    """The torch device this process trains on."""
    return _facts().device.torch_device


def memory() -> dict[str, int]:
    """This process's device memory in bytes: ``allocated`` (held by tensors) and ``reserved``
    (held from the driver, the allocator's cache included); empty on a CPU."""
    return _facts().device.memory()


def empty_cache() -> None:
    """Give the device allocator's cached blocks back, e.g. once an epoch: on a Mac its ranks
    share one memory, and the MPS cache keeps blocks of every shape it has seen."""
    _facts().device.empty_cache()


def all_reduce(tensor: torch.Tensor, op: str = "sum", name: str = "tensor", compression: str = "none") -> torch.Tensor:
    """Reduce ``tensor`` in place over all ranks (``sum``, ``avg``, ``max`` or ``min``) and return it.

    ``compression="fp16"|"bf16"`` halves the bytes on the network (the sum is still float32)."""
    rt = runtime()
    if rt.collectives is None:
        check_all_reduce(tensor, op, name, compression)
        return tensor
    return rt.collectives.all_reduce(tensor, op, name, compression)


def host_tensor(numel: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A zeroed flat CPU tensor that ``all_reduce`` reduces in place, with no copies in or out,
    where this host's ranks share memory. Every rank must call it, in the same order and with the
    same size (DataParallel's buckets live in such tensors)."""
    rt = runtime()
    if rt.collectives is None:
        return torch.zeros(numel, dtype=dtype, device="cpu")
    return rt.collectives.host_tensor(numel, dtype)


def broadcast(tensor: torch.Tensor, src: int = 0, name: str = "tensor") -> torch.Tensor:
    """Overwrite ``tensor`` on every rank with rank ``src``'s, in place, and return it."""
    rt = runtime()
    if rt.collectives is None:
        check_broadcast(tensor, src, 1, name)
        return tensor
    return rt.collectives.broadcast(tensor, src, name)


def all_gather(tensor: torch.Tensor, name: str = "tensor") -> torch.Tensor:
    """A new tensor of shape ``(world_size, *tensor.shape)`` holding every rank's ``tensor``."""
    rt = runtime()
    if rt.collectives is None:
        check_all_gather(tensor, name)
        return tensor.unsqueeze(0).clone()
    return rt.collectives.all_gather(tensor, name)


def report(data: dict[str, Any]) -> None:
    """Send small measurements to the launcher (``macfleet doctor`` uses this)."""
    rt = runtime()
    if rt.control is not None:
        rt.control.outbox.put((protocol.REPORT, {"rank": rt.rank, "data": data}))


def note_dataset(site: str, made: int, length: int, subset: str | None, order: dict[str, str]) -> None:
    """Tell the launcher what this rank's DistributedSampler (the ``made``-th made at ``site``,
    a line of the script) shards: its dataset's length, which samples of its base it holds where
    it is a ``Subset`` (``sampler.subset_digest``), and the options that make its order. The
    ranks' must agree, and the launcher says so when they do not; through the launcher, not a
    collective, which would hang a script that makes a sampler on one rank alone."""
    rt = runtime()
    if rt.control is not None:
        rt.control.outbox.put((protocol.DATASET, {"site": site, "made": made, "length": length, "subset": subset,
                                                  "order": order}))


def note_batch(forward: int, digest: str | None, told: bool) -> None:
    """Tell the launcher what this rank's ``forward``-th training forward got: a digest of its
    inputs (``batches.inputs_digest``; None where it holds no tensor to read). ``told``: rank 0
    has warned of a DataLoader that reads a whole dataset, which shows as the same batches."""
    rt = runtime()
    if rt.control is not None:
        rt.control.outbox.put((protocol.BATCH, {"forward": forward, "digest": digest, "told": told}))


@contextmanager
def on_behalf_of(caller: str) -> Iterator[None]:
    """Collectives issued on this thread inside the block come from ``caller`` (macfleet's own
    callers: DataParallel, checkpoint), so an error about ranks in different collectives can
    say where the call came from."""
    rt = runtime()
    with rt.collectives.on_behalf_of(caller) if rt.collectives is not None else nullcontext():
        yield


@contextmanager
def waiting() -> Iterator[None]:
    """Time this thread spends in the block is time it waits for the other ranks
    (``Collectives.waiting``); DataParallel's end of backward uses it."""
    rt = runtime()
    with rt.collectives.waiting() if rt.collectives is not None else nullcontext():
        yield


@contextmanager
def standing_by() -> Iterator[None]:
    """This thread stands by for the other ranks in the block (``Collectives.standing_by``)."""
    rt = runtime()
    with rt.collectives.standing_by() if rt.collectives is not None else nullcontext():
        yield


def barrier() -> None:
    """Return once every rank has called ``barrier``."""
    rt = runtime()
    if rt.collectives is not None:
        rt.collectives.barrier()
