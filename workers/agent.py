"""The per-host agent: ``python -m macfleet.workers.agent``, one per host of a job.

It reads its ``AgentSpec`` as one JSON line on stdin (the secret travels there, never in
argv), says hello to the coordinator with this host's facts, and on ``start`` spawns its
ranks as fresh interpreters (never forked from a process that imported torch), each leading
its own process group. It streams their output with ``[rank K]`` prefixes (``rank_output``),
reports every exit with the rank's error file, and stops its ranks (SIGTERM, grace, SIGKILL
to the group) when the coordinator aborts, when the launcher goes away (stdin closes: the
launcher died, or the ssh connection did), or when it is itself told to stop. The agent of
rank 0's host also serves the job's torch.distributed store (``macfleet.workers.store``) until
every rank of the job is out. On a Mac it keeps the Mac from sleeping while its ranks run
(``macfleet.workers.awake``), and it says so when other macfleet jobs run there too
(``macfleet.workers.other_jobs``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from importlib import metadata
from typing import IO

import zmq

from macfleet import netaddr, openfiles, protocol, segments, sources
from macfleet.commands import module_command
from macfleet.control import ControlClient
from macfleet.env import mps_watermarks, physical_memory, shared_memory_fraction
from macfleet.lines import WholeLines, pieces
from macfleet.protocol import AgentSpec, WorkerExit
from macfleet.workers import dumps, leftovers, other_jobs
from macfleet.workers.awake import keep_awake, let_sleep
from macfleet.workers.rank_output import RankOutput, open_logs

TAIL_LINES = 40
CATCH_UP_S = 2.0  # a rank's exit waits at most this long for its last output to be read
DUMP_WAIT_S = 1.0  # and a dump of its stacks for faulthandler to write it
# Once heard from, the launcher may be silent this many heartbeat timeouts before the agent
# stops its ranks on its own. The launcher is the judge of a lost host (its report says which);
# the agent's limit only ends ranks that nobody can stop any more. A cut of a few seconds grows
# by TCP's retransmission backoff (7 s of cable pulled was 10 s of silence and more): as long as
# the launcher still hears the host in time, the job goes on.
LAUNCHER_SILENCE = 2
# A stop by these reaches the ranks at once, as a terminal would pass it on: Ctrl-C and SIGTERM as
# they are, a hangup and Ctrl-\ as SIGTERM, which a script's handler (a preempted machine's) may
# catch. (SIGQUIT's default action would end a rank with no finally block run, and dump core.)
PASSED_ON = {signal.SIGINT: signal.SIGINT, signal.SIGTERM: signal.SIGTERM, signal.SIGHUP: signal.SIGTERM,
             signal.SIGQUIT: signal.SIGTERM}


@dataclass
class _Dump:
    """A dump of a rank's stacks asked for: read it once its file stops growing, or at ``until``."""

    path: str  # where faulthandler writes it
    until: float
    size: int = -1


@dataclass
class Pump:
    """The thread that forwards one of a rank's output streams. Once the rank has exited, a
    byte on ``ended`` asks it to set ``caught_up`` when it has forwarded all the rank wrote: the
    stream's end may never come while a child of the rank holds it open."""

    thread: threading.Thread
    ended: int  # the write end of a pipe the thread watches
    caught_up: threading.Event


@dataclass
class Worker:
    rank: int
    local_rank: int
    proc: subprocess.Popen
    error_file: str
    tail: deque = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    pumps: list[Pump] = field(default_factory=list)
    exited_at: float = 0.0  # seen to have exited (wall clock, for the coordinator's order of failures)
    report_by: float | None = None  # once it has exited: when to report it even if its pumps lag
    exit: WorkerExit | None = None
    peak_rss: int | None = None  # bytes, once reaped


