"""The coordinator: the job's control plane, a ROUTER socket in the launcher process.

It owns rendezvous (hello from every agent, then start; register from every rank, then the
peer table), liveness (heartbeats from agents and ranks), the record of every rank's exit,
and the abort broadcast. It never blocks: the launcher calls ``poll`` in its loop.
Anything unauthenticated, malformed, replayed or from another job is dropped and counted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import zmq

from macfleet import netaddr, protocol, wire
from macfleet.launcher.agreement import Agreement
from macfleet.launcher.groups import ranks_text
from macfleet.launcher.tracefile import TraceFile
from macfleet.protocol import WorkerExit

@dataclass
class Failure:
    """Why the job is going down: a rank's exit, or something the coordinator noticed itself."""

    time: float
    reason: str
    rank: int | None = None
    exit: WorkerExit | None = None
    detail: str = ""  # printed under the reason (where a stalled rank's threads are)


@dataclass
class Sample:
    """Where a rank's threads were, how much processor time it and the processes it started had
    used, and what its main thread waited on outside Python, when it answered."""

    text: str
    cpu_s: float | None
    at: float  # monotonic, when it arrived
    outside: str | None = None  # "the network", "a process it started" (whereabouts.waits_outside)


@dataclass
class Recheck:
    """A stall's suspects asked again before the job is aborted: are they stuck, or working?"""

    asked: float  # monotonic: an answer that arrived later is the one asked for
    before: dict[int, Sample | None]  # by rank asked: its answer before this one


@dataclass
class Peer:
    identity: bytes
    last_seq: int = -1
    last_seen: float = field(default_factory=time.monotonic)
    watched: bool = True  # heartbeats expected
    told_abort: bool = False