def host_facts() -> dict[str, object]:
    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    return {
        "hostname": socket.gethostname(),
        "os": platform.platform(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "torch": version("torch"),
        "macfleet": version("macfleet"),
        "cpus": os.cpu_count(),
        "memory_gb": _memory_gb(),
    }


def script_digest(spec: AgentSpec) -> str | None:
    """``sources.digest`` of the script this host's ranks will run ("missing" where it is not
    there; None for ``-m``, which Python finds when it starts). With no disk the Macs share, each
    runs its own copy, and one that an edit did not reach makes the ranks run different code:
    the launcher compares them."""
    if spec.script == "-m":
        return None
    try:
        return sources.digest(os.path.join(spec.cwd, spec.script))
    except OSError:
        return "missing"


def _memory_gb() -> float | None:
    memory = physical_memory()
    return None if memory is None else round(memory / 2**30, 1)


# ru_maxrss is in KiB on Linux and in bytes on macOS
MAXRSS_UNIT = 1 if sys.platform == "darwin" else 1024


def _exited(w: Worker) -> bool:
    """Whether the rank has exited. It is reaped with ``wait4`` rather than ``Popen.poll``
    for its peak memory, which the report gives for a rank that something outside killed
    (most often the kernel, out of memory)."""
    if w.proc.returncode is not None:
        return True
    try:
        pid, status, usage = os.wait4(w.proc.pid, os.WNOHANG)
    except ChildProcessError:  # reaped elsewhere: Popen knows how it ended
        return w.proc.poll() is not None
    if pid == 0:
        return False
    w.proc.returncode = os.waitstatus_to_exitcode(status)
    w.peak_rss = usage.ru_maxrss * MAXRSS_UNIT
    return True


def data_addresses(spec: AgentSpec, networks: list[netaddr.Network]) -> list[str]:
    """Where this host's ranks bind their ring sockets, the main address first: never all
    interfaces. Raises ``ValueError`` for an address that is not this machine's (``addr=`` in a
    hostfile, say, naming another Mac's), before any rank tries to bind to it.

    To the addresses given, it adds this Mac's own end of each cable to a neighbour whose
    given address is on that cable's subnet: MLX's Thunderbolt hostfiles list, for each Mac,
    the address its previous neighbour connects to, and macfleet's ring also sends the other
    way round. ``networks``: this Mac's addresses with their subnets (``netaddr.local_networks``)."""
    if spec.data_iface:
        return [netaddr.interface_address(spec.data_iface)]
    if not spec.data_addrs:
        return [netaddr.route_source(netaddr.split_endpoint(spec.coordinator)[0])]
    for addr in spec.data_addrs:
        try:
            _listening_socket(addr).close()
        except OSError as exc:
            raise ValueError(f"cannot train over {addr}: {exc.strerror or exc}; it is not an address of this "
                             f"machine ({socket.gethostname()}). It came from addr= in the hostfile, --data-addr, "
                             f"or this host's name as the launching Mac resolves it: give one of this machine's "
                             f"own addresses with addr=, or its interface with --data-iface") from None
    addrs = list(spec.data_addrs)
    for peer in spec.neighbour_addrs:
        own = netaddr.facing(peer, networks)
        if own is not None and own not in addrs:
            addrs.append(own)
    return addrs


def check_open_files(spec: AgentSpec) -> None:
    """Raises ``ValueError`` where this host's ranks need more open files than this user may have
    (the soft limit is raised to what they need where it is lower)."""
    refused = openfiles.refusal("it", spec.slots, openfiles.agent_needs(spec.slots), openfiles.RANKS_SOFT)
    if refused is not None:
        raise ValueError(refused)


def stacks_file(error_file: str) -> str:
    """Where the rank's bootstrap has faulthandler dump its stacks when asked (``dumps``)."""
    return error_file.removesuffix(".json") + ".stacks"


def rank_prefix(spec: AgentSpec, rank: int) -> str:
    """What goes before each line of ``rank``'s output on the launcher's terminal."""
    return f"[rank {rank} {spec.host}] " if spec.prefix_host else f"[rank {rank}] "


def worker_env(spec: AgentSpec, local_rank: int, data_addrs: list[str], main_iface: str | None, master_addr: str,
               master_port: int, error_file: str, alive_fd: int) -> dict[str, str]:
    """The environment contract of ``macfleet.env``, built here and nowhere else."""
    env = dict(os.environ)
    env.update(spec.env)
    env.update({
        "RANK": str(spec.rank_base + local_rank),
        "WORLD_SIZE": str(spec.world_size),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(spec.slots),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        # Agent 0 serves the store (workers/store.py); torch then makes every rank a client.
        # TORCHELASTIC_RESTART_COUNT is read on that path by torch < 2.4.
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_RESTART_COUNT": str(spec.restart_count),
        "MACFLEET_COORDINATOR": spec.coordinator,
        "MACFLEET_JOB_ID": spec.job_id,
        "MACFLEET_RESTART_COUNT": str(spec.restart_count),
        "MACFLEET_DEVICE": spec.device,
        "MACFLEET_SEED": str(spec.seed),
        "MACFLEET_ERROR_FILE": error_file,
        "MACFLEET_STACKS_FILE": stacks_file(error_file),
        "MACFLEET_DATA_ADDR": ",".join(data_addrs),
        "MACFLEET_HOST": spec.host,
        "MACFLEET_AGENT_PID": str(os.getpid()),
        "MACFLEET_AGENT_FD": str(alive_fd),
        "MACFLEET_SHM_DIR": os.path.dirname(error_file),
        "MACFLEET_JOB_SECRET": spec.secret_hex,
        "PYTHONUNBUFFERED": "1",  # stream lines live, not at exit
    })
    # Without --memory-fraction each rank works out its own share at init, from the processes
    # on its device: only a rank knows how many GPUs it sees (a CUDA host may have several,
    # one process each). A Mac has one GPU, which all of its ranks share.
    fraction = spec.memory_fraction
    if fraction is not None:
        env["MACFLEET_MEMORY_FRACTION"] = str(fraction)
    else:  # the MPS watermarks below: all of the host's ranks
        fraction = shared_memory_fraction(spec.slots)
    env.update(mps_watermarks(fraction, env))
    env.setdefault("PYTORCH_ENABLE_MPS_FALLBACK", "1")
    # The launcher's terminal, less this rank's prefix (launch.terminal_env), unless --env set one
    columns, _, lines = env.pop("MACFLEET_TERMINAL", "").partition("x")
    if columns.isdigit() and lines.isdigit() and "COLUMNS" not in spec.env:
        env["COLUMNS"] = str(max(20, int(columns) - len(rank_prefix(spec, spec.rank_base + local_rank))))
        env["LINES"] = lines
    # Scripts that use torch.distributed (gloo) themselves: make gloo use the data-plane address
    # (``main_iface``: the interface that holds the main one), not whatever the hostname resolves
    # to (often loopback, which breaks multi-host jobs).
    if main_iface and "GLOO_SOCKET_IFNAME" not in env:
        env["GLOO_SOCKET_IFNAME"] = main_iface
    if spec.slots > 1:
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // spec.slots)))
    # Idle OpenMP threads must sleep, not spin: the communication thread's torch ops get an
    # OpenMP team of their own, and spinning teams starved ZeroMQ's I/O threads (measured on 16
    # cores: the ring at 0.2-0.5x gloo spinning, 1.1-1.7x passive; a CNN step 56 ms -> 10 ms).
    # A job of one has no communication, and there spinning is faster.
    if spec.world_size > 1:
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # ZeroMQ allocates every message it receives (one per ring chunk, up to 4 MiB) on its I/O
    # thread, and glibc trims that thread's heap as soon as 8 MiB are free, so the next message
    # page-faults in fresh zeroed pages: 11-27 thousand faults per 64 MiB all-reduce over TCP
    # on 4 and 8 ranks back to back, under 1.3 thousand with these (measured, 16 cores; 8
    # ranks 63-74 -> 56-64 ms). They are the values glibc's own dynamic thresholds can reach
    # (mmap above 32 MiB, trim above twice that), fixed from the start; other C libraries
    # ignore them.
    env.setdefault("MALLOC_MMAP_THRESHOLD_", str(32 << 20))
    env.setdefault("MALLOC_TRIM_THRESHOLD_", str(64 << 20))
    return env


def make_scratch(spec: AgentSpec) -> str:
    """The per-job directory, in ``MACFLEET_SCRATCH_DIR`` (made if missing), else in /dev/shm
    where it exists (RAM-backed: the segments are memory), else in the temp dir."""
    chosen = spec.env.get("MACFLEET_SCRATCH_DIR")
    try:
        if chosen:
            os.makedirs(chosen, exist_ok=True)
        root = chosen or ("/dev/shm" if os.path.isdir("/dev/shm") else None)
        return tempfile.mkdtemp(prefix=f"macfleet-{spec.job_id}-", dir=root)
    except OSError as exc:
        sys.exit(f"macfleet agent on {spec.host}: cannot make the job's directory "
                 f"(MACFLEET_SCRATCH_DIR={chosen or ''}): {exc}")


class Agent:
    def __init__(self, spec: AgentSpec) -> None:
        # --cwd and --python may be given as ~/...: each host's own home (remote.home_quote)
        self.spec = spec = dataclasses.replace(spec, cwd=os.path.expanduser(spec.cwd),
                                               python=os.path.expanduser(spec.python))
        self.ctx = zmq.Context()
        self.client = ControlClient(self.ctx, spec.coordinator, bytes.fromhex(spec.secret_hex), spec.job_id,
                                    f"agent-{spec.host_index}")
        self.workers: list[Worker] = []
        # per-job scratch: error files and the shared-memory segment
        self.tmpdir = make_scratch(spec)
        self.output = RankOutput(spec.host)  # what its ranks write, prefixed, and their logs
        self.launcher_gone = threading.Event()
        self.stop_reason: str | None = None
        self.stopped_why: str | None = None  # for the exits, when this agent stops its ranks on its own
        self._stop_started: float | None = None
        # The signal that stopped the job (the user's Ctrl-C, here or at the launcher), as
        # PASSED_ON passes it on to the ranks at once, as a terminal would, so the script stops
        # where it is (KeyboardInterrupt, its own handlers) rather than after the grace period
        self.interrupt: int | None = None
        self.data_addrs: list[str] = []
        self.main_iface: str | None = None  # the interface that holds the main data address
        self.last_heard = time.monotonic()
        self.heard = False  # anything from the coordinator yet: if not, the launcher was never reachable
        self._next_beat = 0.0
        self.store_socket: socket.socket | None = None  # host 0: bound now, served by the store process
        self.store: subprocess.Popen | None = None
        self.awake: subprocess.Popen | None = None  # holds a Mac awake while its ranks run
        self._dumps: dict[int, _Dump] = {}  # by rank: stacks asked for and not sent yet
        # Nothing is ever written to this pipe: its read end reaches EOF when this process is gone,
        # however it went (SIGKILL included). Each rank's keeper (bootstrap.py) waits on it.
        self.alive_r, self.alive_w = os.pipe()

    def run(self) -> int:
        threading.Thread(target=self._watch_stdin, daemon=True).start()
        for sig in PASSED_ON:
            signal.signal(sig, self._on_signal)
        held = netaddr.held_addresses()  # this Mac's addresses, read once for all that follows
        networks = [net for _, net in held]
        try:
            self.data_addrs = data_addresses(self.spec, networks)
            check_open_files(self.spec)
            self.output.logs = open_logs(self.spec)
        except (ValueError, OSError) as exc:
            print(f"macfleet agent on {self.spec.host}: {exc}", file=sys.stderr, flush=True)
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            return 2
        beside = other_jobs.check_in(self.tmpdir, self.spec)
        if beside:
            print(beside, file=sys.stderr, flush=True)
        hello = {"host_index": self.spec.host_index, "host": self.spec.host,
                 "facts": {**host_facts(), "script": script_digest(self.spec)},
                 "data_addr": self.data_addrs[0], "data_addrs": self.data_addrs,
                 "data_nets": netaddr.with_subnets(self.data_addrs, networks),
                 "link": netaddr.links_of(self.data_addrs, held),
                 "ranks": [self.spec.rank_base, self.spec.rank_base + self.spec.slots]}
        self.main_iface = netaddr.interface_of(self.data_addrs[0], held)
        if self.spec.host_index == 0:
            self.store_socket = _listening_socket(self.data_addrs[0])
            hello["master_port"] = self.store_socket.getsockname()[1]
        self.client.send(protocol.HELLO, **hello)
        start = self._wait_for(protocol.START)
        if start is None:
            return self._finish()
        if self.store_socket is not None:
            self._start_store()
        self.awake = keep_awake(os.getpid())
        for local_rank in range(self.spec.slots):
            self._beat()  # starting many ranks on a busy Mac takes seconds; the coordinator must still hear us
            self._spawn(local_rank, str(start["master_addr"]), int(start["master_port"]))
        self._supervise()
        if self.store is not None:
            # Ranks on other hosts may still be tearing down their process groups: serve their
            # store until the coordinator says every rank is out (or the job is stopped).
            self._wait_for(protocol.END)
        return self._finish()

    def _wait_for(self, kind: str) -> dict | None:
        """Beat and listen until the coordinator sends ``kind``; None if the job is stopped first."""
        while self.stop_reason is None:
            self._beat()
            msg = self._listen(0.1)
            if msg is not None and msg.get("kind") == kind:
                return msg
        return None

    def _beat(self) -> None:
        """Tell the coordinator we live, once a heartbeat interval, from whichever loop we are in."""
        if time.monotonic() >= self._next_beat:
            self.client.send(protocol.BEAT, progress=0)
            self._next_beat = time.monotonic() + protocol.HEARTBEAT_S

    def _listen(self, timeout_s: float) -> dict | None:
        """One message from the coordinator, noting aborts and whether the launcher still lives."""
        msg = self.client.recv(timeout_s)
        now = time.monotonic()
        if msg is not None:
            self.last_heard, self.heard = now, True
            if msg.get("kind") == protocol.ABORT and self.stop_reason is None:
                self.stop_reason = str(msg.get("reason"))
                if msg.get("signal") in PASSED_ON:
                    self.interrupt = PASSED_ON[msg["signal"]]
            elif msg.get("kind") == protocol.STDIN:
                self.output.lines_ended(msg.get("lines_ended") or [])
                self._feed(bytes(msg.get("data") or b""), bool(msg.get("eof")))
            elif msg.get("kind") == protocol.STACKS:
                self._ask_for_dump(msg.get("rank"))
        if self.stop_reason is None:
            limit = self.spec.heartbeat_timeout_s * (LAUNCHER_SILENCE if self.heard else 1)
            if self.launcher_gone.is_set():
                self.stop_reason = "launcher gone"
                self.stopped_why = f"its agent on {self.spec.host} lost its connection to the launcher and stopped it"
            elif now - self.last_heard > limit:
                self.stop_reason = "launcher gone"  # silent: dead, or the network to it is cut
                self.stopped_why = (f"its agent on {self.spec.host} heard nothing from the launcher for {limit:.0f} s "
                                    f"(the network between them cut?) and stopped it")
                print(self._unheard(limit), file=sys.stderr, flush=True)
        return msg

    def _unheard(self, limit: float) -> str:
        waited = f"{limit:.0f} s"
        if self.heard:
            return f"macfleet agent on {self.spec.host}: no word from the launcher for {waited}; stopping this host's ranks"
        address, port = netaddr.split_endpoint(self.spec.coordinator)
        return (f"macfleet agent on {self.spec.host}: cannot reach the launcher at {address} port {port} for {waited}: "
                f"{netaddr.probe(address, port)}. {netaddr.FIREWALL_ADVICE}; otherwise {address} is not reachable "
                f"from {self.spec.host}")

    def _spawn(self, local_rank: int, master_addr: str, master_port: int) -> None:
        rank = self.spec.rank_base + local_rank
        error_file = os.path.join(self.tmpdir, f"error-{rank}.json")
        proc = subprocess.Popen(
            module_command(self.spec.python, "macfleet.workers.bootstrap", self.spec.script, *self.spec.args,
                           same_python=True),
            env=worker_env(self.spec, local_rank, self.data_addrs, self.main_iface, master_addr, master_port,
                           error_file, self.alive_r),
            pass_fds=(self.alive_r,),
            cwd=self.spec.cwd,
            stdin=subprocess.PIPE,  # the launcher's stdin (``_feed``)
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group: we stop it and everything it started
        )
        assert proc.stdin is not None
        os.set_blocking(proc.stdin.fileno(), False)  # a rank that reads no input must not stall us
        worker = Worker(rank, local_rank, proc, error_file)
        prefix = rank_prefix(self.spec, rank)
        shown = self.spec.show_ranks is None or rank in self.spec.show_ranks
        log = self.output.logs.get(rank)
        sinks = (sys.stdout.buffer, sys.stderr.buffer) if shown else (None, None)
        for stream, sink, tail in ((proc.stdout, sinks[0], None), (proc.stderr, sinks[1], worker.tail)):
            ended_r, ended_w = os.pipe()
            caught_up = threading.Event()
            thread = threading.Thread(target=self._pump, args=(stream, sink, prefix.encode(), tail, log, ended_r,
                                                               caught_up), daemon=True)
            thread.start()
            worker.pumps.append(Pump(thread, ended_w, caught_up))
        self.workers.append(worker)

    def _feed(self, data: bytes, eof: bool) -> None:
        """Pass the launcher's stdin on to every rank still running. What a rank leaves unread
        beyond its pipe's buffer (64 KiB) is dropped rather than waited for."""
        for w in self.workers:
            stdin = w.proc.stdin
            if stdin is None or stdin.closed:
                continue
            try:
                if data:
                    os.write(stdin.fileno(), data)
            except OSError:  # full (BlockingIOError), or the rank is gone (BrokenPipeError)
                pass
            if eof:
                _close(stdin)

    def _start_store(self) -> None:
        """Hand the listening socket to the store process; ranks that connect before it is up
        wait in the socket's backlog."""
        sock = self.store_socket
        assert sock is not None
        addr, port = sock.getsockname()[:2]
        # torch's store logs a warning for every client whose address has no reverse DNS name
        # ("The hostname of the client socket cannot be retrieved"), on a LAN of Macs in every
        # job; what matters (it did not start, it died) we report ourselves.
        env = {**os.environ, "TORCH_CPP_LOG_LEVEL": os.environ.get("TORCH_CPP_LOG_LEVEL", "ERROR")}
        self.store = subprocess.Popen(
            module_command(self.spec.python, "macfleet.workers.store", str(sock.fileno()), addr, str(port),
                           same_python=True),
            pass_fds=(sock.fileno(),), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
            start_new_session=True, env=env,
        )
        sock.close()
        self.store_socket = None

    def _pump(self, stream: IO[bytes], sink: IO[bytes] | None, prefix: bytes, tail: deque | None,
              log: IO[bytes] | None, ended: int, caught_up: threading.Event) -> None:
        """Copy a rank's output as it comes: to its log file as it is, and to ours (unless the
        rank is not shown) with each line prefixed. Then its children's, if they outlive it."""
        at_start, lines = True, WholeLines() if tail is not None else None  # only stderr keeps a tail
        for piece in pieces(stream.fileno(), ended=ended):
            if not piece:  # all the rank wrote is forwarded, and in the tail
                caught_up.set()
                continue
            with self.output.lock:
                if log is not None and not self.output.log(log, piece):
                    log = None  # a full disk: the rest goes to the terminal only, as the agent said
                if sink is not None:
                    at_start = self.output.show(sink, prefix, piece, at_start)
            done = lines.add(piece) if lines is not None else None
            if tail is not None and done:
                tail.append(done)
        done = lines.rest() if lines is not None else None
        if tail is not None and done:
            tail.append(done)
        with self.output.lock:
            if sink is not None:
                self.output.end_line(sink, prefix)  # the rank ended mid-line
        stream.close()
        os.close(ended)
        caught_up.set()

    def _ask_for_dump(self, rank: object) -> None:
        """The coordinator heard nothing from ``rank`` (ours?): have faulthandler dump its stacks."""
        for w in self.workers:
            if w.rank == rank and not _exited(w) and dumps.DUMP_SIGNAL is not None:
                path = stacks_file(w.error_file)
                try:
                    # Armed, it has made the file: the signal's default action would kill it. Emptied:
                    # the dump asked for last time is not where it is now.
                    os.truncate(path, 0)
                except OSError:
                    return  # not armed yet (a rank still starting Python), or never
                try:
                    os.kill(w.proc.pid, dumps.DUMP_SIGNAL)
                except ProcessLookupError:
                    return  # it has just exited: its exit says more
                self._dumps[w.rank] = _Dump(path, time.monotonic() + DUMP_WAIT_S)

    def _send_dumps(self) -> None:
        """Each dump asked for, once its file has stopped growing (faulthandler writes it at
        once, from the signal handler), or whatever there is when the wait is over."""
        for rank, dump in list(self._dumps.items()):
            size = os.path.getsize(dump.path) if os.path.exists(dump.path) else 0
            if (size == 0 or size != dump.size) and time.monotonic() < dump.until:
                dump.size = size
                continue
            del self._dumps[rank]
            try:
                with open(dump.path, errors="replace") as f:
                    text = dumps.tidy(f.read())
            except OSError:
                continue  # never armed (the script replaced the handler before it could dump, say)
            if text:
                self.client.send(protocol.STACKS, rank=rank, text=text)

    def _supervise(self) -> None:
        while any(w.exit is None for w in self.workers):
            self._beat()
            self._listen(0.05)
            self._send_dumps()
            self._reap()
            self._check_store()
            if self.stop_reason is not None:
                self._stop_workers()

    def _check_store(self) -> None:
        if self.store is not None and self.store.poll() is not None and self.stop_reason is None:
            code, self.store = self.store.returncode, None
            print(f"macfleet agent on {self.spec.host}: the torch.distributed store (MASTER_PORT) exited "
                  f"with code {code}; a script's init_process_group will time out", file=sys.stderr, flush=True)

    def _reap(self) -> None:
        """Report each rank that has exited, once its last lines (a traceback) are in the tail.
        The pumps say when they have them, at most ``CATCH_UP_S`` after the exit: a child of the
        rank may keep its streams open for good, and meanwhile the loop goes on (heartbeats)."""
        for w in self.workers:
            if w.exit is not None or not _exited(w):
                continue
            if w.report_by is None:
                w.exited_at, w.report_by = time.time(), time.monotonic() + CATCH_UP_S
                for pump in w.pumps:
                    try:
                        os.write(pump.ended, b"x")
                    except BrokenPipeError:
                        pass  # the pump has met the stream's end already
                    os.close(pump.ended)
            if time.monotonic() < w.report_by and not all(p.caught_up.is_set() for p in w.pumps):
                continue
            _close(w.proc.stdin)
            code = w.proc.returncode
            signame = signal.Signals(-code).name if code < 0 else None
            w.exit = WorkerExit(
                rank=w.rank, host=self.spec.host, pid=w.proc.pid, code=128 - code if code < 0 else code,
                signal=signame, time=w.exited_at, error=_read_json(w.error_file),
                tail=list(w.tail) if code != 0 else [], stopped=self.stopped_why if code != 0 else None,
                peak_rss=w.peak_rss, host_memory=physical_memory(),
            )
            self.client.send(protocol.EXIT, **w.exit.fitted().to_fields())

    def _stop_workers(self) -> None:
        """Ranks get a grace period to exit on their own (an abort raises in their collectives),
        then SIGTERM, then SIGKILL, each to the whole process group."""
        if self._stop_started is None:
            self._stop_started = time.monotonic()
        elapsed = time.monotonic() - self._stop_started
        grace = self.spec.grace_s
        interrupt, self.interrupt = self.interrupt, None  # once
        for w in self.workers:  # finished ranks' leftovers (their children) go in _finish()
            if w.exit is not None:
                continue
            if interrupt is not None:
                _killpg(w.proc.pid, interrupt)
            if elapsed >= 2 * grace:
                _killpg(w.proc.pid, signal.SIGKILL)
            elif elapsed >= grace or self.stop_reason == "launcher gone":
                _killpg(w.proc.pid, signal.SIGTERM)
                _killpg(w.proc.pid, signal.SIGCONT)  # a stopped (SIGSTOP'd) rank must wake up to die

    def _finish(self) -> int:
        for w in self.workers:
            _killpg(w.proc.pid, signal.SIGKILL)  # nothing of this job outlives the agent
        self._stop_leftovers()
        if self.store is not None:
            _killpg(self.store.pid, signal.SIGKILL)
            self.store.wait()
        if self.store_socket is not None:
            self.store_socket.close()
        let_sleep(self.awake)
        self.client.send(protocol.DONE, host_index=self.spec.host_index, cut_logs=self.output.close_logs())
        self.client.close()
        self.ctx.destroy(linger=1000)
        segments.release(self.tmpdir)  # shared-memory objects a crash left (macOS)
        shutil.rmtree(self.tmpdir, ignore_errors=True)  # error files, and any segment a crash left
        return 0 if all(w.exit and w.exit.code == 0 for w in self.workers) else 1

    def _stop_leftovers(self) -> None:
        """What the ranks started in sessions of their own, out of reach of the group kills above."""
        if not self.workers:
            return
        stopped = leftovers.stop(self.spec.job_id, os.getpid(), {w.proc.pid for w in self.workers}, self.spec.grace_s)
        if stopped:
            named = ", ".join(f"pid {left.pid} ({left.program})" for left in stopped)
            print(f"macfleet agent on {self.spec.host}: stopped what the ranks started in sessions of their own, "
                  f"which would have outlived the job: {named} (a process meant to outlive the job is started "
                  f"without MACFLEET_JOB_ID in its environment)", file=sys.stderr, flush=True)

    def _watch_stdin(self) -> None:
        # The raw fd, not sys.stdin: a daemon thread blocked in a buffered reader aborts
        # interpreter shutdown.
        try:
            while os.read(0, 4096):
                pass
        except OSError:
            pass
        self.launcher_gone.set()

    def _on_signal(self, signum: int, _frame: object) -> None:
        if self.stop_reason is None:
            name = signal.Signals(signum).name
            self.stop_reason = f"agent received {name}"
            self.stopped_why = f"its agent on {self.spec.host} received {name} and stopped it"
            if signum in PASSED_ON:  # a Ctrl-C in the terminal reaches the launcher and local agents alike
                self.interrupt = PASSED_ON[signum]


def _close(stream: IO[bytes] | None) -> None:
    try:
        if stream is not None:
            stream.close()
    except OSError:
        pass


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _listening_socket(addr: str) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET)
    sock.bind((addr, 0))
    sock.listen(1024)  # every rank of a large job may connect before the store process is up
    return sock


def _read_json(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def main() -> None:
    line = sys.stdin.readline()
    if not line:
        sys.exit("macfleet agent: expected the job spec as one JSON line on stdin")
    try:
        spec = AgentSpec.from_json(line)
    except (TypeError, ValueError) as exc:  # a field one side has and the other lacks: another macfleet
        sys.exit(f"macfleet agent on {socket.gethostname()}: cannot read the launcher's job spec ({exc}); this "
                 f"Mac runs macfleet {host_facts()['macfleet']} at {sys.executable}, and the launching Mac another "
                 f"one: install the same macfleet on every Mac")
    sys.exit(Agent(spec).run())


if __name__ == "__main__":
    main()