class Coordinator:
    def __init__(self, ctx: zmq.Context, bind_addrs: list[str], secret: bytes, job_id: str, world_size: int,
                 num_agents: int, heartbeat_timeout_s: float = 10.0, stall_timeout_s: float = 60.0,
                 stall_action: str = "abort", log: Callable[[str], None] = print,
                 trace: TraceFile | None = None) -> None:
        self.secret, self.job_id = secret, job_id
        self.trace = trace  # where the ranks' timeline events go (launch --timeline)
        self.stall_timeout_s, self.stall_action, self.log = stall_timeout_s, stall_action, log
        self.status: dict[int, dict[str, Any]] = {}  # rank -> its last heartbeat's progress report
        self._stall_reported: str | None = None
        self._next_exchange_note = 0.0  # when a long exchange may be mentioned again
        self._held = False  # whether the ranks were told that one of them waits for a person (pdb, input())
        self._hold_ended: float | None = None  # when the last such wait ended
        self.world_size, self.num_agents = world_size, num_agents
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.socket = ctx.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.socket.setsockopt(zmq.MAXMSGSIZE, protocol.CONTROL_MAX_BYTES)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.endpoints: dict[str, str] = {}
        for addr in bind_addrs:  # before any bind: it applies to the socket's later binds
            netaddr.allow_ipv6(self.socket, addr)
        for addr in bind_addrs:  # only the addresses that route to the job's hosts
            self.socket.bind(f"tcp://{netaddr.bracket(addr)}:*")
            self.endpoints[addr] = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self.peers: dict[str, Peer] = {}  # "agent-3", "rank-7"
        self.hellos: dict[int, dict[str, Any]] = {}
        self.registered: dict[int, dict[str, str]] = {}
        self.exits: dict[int, WorkerExit] = {}
        self.agents_done: set[int] = set()
        self.cut_logs: set[int] = set()  # ranks whose --log-dir log its agent could not write to the end
        self.failures: list[Failure] = []
        self.dropped = 0
        self.started = False
        self.aborted: str | None = None
        self._abort_rank: int | None = None
        self._abort_signal: int | None = None  # the user's SIGINT or SIGTERM, which the agents pass on to the ranks
        self.hosts: dict[int, str] = {}  # rank -> host name, from registrations
        self.data_addrs: dict[int, str] = {}  # rank -> the address it trains over (sockets or none)
        self.local_ranks: dict[int, int] = {}
        self.devices: dict[int, str] = {}  # rank -> the device it trains on, from registrations
        self.lost: set[str] = set()  # peers whose heartbeats stopped ("agent-1", "rank-3")
        self.reports: dict[int, dict[str, Any]] = {}  # rank -> what it reported (doctor's link probes)
        self.agreement = Agreement(world_size, num_agents)  # the ranks' data and code, compared
        self.samples: dict[int, Sample] = {}  # rank -> its latest answer to a STACKS request (a stall, a silence)
        self._recheck: Recheck | None = None
        self._to_show: set[int] = set()  # ranks asked where they are for the log, not for a recheck alone
        self._abort_after = 0.0  # how long the waits of a stall may last before it is aborted (0: twice the timeout)
        self._busy_said = False  # whether this stall's suspects were said to be working
        self.last_ops: dict[int, int] = {}  # rank -> the last collective it drew, sent when it shut down
        self.broken: dict[int, dict[str, Any]] = {}  # rank -> the collective it left by an exception, said at goodbye
        self._went_on_at: dict[int, float] = {}  # rank -> when a beat first said it went on from such a collective
        self._ended_at: dict[int, float] = {}  # rank -> when a beat first said its script ended by an exception
        self._exited_at: dict[int, float] = {}  # rank -> when its exit reached us
        self.waits: dict[int, tuple[float, float]] = {}  # rank -> (seconds it waited on the others, seconds it ran)
        self.stood_by: dict[int, float] = {}  # rank -> seconds it stood by, out of batches, in DataParallel.join()
        self.speeds: dict[int, float] = {}  # rank -> its share of a step's samples per second of its work in one
        self._seq = 0
        self._next_beat = 0.0
        self._last_check = time.monotonic()  # when heartbeats were last judged (a paused launcher skips a round)
        self._first_joined: float | None = None  # when the first rank called macfleet.init()
        self._next_join_note = 0.0  # when to say who the joined ranks still wait for

    def endpoint_for(self, addr: str) -> str:
        """The endpoint an agent that reaches us through ``addr`` connects to."""
        if addr in self.endpoints:
            return self.endpoints[addr]
        port = netaddr.split_endpoint(next(iter(self.endpoints.values())))[1]
        return f"tcp://{netaddr.bracket(addr or '127.0.0.1')}:{port}"

    # -- the loop ---------------------------------------------------------------------------
    def poll(self, timeout_s: float) -> None:
        """Handle every message that arrives within ``timeout_s``, then check heartbeats."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self.socket.poll(int(left * 1000) + 1, zmq.POLLIN):
                break
            frames = self.socket.recv_multipart()
            try:
                self._handle(frames)
            except wire.BadMessage:
                self.dropped += 1
        self._check_heartbeats()
        if time.monotonic() >= self._next_beat:  # agents stop their ranks if we fall silent
            self._next_beat = time.monotonic() + protocol.HEARTBEAT_S
            self.send_each("agent", protocol.BEAT)

    def _handle(self, frames: list[bytes]) -> None:
        if len(frames) != 3:
            raise wire.BadMessage("wrong frame count")
        identity, mac, header = frames
        msg = wire.unpack(self.secret, mac, header)
        sender, seq, kind = msg.get("from"), msg.get("seq"), msg.get("kind")
        if msg.get("job") != self.job_id or not isinstance(sender, str) or not isinstance(seq, int):
            raise wire.BadMessage("other job or missing fields")
        peer = self.peers.get(sender)
        if peer is None:
            peer = self.peers[sender] = Peer(identity)
        elif peer.identity != identity:
            peer.identity = identity  # a reconnect gets a new identity; the mac vouches for the sender
        if seq <= peer.last_seq:
            raise wire.BadMessage("replayed")
        peer.last_seq, peer.last_seen = seq, time.monotonic()
        handler = {
            protocol.HELLO: self._on_hello,
            protocol.REGISTER: self._on_register,
            protocol.EXIT: self._on_exit,
            protocol.DONE: self._on_done,
            protocol.BYE: self._on_bye,
            protocol.BEAT: self._on_beat,
            protocol.REPORT: self._on_report,
            protocol.DATASET: self._on_dataset,
            protocol.BATCH: self._on_batch,
            protocol.SOURCES: self._on_sources,
            protocol.STACKS: self._on_stacks,
            protocol.TRACE: self._on_trace,
        }.get(kind)
        if handler is None:
            raise wire.BadMessage(f"unknown kind {kind!r}")
        handler(msg, peer)
        if self.aborted is not None and not peer.told_abort:  # e.g. an agent whose hello came after the abort
            self._send_abort(sender, peer)

    def _on_hello(self, msg: dict[str, Any], peer: Peer) -> None:
        index = msg.get("host_index")
        if not isinstance(index, int) or not 0 <= index < self.num_agents:
            raise wire.BadMessage("bad host index")
        self.hellos[index] = msg

    def start_agents(self, master_addr: str) -> None:
        """Tell every agent to spawn its ranks (the launcher calls this once all said hello)."""
        master_port = self.hellos[0].get("master_port", 29500)
        for index in range(self.num_agents):
            self.send(f"agent-{index}", protocol.START, master_addr=master_addr, master_port=master_port)
        self.started = True

    def _on_register(self, msg: dict[str, Any], peer: Peer) -> None:
        rank, endpoints = msg.get("rank"), msg.get("endpoints")
        if not isinstance(rank, int) or not 0 <= rank < self.world_size or not isinstance(endpoints, dict):
            raise wire.BadMessage("bad registration")
        self.registered[rank] = {str(k): str(v) for k, v in endpoints.items()}
        if self._first_joined is None:  # the first to join waits for the rest from now
            self._first_joined = time.monotonic()
            self._next_join_note = self._first_joined + self.stall_timeout_s
        self.hosts[rank] = str(msg.get("host", "?"))
        self.data_addrs[rank] = str(msg.get("data_addr") or "?")
        self.devices[rank] = str(msg.get("device", "?")) + (" (mps available)" if msg.get("mps_available") and
                                                              not str(msg.get("device")).startswith("mps") else "")
        local_rank = msg.get("local_rank", 0)
        self.local_ranks[rank] = local_rank if isinstance(local_rank, int) else 0
        self._check_never_joined()
        if len(self.registered) == self.world_size:
            table = [[r, eps, self.local_ranks[r]] for r, eps in sorted(self.registered.items())]
            for r in range(self.world_size):
                self.send(f"rank-{r}", protocol.PEERS, table=table)

    def _on_beat(self, msg: dict[str, Any], peer: Peer) -> None:
        sender = str(msg.get("from"))
        if sender.startswith("rank-"):
            quiet = msg.get("quiet_s")
            self.status[int(sender[5:])] = {"progress": msg.get("progress"), "waiting": msg.get("waiting"),
                                            "quiet_s": float(quiet) if isinstance(quiet, (int, float)) else None,
                                            "held": str(msg["held"])[:100] if isinstance(msg.get("held"), str)
                                            else None, "at": time.monotonic(),
                                            "broken": _broken(msg.get("broken")),
                                            "ended": str(msg["ended"])[:300] if isinstance(msg.get("ended"), str)
                                            else None}
            held = any(st.get("held") for r, st in self.status.items() if r not in self.exits)
            if held != self._held:  # someone debugs a rank, or it asks them: the others' waits must not time out
                self._held = held
                self._hold_ended = None if held else time.monotonic()
                self._stall_reported = None  # a stall after it is reported afresh
                self.send_each("rank", protocol.HOLD, on=held)

    def _waiting_for(self, now: float, longer_than: float = 0.0, but: int | None = None,
                     said: bool = False) -> dict[int, dict[str, Any]]:
        """Ranks (other than ``but``) that have been inside a collective for more than
        ``longer_than`` seconds; ``said``: as their last beats said, not counting the time since."""
        out = {}
        for rank, st in self.status.items():
            waiting = st.get("waiting")
            if waiting and rank != but and rank not in self.exits and \
                    self._waited(st, st["at"] if said else now) > longer_than:
                out[rank] = waiting
        return out

    def _waited(self, st: dict[str, Any], now: float) -> float:
        """How long the rank whose status is ``st`` has been in its collective, as of its last
        beat and since. Time while a rank was in a debugger does not count: the others waited for
        it, and were not stuck, even in the second before their next beat says they are through."""
        waited = st["waiting"].get("for_s", 0) + now - st["at"]
        return waited if self._hold_ended is None else min(waited, now - self._hold_ended)

    @staticmethod
    def _who_waits(waiting: dict[int, dict[str, Any]], awaited: int = 1) -> str:
        """A stall line's end, "; ranks 0, 2 are waiting for it in all_reduce (op 7) at train.py:42":
        ``awaited`` is how many ranks they wait for (them, or it)."""
        if not waiting:
            return ""
        first = next(iter(waiting.values()))
        ranks = ", ".join(str(r) for r in sorted(waiting))
        sites = {w.get("at") for w in waiting.values()}
        at = f" at {sites.pop()}" if len(sites) == 1 and None not in sites and "" not in sites else ""
        return (f"; rank{'s' if len(waiting) > 1 else ''} {ranks} {'are' if len(waiting) > 1 else 'is'} waiting for "
                f"{'them' if awaited > 1 else 'it'} in {first.get('op')} (op {first.get('id')}){at}")

    def _check_stalls(self) -> None:
        """Horovod's stall report: ranks waiting in a collective for a long time, and the live
        ranks they wait for (which are not in it). Warn once; abort if it lasts twice as long."""
        if self.stall_timeout_s <= 0 or self.aborted is not None or len(self.registered) < self.world_size:
            return
        now = time.monotonic()
        # As the waiting ranks' beats said: a rank whose beat came a moment before its collective
        # ended seemed to wait on until its next beat, and a second of that at the 1 s stall
        # timeout named the rank it had waited for, already past it, "made no progress" (a flake
        # of the slow-link test). A stall is named up to a beat late, as the data check is.
        waiting = self._waiting_for(now, self.stall_timeout_s, said=True)
        if not waiting or self._data_moving(now, waiting):
            self._stall_reported, self._recheck, self._abort_after, self._busy_said = None, None, 0.0, False
            self._note_long_exchange(waiting, now)
            return
        live = [r for r in range(self.world_size) if r not in self.exits]
        # A rank that has only just joined the collective the others wait in is no suspect: its
        # beat says so up to a second late, and one that is slow to get there (the others, too,
        # enter a second apart on a busy Mac) was named with the rank they waited for
        ops = {(w.get("op"), w.get("id")) for w in waiting.values()}
        joining = [r for r, w in self._waiting_for(now).items()
                   if r not in waiting and (w.get("op"), w.get("id")) in ops]
        suspects = [r for r in live if r not in waiting and r not in joining]
        if joining and not suspects:
            return  # the last of them has just joined: their collective runs (a stall timeout on, they all waited)
        if any(self.status.get(r, {}).get("ended") for r in suspects):
            return  # its script ended by an exception: no stall, and _check_ended names it
        if self._held:  # a rank waits for a person (pdb, a prompt): the others wait for it, not for a hang
            if self._stall_reported is None:
                reasons: dict[str, list[int]] = {}
                for r in live:
                    if self.status.get(r, {}).get("held"):
                        reasons.setdefault(self.status[r]["held"], []).append(r)
                self._stall_reported = "; ".join(f"{self._ranks_named(ranks)} {'are' if len(ranks) > 1 else 'is'} {why}"
                                                 for why, ranks in reasons.items())
                held = sum(len(ranks) for ranks in reasons.values())
                self.log(f"{self._stall_reported}{self._who_waits(waiting, held)}; no stall report while it lasts")
            return
        if suspects:
            reason = (f"{self._ranks_named(suspects)} made no progress for over "
                      f"{self.stall_timeout_s:.0f} s{self._who_waits(waiting, len(suspects))}")
        elif len({(w.get("op"), w.get("id")) for w in waiting.values()}) > 1:
            # A backstop: ranks in different collectives learn it from the first message that
            # reaches them (each names its collective and number); this is for waits that no
            # message reaches
            where = "; ".join(f"rank {r} in {w.get('op')} (op {w.get('id')}{', at ' + w['at'] if w.get('at') else ''})"
                              for r, w in sorted(waiting.items()))
            reason = (f"the ranks are in different collectives ({where}): every rank must call the same "
                      f"collectives in the same order")
        else:
            op = next(iter(waiting.values()))
            reason = (f"every rank has waited over {self.stall_timeout_s:.0f} s in {op.get('op')} (op {op.get('id')}): "
                      f"messages are not getting through (network?)")
        if self._stall_reported is None:
            self._stall_reported = reason
            self.log(f"stall: {reason}")
            for r in suspects[:3]:  # what keeps them: each answers with its threads' stacks (_on_stacks)
                self._to_show.add(r)
                self.send(f"rank-{r}", protocol.STACKS)
        longest = max(self._waited(self.status[r], now) for r in waiting)
        if self.stall_action == "abort" and longest > (self._abort_after or 2 * self.stall_timeout_s):
            if suspects and self._working(suspects[:3], now):
                self._abort_after = longest + self.stall_timeout_s  # look again a stall timeout later
                return
            if suspects and self._recheck is not None:
                return  # their answers are on the way
            suspect = suspects[0] if suspects else None
            where = self.samples[suspect].text if suspect in self.samples else ""
            detail = [f"rank {suspect} was at:\n{where}"] if where else []
            if suspect is not None:  # a wait whereabouts cannot see looks stuck: no stack moves, no processor used
                detail.append(f"(if rank {suspect} was doing slow work of its own rather than stuck, a read from a "
                              f"socket of the script's own, say: give --stall-timeout above that work's length, or "
                              f"--stall-action warn)")
            self.fail(Failure(time.time(), f"stalled: {reason}", suspect, detail="\n".join(detail)))

    def _ranks_named(self, ranks: list[int]) -> str:
        """'rank 1 (mini2)', 'ranks 0 (mini1), 2 (mini2)'."""
        return f"rank{'s' if len(ranks) > 1 else ''} " + ", ".join(f"{r} ({self.hosts.get(r, '?')})" for r in ranks)

    def _working(self, suspects: list[int], now: float) -> bool:
        """Whether the stall's suspects are working rather than stuck: rank 0 validating alone
        while the others wait at a barrier is no hang, and used to be aborted after twice the
        stall timeout. Each is asked where it is again, and judged by ``_why_working``. A rank
        that loops waiting (a data loader that never returns), a deadlock: stuck. While the
        answers are on the way this returns False, with ``_recheck`` set."""
        if self._recheck is None:
            self._recheck = Recheck(now, {r: self.samples.get(r) for r in suspects})
            for r in suspects:
                self.send(f"rank-{r}", protocol.STACKS)
            return False
        check = self._recheck
        answered = [r for r in suspects if r in self.samples and self.samples[r].at > check.asked]
        if len(answered) < len(suspects) and now - check.asked < 2 * protocol.HEARTBEAT_S:
            return False
        self._recheck = None
        working = {r: why for r in answered if (why := _why_working(check.before.get(r), self.samples[r]))}
        if working and not self._busy_said:
            self._busy_said = True
            said = "; ".join(f"rank {r} ({self.hosts.get(r, '?')}) is working, not stuck ({why})"
                             for r, why in working.items())
            self.log(f"{said}: the others go on waiting, up to the collective timeout (MACFLEET_TIMEOUT, 600 s "
                     f"unless set)")
        return bool(working)

    def _note_long_exchange(self, waiting: dict[int, dict[str, Any]], now: float) -> None:
        """A collective that has lasted over the stall timeout while data keeps arriving is no
        stall (a big model's first broadcast over Wi-Fi), but a terminal silent for minutes
        looks like a hang: say so, once a stall timeout."""
        if not waiting:
            self._next_exchange_note = 0.0
            return
        if now < self._next_exchange_note:
            return
        self._next_exchange_note = now + self.stall_timeout_s
        many = len(waiting) > 1
        op = next(iter(waiting.values()))
        longest = max(self._waited(self.status[r], now) for r in waiting)
        self.log(f"rank{'s' if many else ''} {', '.join(str(r) for r in sorted(waiting))} "
                 f"{'have' if many else 'has'} been in {op.get('op')} (op {op.get('id')}) for {longest:.0f} s, "
                 f"and data keeps arriving: a large exchange over a slow link")

    def _data_moving(self, now: float, waiting: dict[int, dict[str, Any]]) -> bool:
        """Whether data has reached a waiting rank within the stall timeout, since it entered its
        collective. Every collective needs every rank, so while one is stuck no data moves
        anywhere for long; while it does, a long wait is a large exchange over a slow link (a big
        model's first broadcast over Wi-Fi takes minutes), not a stall. Judged by each waiting
        rank's last beat, so a stall is named at most a beat late. A beat that is late (a Mac
        loaded for a moment) leaves what the last one said standing: it used to count as no
        data at all, and a rank receiving all along had its sender named "made no progress"
        (a rank whose beats stop is lost by the heartbeat timeout instead). Data from before the
        wait does not count: a wait that began right after the last collective ended looked
        like data still arriving for up to a beat."""
        def moving(st: dict[str, Any]) -> bool:
            quiet, entered = st.get("quiet_s"), (st.get("waiting") or {}).get("for_s")
            return (quiet is not None and quiet < self.stall_timeout_s
                    and (not isinstance(entered, (int, float)) or quiet < entered))
        return any(moving(st) for rank, st in self.status.items() if rank in waiting)

    def _on_stacks(self, msg: dict[str, Any], peer: Peer) -> None:
        rank, text = msg.get("rank"), msg.get("text")
        if isinstance(rank, int) and isinstance(text, str):  # asked when a stall is reported, or a rank lost
            cpu, outside = msg.get("cpu_s"), msg.get("outside")
            self.samples[rank] = Sample(text, float(cpu) if isinstance(cpu, (int, float)) else None, time.monotonic(),
                                        outside if isinstance(outside, str) else None)
            for failure in self.failures:  # a rank that went silent: the dump comes after the failure
                if failure.rank == rank and failure.exit is None and not failure.detail:
                    failure.detail = f"rank {rank} was at:\n{text}"
                    return  # the report shows it there, under the failure
            # A recheck's answer is for us alone, and one that comes after its stall has passed
            # (the suspect joined) is stale: said, it showed stacks a second time
            if rank in self._to_show:
                self._to_show.discard(rank)
                self.log(f"rank {rank} ({self._host_of(rank)}) is at:\n{_indent(text)}")

    def _on_trace(self, msg: dict[str, Any], peer: Peer) -> None:
        sender = str(msg.get("from"))
        if self.trace is not None and sender.startswith("rank-"):
            rank = int(sender[5:])
            self.trace.add(rank, self.hosts.get(rank, "?"), msg.get("events") or (), msg.get("dropped"))

    def _on_report(self, msg: dict[str, Any], peer: Peer) -> None:
        rank = msg.get("rank")
        if isinstance(rank, int):
            self.reports[rank] = dict(msg.get("data") or {})

    def _on_dataset(self, msg: dict[str, Any], peer: Peer) -> None:
        self._warn(self.agreement.dataset(msg))

    def _on_batch(self, msg: dict[str, Any], peer: Peer) -> None:
        self._warn(self.agreement.batch(msg))

    def _on_sources(self, msg: dict[str, Any], peer: Peer) -> None:
        self._warn(self.agreement.sources(msg, self.hosts))

    def _warn(self, warning: str | None) -> None:
        if warning:
            self.log(f"warning: {warning}")

    def ring_table(self) -> str:
        links = {rank: hello.get("link") or "?" for hello in self.hellos.values()
                 for rank in range(*hello.get("ranks", (0, 0)))}
        lines = [f"{self.world_size} ranks on {self.num_agents} hosts:",
                 f"  {'rank':>4}  {'host':<24} {'data address':<16} {'link':<28} device"]
        for rank in range(self.world_size):
            addr, link = self.data_addrs.get(rank, "?"), links.get(rank, "?")
            lines.append(f"  {rank:>4}  {self.hosts.get(rank, '?'):<24} {addr:<16} {link:<28} "
                         f"{self.devices.get(rank, '?')}")
        return "\n".join(lines)

    def _on_exit(self, msg: dict[str, Any], peer: Peer) -> None:
        exit_ = WorkerExit.from_fields(msg)
        self.exits[exit_.rank] = exit_
        self._exited_at[exit_.rank] = time.monotonic()
        self.peers.setdefault(f"rank-{exit_.rank}", Peer(b"")).watched = False
        if len(self.exits) == self.world_size:  # agent 0 serves the store until the last rank is out
            self.send("agent-0", protocol.END)
        if exit_.code != 0:
            what = f"signal {exit_.signal}" if exit_.signal else f"exit code {exit_.code}"
            # Ordered by when it reached us, not by the host's clock: Macs' clocks differ by tens of
            # milliseconds, more than a PeerLost takes to follow the failure that caused it (the
            # ranks hear of that failure from us, after it has arrived).
            self.fail(Failure(time.time(), f"rank {exit_.rank} ({exit_.host}) failed with {what}", exit_.rank, exit_))
        self._check_never_joined()

    def _check_never_joined(self) -> None:
        """The peer table needs every rank. One that finished without registering (it never
        called macfleet.init(), as a script that uses torch.distributed alone does not) leaves
        any rank that did register waiting for the rendezvous timeout: say so now. A job
        where no rank registers is such a script, and fine."""
        if self.aborted is not None or not self.registered:
            return
        gone = sorted(r for r in self.exits if r not in self.registered)
        if gone:
            who = ", ".join(f"{r} ({self.exits[r].host})" for r in gone)
            waiting = ", ".join(str(r) for r in sorted(self.registered))
            self.fail(Failure(time.time(), (
                f"rank{'s' if len(gone) > 1 else ''} {who} exited (code {self.exits[gone[0]].code}) without "
                f"joining the job, while rank{'s' if len(self.registered) > 1 else ''} {waiting} called "
                f"macfleet.init() and wait{'' if len(self.registered) > 1 else 's'} for every rank: every rank "
                f"must call macfleet.init()"), gone[0]))

    def _on_bye(self, msg: dict[str, Any], peer: Peer) -> None:
        peer.watched = False  # a finished rank is not a hung one
        sender, last_op = str(msg.get("from")), msg.get("last_op")
        if not sender.startswith("rank-"):
            return
        rank = int(sender[5:])
        if rank in self.status:  # it is in no collective now, whatever its last beat said
            self.status[rank]["waiting"] = None
        if isinstance(last_op, int):
            self.last_ops[rank] = last_op
        broken = _broken(msg.get("broken"))
        if broken is not None:
            self.broken[rank] = broken
        waited, ran = msg.get("waited_s"), msg.get("ran_s")
        if isinstance(waited, (int, float)) and isinstance(ran, (int, float)) and waited >= 0 and ran > 0:
            self.waits[rank] = (float(waited), float(ran))
        stood = msg.get("stood_by_s")
        if isinstance(stood, (int, float)) and stood > 0:
            self.stood_by[rank] = float(stood)
        step_s, share = msg.get("step_s"), msg.get("share")
        if isinstance(step_s, (int, float)) and isinstance(share, (int, float)) and step_s > 0 and 0 < share <= 1:
            self.speeds[rank] = float(share) / float(step_s)

    def _on_done(self, msg: dict[str, Any], peer: Peer) -> None:
        index = msg.get("host_index")
        if isinstance(index, int):
            self.agents_done.add(index)
        cut = msg.get("cut_logs")
        if isinstance(cut, (list, tuple)):  # msgpack gives tuples (wire.unpack)
            self.cut_logs.update(r for r in cut if isinstance(r, int))
        peer.watched = False

    def _check_heartbeats(self) -> None:
        now = time.monotonic()
        stalled, self._last_check = now - self._last_check, now
        if stalled > 2 * protocol.HEARTBEAT_S:
            # The launcher itself did not run (Ctrl-Z then fg, a launching Mac that slept): the
            # others' beats of that time wait in its socket, read at the next poll. Its own
            # pause is nobody's silence; judge them, and their waits, from the next round on.
            for peer in self.peers.values():
                peer.last_seen = max(peer.last_seen, now - protocol.HEARTBEAT_S)
            return
        for name, peer in self.peers.items():
            if peer.watched and now - peer.last_seen > self.heartbeat_timeout_s:
                peer.watched = False
                self.lost.add(name)
                rank = int(name.split("-")[1]) if name.startswith("rank-") else None
                who = f"rank {rank} ({self.hosts.get(rank, '?')})" if rank is not None else self._agent(name)
                waiting = self._waiting_for(now, but=rank)
                cause = "stopped, hung, asleep, or its host is cut off"
                if rank is not None:  # hung holding the GIL? its agent can still get its stacks (dumps.py)
                    self.send_each("agent", protocol.STACKS, rank=rank)
                self.fail(Failure(time.time(), f"{who} sent no heartbeat for {self.heartbeat_timeout_s:.0f} s "
                                               f"({cause}){self._who_waits(waiting)}", rank))
        self._check_left_behind()
        self._check_ended()
        self._check_went_on()
        self._check_sources(now)
        self._check_joining()
        self._check_stalls()

    def _check_sources(self, now: float) -> None:
        """Ranks in one broadcast that name different sources. Over sockets, where each takes
        another rank for the source, every one of them waits to receive and nothing is ever sent:
        the stall report named it after twice the stall timeout, as "messages are not getting
        through (network?)". (A rank that takes itself for the source hears from the answer,
        ``Channel.expect_answer``; through shared memory the signatures differ.) Each rank's beat
        says which source it took: two that differ in one collective fail the job at once."""
        if self.aborted is not None:
            return
        sources: dict[Any, dict[int, int]] = {}  # op -> rank -> the source it took
        for rank, st in self.status.items():
            waiting = st.get("waiting") or {}
            if isinstance(waiting.get("root"), int) and rank not in self.exits and \
                    now - st["at"] < 2 * protocol.HEARTBEAT_S:
                sources.setdefault(waiting.get("id"), {})[rank] = waiting["root"]
        for op, took in sources.items():
            if len(set(took.values())) > 1:
                named = ", ".join(f"rank {r} from rank {s}" for r, s in sorted(took.items()))
                self.fail(Failure(time.time(), f"the ranks name different sources for broadcast (op {op}): {named}; "
                                               f"every rank must name the same source"))
                return

    def _check_joining(self) -> None:
        """Ranks that called macfleet.init() wait there for every other rank (the rendezvous
        timeout, 10 minutes, bounds it). A rank still importing torch on a cold disk, downloading
        data or stuck before its init left the terminal silent all that while: once a stall
        timeout, say who waits for whom, and where each late rank is (its agent has faulthandler
        dump its stacks: it has no runtime to ask yet)."""
        now = time.monotonic()
        if self._first_joined is None or self.stall_timeout_s <= 0 or self.aborted is not None or \
                len(self.registered) == self.world_size or now < self._next_join_note:
            return
        self._next_join_note = now + self.stall_timeout_s
        late = [r for r in range(self.world_size) if r not in self.registered and r not in self.exits]
        if not late:
            return
        joined = sorted(self.registered)
        self.log(f"{ranks_text(joined)} called macfleet.init() "
                 f"{now - self._first_joined:.0f} s ago "
                 f"and wait{'' if len(joined) > 1 else 's'} for "
                 f"{', '.join(f'rank {r} ({self._host_of(r)})' for r in late[:8])}"
                 f"{' ...' if len(late) > 8 else ''}, not there yet: still starting (importing torch, loading "
                 f"data), or stuck before it")
        for r in late[:3]:
            self._to_show.add(r)
            self.send_each("agent", protocol.STACKS, rank=r)

    def _host_of(self, rank: int) -> str:
        """A rank's host: from its registration, else from its agent's hello (its ranks' range)."""
        if rank in self.hosts:
            return self.hosts[rank]
        for hello in self.hellos.values():
            first, end = (hello.get("ranks") or [0, 0])[:2]
            if first <= rank < end:
                return str(hello.get("host", "?"))
        return "?"

    def _agent(self, name: str) -> str:
        """'the agent on host mini2' for the peer ``agent-1``."""
        index = int(name.split("-")[1])
        host = self.hellos.get(index, {}).get("host")
        return f"the agent on host {host}" if host else f"the agent of host {index}"

    def _check_left_behind(self) -> None:
        """A rank waiting in a collective that a finished rank never entered waits forever:
        every collective needs every rank. Say so now, rather than after the stall timeout."""
        if self.aborted is not None or not any(e.code == 0 for e in self.exits.values()):
            return
        now = time.monotonic()
        # exited with code 0 but never said goodbye, which names its last collective: os._exit()
        # (a library's, or a signal handler's) skips macfleet's exit. Its goodbye, sent before
        # the process ended, would have come by now; the others wait for it for good.
        silent = sorted(r for r, e in self.exits.items() if e.code == 0 and r in self.registered and
                        r not in self.last_ops and now - self._exited_at[r] > 2 * protocol.HEARTBEAT_S)
        for rank, waiting in sorted(self._waiting_for(now).items()):
            if silent:
                self.fail(Failure(time.time(), (
                    f"rank {rank} waits in {waiting.get('op')} (op {waiting.get('id')}) for "
                    f"{self._ranks_named(silent)}, which exited (code 0) without leaving the job: "
                    f"os._exit() skips macfleet's exit, and every rank must call the same collectives"), silent[0]))
                return
            op = waiting.get("id")
            # exited with code 0: a rank that fails says goodbye too (at exit), and its failure is the cause
            gone = sorted(r for r, last in self.last_ops.items()
                          if isinstance(op, int) and last < op and r in self.exits and self.exits[r].code == 0)
            # or it left the collective we wait in (or an earlier one) by an exception it caught, then ended well
            halfway = sorted(r for r, broken in self.broken.items()
                             if isinstance(op, int) and broken["op"] <= op and r in self.exits and self.exits[r].code == 0)
            if halfway:
                left = self.broken[halfway[0]]
                self.fail(Failure(time.time(), (
                    f"rank {rank} waits in {waiting.get('op')} (op {op}) for rank {halfway[0]} "
                    f"({self.hosts.get(halfway[0], '?')}), which {_left(left)}, and then finished: "
                    f"{HALFWAY}; let that exception end the script"), halfway[0]))
                return
            if gone:
                self.fail(Failure(time.time(), (
                    f"rank {rank} waits in {waiting.get('op')} (op {op}) for {self._ranks_named(gone)}, "
                    f"which finished after op {self.last_ops[gone[0]]}: every rank must call the same collectives, "
                    f"and {'these' if len(gone) > 1 else 'it'} called fewer{_fewer_steps(str(waiting.get('op')))}"),
                    rank))
                return

    @property
    def _grace_s(self) -> float:
        """How long a rank that left the script's course by an exception (it works on, or its
        process does not exit) is given before the job fails: the stall timeout, or
        ``HALFWAY_GRACE_S`` with the stall check off."""
        return self.stall_timeout_s if self.stall_timeout_s > 0 else HALFWAY_GRACE_S

    def _check_ended(self) -> None:
        """A rank whose script ended by an exception exits within moments, after its atexit
        handlers, and its exit is the root cause, with its traceback. One still there a grace
        later (the stall timeout, or ``HALFWAY_GRACE_S`` with the stall check off) waits for
        threads of its script: Python waits for those that are not daemons, and the rank names
        them (bootstrap.py). The others, waiting for it in a collective, were stopped by the
        stall check, which named a rank that "made no progress", and the job whose other ranks
        had finished waited for good: fail the job with the script's exception."""
        if self.aborted is not None:
            return
        now = time.monotonic()
        grace = self._grace_s
        for rank, st in sorted(self.status.items()):
            if st.get("ended") is None or rank in self.exits:
                continue
            if now - self._ended_at.setdefault(rank, now) > grace:
                self.fail(Failure(time.time(), (
                    f"rank {rank} ({self.hosts.get(rank, '?')}) failed ({st['ended']}), and its process has not exited "
                    f"{grace:.0f} s later: Python waits for threads of its script that are not daemons (its last "
                    f"lines name them){self._who_waits(self._waiting_for(now, but=rank))}"),
                    rank))
                return

    def _check_went_on(self) -> None:
        """A rank that left a collective by an exception and went on: the ranks that wait in that
        collective wait for good. Not as soon as it left: an exception that ends the script ends
        the rank within moments (after its ``finally`` blocks), and its traceback is the better
        root cause. So once it calls another collective, or once the others have waited in theirs
        for a stall timeout (the stall report would call it working, and let them wait on), or
        for ``HALFWAY_GRACE_S`` with the stall check off."""
        if self.aborted is not None:
            return
        now = time.monotonic()
        grace = self._grace_s
        for rank, st in sorted(self.status.items()):
            broken = st.get("broken")
            if broken is None or rank in self.exits or st.get("ended") is not None:  # ended: _check_ended's
                continue
            waiting = self._waiting_for(now, but=rank)
            if broken["went_on"]:
                seen = self._went_on_at.setdefault(rank, now)
                if not waiting and now - seen < 2 * protocol.HEARTBEAT_S:
                    continue  # the beats that say who waits in it may still be on their way
            elif not any(self._waited(self.status[r], now) > grace for r in waiting):
                continue
            after = "went on to another collective" if broken["went_on"] else "works on without it"
            self.fail(Failure(time.time(), (
                f"rank {rank} ({self.hosts.get(rank, '?')}) {_left(broken)}, and {after}: "
                f"{HALFWAY}{self._who_waits(waiting)}; let that exception end the script"), rank))
            return

    # -- going down -------------------------------------------------------------------------
    def fail(self, failure: Failure) -> None:
        """Record a failure; the first one aborts the job."""
        self.failures.append(failure)
        if self.aborted is None:
            self.abort(failure.reason, failure.rank)

    def abort(self, reason: str, rank: int | None = None, signum: int | None = None) -> None:
        """Stop the job: every rank's collectives raise, and the agents stop their ranks. With
        ``signum`` (the user's Ctrl-C or SIGTERM to the launcher) they send the ranks that signal
        at once, as a terminal would: a collective raises only when a rank waits in one."""
        if self.aborted is not None:
            return
        self.aborted, self._abort_rank, self._abort_signal = reason, rank, signum
        for name, peer in list(self.peers.items()):
            self._send_abort(name, peer)

    def _send_abort(self, name: str, peer: Peer) -> None:
        peer.told_abort = True
        self.send(name, protocol.ABORT, reason=self.aborted, rank=self._abort_rank, signal=self._abort_signal)

    def send(self, name: str, kind: str, **fields: Any) -> None:
        peer = self.peers.get(name)
        if peer is None or not peer.identity:
            return
        self._seq += 1
        mac, header = wire.pack(self.secret, {"job": self.job_id, "kind": kind, "from": "coordinator",
                                              "seq": self._seq, **fields})
        try:
            self.socket.send_multipart([peer.identity, mac, header], flags=zmq.NOBLOCK)
        except zmq.ZMQError:
            pass  # that peer is gone (EHOSTUNREACH) or saturated; it is being handled as lost

    def send_each(self, role: str, kind: str, **fields: Any) -> None:
        """Send to every peer of ``role`` ("agent" or "rank") that has said hello."""
        for name in [n for n in self.peers if n.startswith(f"{role}-")]:
            self.send(name, kind, **fields)

    def root_cause(self) -> Failure | None:
        return min(self.failures, key=lambda f: f.time) if self.failures else None

    def close(self) -> None:
        self.socket.close(linger=0)


def _why_working(before: Sample | None, after: Sample) -> str | None:
    """Why a rank the others wait for is working, in words, from two answers of its a while
    apart, or None if it looks stuck: its stacks moved; it, or the processes it started (a pool
    preprocessing data, ``tar``), used a fifth of a core; or its main thread waits on the network
    or on a process it started (a download, ``curl``), which uses next to no processor."""
    if before is None or after.text != before.text:
        return "moving through its code"
    if after.cpu_s is not None and before.cpu_s is not None and after.cpu_s - before.cpu_s > 0.2 * (after.at - before.at):
        return "using the processor, itself or in processes it started"
    if after.outside is not None:
        return f"waiting on {after.outside}"
    return None


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


HALFWAY = "a collective left halfway cannot be finished"
# With the stall check off (--stall-timeout 0): how long the others may wait in a collective that
# a rank left by a caught exception while it works on. It cannot finish; the collective timeout
# (10 minutes) would end the job later, as a timeout, with the cause unnamed.
HALFWAY_GRACE_S = 60.0


def _left(broken: dict[str, Any]) -> str:
    """'left broadcast (op 1) by an exception (...) that the script caught', of a ``_broken``."""
    return f"left {broken['what']} by an exception ({broken['error']}) that the script caught"


def _broken(value: object) -> dict[str, Any] | None:
    """A rank's word that it left a collective by an exception (``Collectives.broken``), if whole."""
    if not isinstance(value, dict) or not isinstance(value.get("op"), int):
        return None
    return {"op": value["op"], "what": str(value.get("what", "")), "error": str(value.get("error", ""))[:300],
            "went_on": bool(value.get("went_on"))}


def _fewer_steps(op: str) -> str:
    """Why a rank calls fewer of DataParallel's collectives: it ran out of batches first."""
    if "DataParallel" not in op:
        return ""
    return ("; in DataParallel that means fewer training steps: every rank must run as many batches as the others "
            "(macfleet.DistributedSampler gives every rank the same number), or train inside `with model.join():`, "
            "where a rank out of batches takes part in the others' steps")
