"""Run one job: coordinator, one agent per host, supervision, the final report and exit code.

The call chain from the CLI to the training processes is short on purpose:
``cli.launch`` -> ``run_job`` -> ``start_agent`` -> (agent) ``Popen``.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field

import zmq

from macfleet import protocol, timeline
from macfleet.commands import NOT_INSTALLED, module_command
from macfleet.launcher import cabling
from macfleet.launcher.coordinator import Coordinator, Failure
from macfleet.launcher.hosts import Host
from macfleet.launcher.relay import STDERR, STDOUT, Relay, drain, end_lines_at_echo, join_if_one_file
from macfleet.launcher.remote import SshOptions, resolve, ssh_command
from macfleet.netaddr import CABLE_ADVICE, over_wifi, route_source, with_local_network_advice
from macfleet.launcher.report import (failure_report, facts_table, pace_report, scripts_differ, stood_by_report,
                                      versions_differ)
from macfleet.launcher.stdin import StdinRelay
from macfleet.launcher.tracefile import TraceFile
from macfleet.protocol import AgentSpec

SIGNAL_EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129, signal.SIGQUIT: 131}
LAUNCHER = "launcher"  # the writer of our own lines, to the outputs every agent's relay writes to
FORWARDED_PREFIXES = ("MACFLEET_", "PYTORCH_")  # reach remote ranks, whose environment is sshd's


@dataclass
class LaunchConfig:
    hosts: list[Host]
    script: str
    args: list[str]
    device: str = "auto"
    seed: int = 0
    memory_fraction: float | None = None
    python: str = sys.executable  # of every host without a python= of its own in the hostfile
    cwd: str = field(default_factory=os.getcwd)
    env: dict[str, str] = field(default_factory=dict)
    ssh: SshOptions = field(default_factory=SshOptions)
    data_addrs: tuple[str, ...] = ()  # the launching host's data-plane address (or one per cable)
    data_iface: str | None = None  # every host binds to this interface's address
    allow_version_mismatch: bool = False
    heartbeat_timeout_s: float = 10.0
    stall_timeout_s: float = 60.0
    stall_action: str = "abort"
    start_timeout_s: float = 60.0
    grace_s: float = 3.0
    restart_count: int = 0
    log_dir: str | None = None  # each rank's output also goes to rank-K.log there, on its host
    show_ranks: list[int] | None = None  # only these ranks' output reaches the terminal (None: all)
    min_hosts: int | None = None  # go on without hosts that cannot be reached, while this many remain (None: all)
    timeline: str | None = None  # the ranks' timeline goes to this file, on this Mac (launch --timeline)

    @property
    def world_size(self) -> int:
        return sum(h.slots for h in self.hosts)

    def python_on(self, host: Host) -> str:
        """The Python of ``host``'s agent and ranks: its hostfile line's python=, else --python."""
        return host.python or self.python


@dataclass
class AgentProc:
    host: Host
    spec: AgentSpec
    proc: subprocess.Popen
    tail: deque = field(default_factory=lambda: deque(maxlen=20))  # its own lines (or ssh's), not its ranks'
    relays: list[Relay] = field(default_factory=list)  # copy its stdout and stderr to ours


@dataclass
class JobOutcome:
    code: int
    coordinator: Coordinator
    interrupted: bool = False
    # hosts (index -> why) whose agents could not be started, when --min-hosts lets the job go on
    # without them; the attempt then printed no failure report
    left_out: dict[int, str] = field(default_factory=dict)


@dataclass
class Unreached:
    """Hosts (index -> why) whose agents could not be started: ssh failed, or no answer."""
    hosts: dict[int, str] = field(default_factory=dict)
    first: bool = False  # one of them was the job's first failure


def log(message: str) -> None:
    _say(f"macfleet: {message}")


def _say(text: str) -> None:
    STDERR.write(LAUNCHER, (text + "\n").encode(errors="replace"))


def start_agent(spec: AgentSpec, host: Host, cfg: LaunchConfig) -> AgentProc:
    """Start the agent for ``host`` and hand it its spec on stdin, which stays open: its EOF
    tells the agent that we (or the ssh connection) died."""
    command = module_command(spec.python, "macfleet.workers.agent")
    if host.is_local:
        command[0] = os.path.expanduser(command[0])  # a ~/ path: this Mac's home, as a remote shell does
        proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True, cwd=os.path.expanduser(spec.cwd))
    else:
        proc = subprocess.Popen(ssh_command(host, cfg.ssh, spec.cwd, command), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    agent = AgentProc(host, spec, proc)
    assert proc.stdout is not None and proc.stderr is not None
    agent.relays = [Relay(proc.stdout, STDOUT, agent), Relay(proc.stderr, STDERR, agent, agent.tail)]
    for relay in agent.relays:
        relay.start()
    assert proc.stdin is not None
    try:
        proc.stdin.write((spec.to_json() + "\n").encode())
        proc.stdin.flush()
    except BrokenPipeError:
        pass  # ssh already failed; supervision reports it with ssh's own words
    return agent


def plan_addresses(cfg: LaunchConfig) -> tuple[list[list[str]], list[str], list[str]]:
    """For each host: its data-plane addresses (none: its agent picks the one routing to us) and
    the coordinator address its agent connects to; plus the addresses the coordinator binds
    (never all interfaces)."""
    resolved = [None if h.is_local else resolve(h, cfg.ssh) for h in cfg.hosts]
    remote_ips = [ip for ip in resolved if ip]
    data, control = [], []
    for host, ip in zip(cfg.hosts, resolved, strict=True):
        if host.is_local:
            default = route_source(remote_ips[0]) if remote_ips else "127.0.0.1"
            data.append(list(given_addrs(cfg, host) or [default]))
            control.append("127.0.0.1")
        else:
            data.append(list(given_addrs(cfg, host)) or ([ip] if ip else []))
            control.append(route_source(ip) if ip else "0.0.0.0")
    binds = sorted(set(control))
    if "0.0.0.0" in binds:
        binds = ["0.0.0.0"]  # a host we could not resolve: only a wildcard is sure to be reachable
        log("warning: could not resolve every host; the coordinator listens on all interfaces")
    return data, control, binds


def given_addrs(cfg: LaunchConfig, host: Host) -> tuple[str, ...]:
    """The data addresses the user gave for ``host``: its ``addr=`` (MLX's ips), or
    ``--data-addr`` for the launching Mac; none where the launcher is to find them."""
    return host.addrs or (cfg.data_addrs if host.is_local else ())


def neighbour_addrs(cfg: LaunchConfig, index: int) -> list[str]:
    """The data addresses given (addr=, MLX's ips) for the hosts before and after host
    ``index`` in the ring, where its own are given too: its agent adds its own end of any cable
    to them (``workers.agent.data_addresses``). Addresses the launcher found by name are left
    out: a Mac's other interfaces on the network they name are not cables to train over."""
    given = [given_addrs(cfg, h) for h in cfg.hosts]
    n = len(given)
    around = [i for i in dict.fromkeys([(index - 1) % n, (index + 1) % n]) if i != index]
    return [addr for i in around for addr in given[i]] if given[index] else []


def shares_env(hosts: list[Host]) -> dict[str, str]:
    """``MACFLEET_SHARES`` from the hosts' ``share=``, one per rank (``macfleet.shares()``);
    nothing where every host has the default. Made for the hosts of this attempt, so it
    follows them when one is left out."""
    if all(h.share == 1 for h in hosts):
        return {}
    return {"MACFLEET_SHARES": ",".join(str(h.share) for h in hosts for _ in range(h.slots))}


def terminal_env() -> dict[str, str]:
    """The size of the launcher's terminal, for ranks whose output is a pipe (each agent takes
    its ``[rank K]`` prefix off the width): progress bars (tqdm, rich) fill the line instead of
    80 columns. Nothing where the launcher's output is not a terminal."""
    if not sys.stdout.isatty():
        return {}
    size = shutil.get_terminal_size((0, 0))
    return {"MACFLEET_TERMINAL": f"{size.columns}x{size.lines}"} if size.columns > 0 and size.lines > 0 else {}


def run_job(cfg: LaunchConfig, stdin: StdinRelay | None = None, trace: TraceFile | None = None) -> JobOutcome:
    """One attempt of the job; ``stdin``: what to pass on to its ranks' standard input (none for
    bench and doctor, whose ranks read none); ``trace``: where the ranks' timeline goes (none:
    they record none)."""
    join_if_one_file()  # a rank's prompt on stdout, then our note on stderr: on one terminal, one line
    job_id = secrets.token_hex(6)
    secret = secrets.token_bytes(32)
    ctx = zmq.Context()
    data_addrs, control_addrs, binds = plan_addresses(cfg)
    coord = Coordinator(ctx, binds, secret, job_id, cfg.world_size, len(cfg.hosts), cfg.heartbeat_timeout_s,
                        cfg.stall_timeout_s, cfg.stall_action, log, trace)
    interrupted: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        interrupted.append(signum)

    # SIGHUP (the terminal closed, or the ssh connection it ran over dropped) and SIGQUIT
    # (Ctrl-\) stop the job as SIGTERM does, as under torchrun; their default actions ended the
    # launcher at once, with no word. One ignored when we started stays ignored: Ctrl-C for a job
    # started in the background of a shell script (``&``), which the shell keeps from the Ctrl-C
    # meant for its foreground; SIGHUP under nohup.
    previous = {s: signal.signal(s, on_signal) for s in SIGNAL_EXIT if signal.getsignal(s) is not signal.SIG_IGN}
    forwarded = {**{k: v for k, v in os.environ.items() if k.startswith(FORWARDED_PREFIXES)}, **terminal_env()}
    agents: list[AgentProc] = []
    try:
        rank_base = 0
        for index, host in enumerate(cfg.hosts):
            connect = control_addrs[index] if control_addrs[index] != "0.0.0.0" else ""
            spec = AgentSpec(
                job_id=job_id, coordinator=coord.endpoint_for(connect), secret_hex=secret.hex(),
                host_index=index, host=host.name, data_addrs=data_addrs[index], data_iface=cfg.data_iface,
                rank_base=rank_base, slots=host.slots, world_size=cfg.world_size, script=cfg.script,
                args=list(cfg.args), device=cfg.device, seed=cfg.seed, memory_fraction=cfg.memory_fraction,
                cwd=cfg.cwd, python=cfg.python_on(host), restart_count=cfg.restart_count,
                env={**forwarded, **cfg.env, **shares_env(cfg.hosts), **({timeline.ENV: "1"} if trace else {})},
                grace_s=cfg.grace_s, prefix_host=len(cfg.hosts) > 1, heartbeat_timeout_s=cfg.heartbeat_timeout_s,
                log_dir=cfg.log_dir, show_ranks=cfg.show_ranks,
                neighbour_addrs=neighbour_addrs(cfg, index),
            )
            try:
                agents.append(start_agent(spec, host, cfg))
            except OSError as exc:  # no ssh on this Mac, say
                coord.fail(Failure(time.time(), f"cannot start the agent for {host.name}: {exc}"))
                break
            rank_base += host.slots
        unreached = Unreached()
        _supervise(cfg, coord, agents, interrupted, stdin, unreached)
        if cfg.min_hosts is not None and unreached.first and not coord.started and not interrupted:
            reached = len(cfg.hosts) - len(unreached.hosts)
            if reached >= cfg.min_hosts:  # no report: the job goes on without them (run_on_reachable_hosts)
                return JobOutcome(1, coord, left_out=unreached.hosts)
            log(f"{reached} of {len(cfg.hosts)} hosts could be reached, fewer than --min-hosts {cfg.min_hosts}")
        return JobOutcome(_result(cfg, coord, interrupted), coord, bool(interrupted))
    finally:
        for agent in agents:
            _stop_agent(agent)
        coord.close()
        ctx.destroy(linger=0)
        for s, handler in previous.items():
            signal.signal(s, handler)


def _supervise(cfg: LaunchConfig, coord: Coordinator, agents: list[AgentProc], interrupted: list[int],
               stdin: StdinRelay | None, unreached: Unreached) -> None:
    """Until the job has ended, noting in ``unreached`` the hosts whose agents could not be
    started."""
    started_at = time.monotonic()
    abort_at: float | None = None
    ended_well: dict[int, float] = {}  # agent -> when its process was seen ended before its goodbye arrived
    ring_shown = False
    stdin_ended = False
    while True:
        coord.poll(0.05)
        if stdin is not None and not stdin_ended and coord.started and coord.aborted is None:  # agents spawn on START
            data, stdin_ended = stdin.take()
            if data or stdin_ended:
                ended = end_lines_at_echo(stdin.fd) if stdin.echoed_line(data) else []
                coord.send_each("agent", protocol.STDIN, data=data, eof=stdin_ended, lines_ended=ended)
        if interrupted and coord.aborted is None:
            log(f"{signal.Signals(interrupted[0]).name} received, stopping every rank on every host")
            coord.abort("stopped by the user", signum=interrupted[0])
        if not coord.started and coord.aborted is None:
            if len(coord.hellos) == len(agents):
                _start(cfg, coord, agents)
            elif time.monotonic() - started_at > cfg.start_timeout_s:
                missing = [i for i in range(len(agents)) if i not in coord.hellos]
                silent = f"within {cfg.start_timeout_s:.0f} s"
                unreached.hosts.update({i: f"no agent answered from {agents[i].host.name} {silent}"
                                        for i in missing if not agents[i].host.is_local})
                unreached.first = all(not agents[i].host.is_local for i in missing)
                coord.fail(Failure(time.time(), f"no agent answered from "
                                                f"{', '.join(agents[i].host.name for i in missing)} {silent}"))
        if not ring_shown and len(coord.registered) == cfg.world_size:
            ring_shown = True
            if len(agents) > 1:
                log(coord.ring_table())
                wifi = [agents[i].host.name for i, hello in sorted(coord.hellos.items()) if over_wifi(hello.get("link"))]
                if wifi:
                    log(f"{', '.join(wifi)} train{'s' if len(wifi) == 1 else ''} over Wi-Fi: every step "
                        f"waits on a link 10-50x slower than a cable; {CABLE_ADVICE}")
                cabled = [agents[i].host.name for i, hello in sorted(coord.hellos.items())
                          if len(hello.get("data_addrs") or ()) > 1]
                if cabled:  # else a script's init_process_group waits for connections that never come
                    log(f"{', '.join(cabled)} {'has' if len(cabled) == 1 else 'have'} one address per cable: "
                        f"macfleet's ring sends over each; torch.distributed (gloo), if the script uses it "
                        f"itself, needs a network on which every Mac reaches every other")
        for index, agent in enumerate(agents):
            if agent.proc.poll() is not None and index not in coord.hellos and index not in unreached.hosts and \
                    not agent.host.is_local and agent.proc.returncode == 255:
                # ssh's own failure (no connection, no login), even after another host's: each one
                # that --min-hosts goes on without, at once
                unreached.hosts[index] = _agent_lost(agent, reached=False, waited_s=cfg.heartbeat_timeout_s)
            if agent.proc.poll() is not None and index not in coord.agents_done and coord.aborted is None:
                # Code 0: its ranks all finished and it said goodbye before it ended. Over a link
                # that was lost for a while, ssh's word of the end can come first: TCP's backoff
                # holds the control connection seconds longer.
                since = ended_well.setdefault(index, time.monotonic())
                if agent.proc.returncode == 0 and index in coord.hellos and \
                        time.monotonic() - since < cfg.heartbeat_timeout_s:
                    continue
                unreached.first = index in unreached.hosts
                coord.fail(Failure(time.time(), unreached.hosts.get(index) or _agent_lost(
                    agent, reached=index in coord.hellos, waited_s=cfg.heartbeat_timeout_s)))
            if f"agent-{index}" in coord.lost and agent.proc.poll() is None:
                # Unreachable: nothing we send arrives. Its agent stops its ranks by itself when we
                # fall silent; waiting on the ssh connection would only delay the report.
                _kill_group(agent.proc.pid)
        if coord.aborted is not None and abort_at is None:
            abort_at = time.monotonic()
        if all(a.proc.poll() is not None for a in agents):
            coord.poll(0.05)  # messages the agents sent just before exiting
            if coord.aborted is not None or len(coord.agents_done) == len(agents):
                break
        if abort_at is not None and time.monotonic() - abort_at > 2 * cfg.grace_s + 5:
            log("agents did not stop in time; killing them")
            break
    drain([r for a in agents for r in a.relays])  # what they wrote last (a rank's traceback), before the report


def _start(cfg: LaunchConfig, coord: Coordinator, agents: list[AgentProc]) -> None:
    facts = [coord.hellos[i].get("facts", {}) for i in range(len(agents))]
    names = [a.host.name for a in agents]
    if versions_differ(facts) and not cfg.allow_version_mismatch:
        log("hosts disagree on versions (--allow-version-mismatch to run anyway):\n" + facts_table(names, facts))
        coord.fail(Failure(time.time(), "hosts run different torch or macfleet versions"))
        return
    # With no disk the Macs share, each runs its own copy of the script (agent.script_digest).
    missing = [name for name, f in zip(names, facts, strict=True) if f.get("script") == "missing"]
    if missing:
        coord.fail(Failure(time.time(), f"the script {os.path.join(cfg.cwd, cfg.script)} is not on "
                                        f"{', '.join(missing)}: every Mac runs its own copy, at the same path; copy "
                                        f"it there, or keep it on a disk they share"))
        return
    if scripts_differ(facts):
        log(f"warning: {cfg.script} is not the same on every host (an edit not copied to every Mac?), and each "
            f"runs its own (the SHA-256 of each host's copy):\n" + facts_table(names, facts, ("script",)))
    wrong = cabling.hellos_out_of_order(coord.hellos, len(agents))
    if wrong:
        fix = (f"list them in cabling order: {', '.join(names[i] for i in wrong.order)}" if wrong.order else
               "the cables join no ring through every host")
        pairs = "; ".join(f"{names[i]} and {names[j]}" for i, j in wrong.gaps)
        coord.fail(Failure(time.time(), f"no cable joins hosts next to each other in the host list ({pairs}: no "
                                        f"subnet holds a data address of each), and the ring sends from each Mac "
                                        f"to the next; {fix}"))
        return
    coord.start_agents(master_addr=str(coord.hellos[0].get("data_addr", "")))


def _agent_lost(agent: AgentProc, reached: bool, waited_s: float) -> str:
    """Why an agent ended before the job did. ``reached``: it had said hello, so ssh worked."""
    drain(agent.relays)  # its last words
    code = agent.proc.returncode
    if code == 0 and reached:
        return (f"the agent on {agent.host.name} ended and its ranks finished, but its last messages (their "
                f"exits) did not reach the launcher within {waited_s:.0f} s: the link to that host is failing?")
    said = next((line for line in reversed(agent.tail) if line.strip()), "")  # a remote one's last words
    if said.startswith("macfleet agent"):
        return said  # it refused, and said why
    if said.startswith(NOT_INSTALLED):
        return (f"{said} on {agent.host.name}: install it there, or name the Python that has it (--python, or "
                f"python=PATH on its hostfile line)")
    if code < 0:  # killed by a signal: the agent itself, or the ssh process that runs a remote one
        what = "the agent on" if agent.host.is_local else "the ssh connection to"
        return f"{what} {agent.host.name} was killed by {_signal_name(-code)}"
    if not agent.host.is_local and code == 255:  # ssh's own failure, or its command killed by a signal
        if not reached:
            return f"cannot reach {agent.host.ssh_target} over ssh: {with_local_network_advice(said or 'no message')}"
        return (f"the agent on {agent.host.name} ended without a word after it had started (killed by a signal, "
                f"such as macOS ending processes when memory runs out, or its ssh connection closed)"
                + (f": {said}" if said else ""))
    lost = f"the agent on {agent.host.name} exited unexpectedly (code {code})" + (f": {said}" if said else "")
    if code == 127:  # the remote shell found no such program
        named = f"python={agent.spec.python} in the hostfile" if agent.host.python else f"--python {agent.spec.python}"
        lost += f" (is {named} right for that host?)"
    return lost


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _result(cfg: LaunchConfig, coord: Coordinator, interrupted: list[int]) -> int:
    if coord.dropped:
        log(f"{coord.dropped} malformed or unauthenticated control messages were dropped")
    if interrupted:
        log("job stopped by the user")
        return SIGNAL_EXIT.get(signal.Signals(interrupted[0]), 1)
    root = coord.root_cause()
    if root is None:
        missing = [r for r in range(cfg.world_size) if r not in coord.exits]
        if not missing:
            return 0
        root = Failure(time.time(), f"ranks {missing} never reported an exit")
    _say(failure_report(root, coord.exits, cfg.world_size))
    return root.exit.code if root.exit is not None else 1


def _stop_agent(agent: AgentProc) -> None:
    """Close its stdin (it stops its ranks on EOF), then make sure it is gone."""
    try:
        if agent.proc.stdin:
            agent.proc.stdin.close()
    except OSError:
        pass
    try:
        agent.proc.wait(timeout=agent.spec.grace_s * 2 + 3)
    except subprocess.TimeoutExpired:
        _kill_group(agent.proc.pid)
        agent.proc.wait()


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# A fresh start meets these again at once: the script's own mistakes (it calls collectives
# differently on different ranks, misuses the API, cannot be imported), not a lost Mac or a crash.
NOT_RESTARTED = ("ConfigError", "ProtocolError", "SyntaxError", "IndentationError", "ImportError",
                 "ModuleNotFoundError", "NameError")


def run_with_restarts(cfg: LaunchConfig, max_restarts: int) -> int:
    """Run the job; after a failure, run it again from scratch (a new rendezvous round with
    ``MACFLEET_RESTART_COUNT`` one higher) up to ``max_restarts`` times. The script resumes
    from its own checkpoint. No restart after Ctrl-C, or when the job never started (a
    configuration problem would only fail again)."""
    stdin = StdinRelay()
    trace = TraceFile(cfg.timeline) if cfg.timeline else None  # one file for every attempt
    try:
        return _run_attempts(cfg, max_restarts, stdin, trace)
    finally:
        if trace is not None:
            trace.close()
            for line in trace.summary():
                log(line)


def _run_attempts(cfg: LaunchConfig, max_restarts: int, stdin: StdinRelay, trace: TraceFile | None) -> int:
    for attempt in range(max_restarts + 1):
        cfg.restart_count = attempt
        outcome, job = run_on_reachable_hosts(cfg, stdin, trace)
        if outcome.code == 0:  # a training job's, not bench's or doctor's: their own tables say it
            coord = outcome.coordinator
            for line in pace_report(coord.waits, coord.hosts, job.world_size, coord.speeds, coord.stood_by):
                log(line)
            for line in stood_by_report(coord.stood_by, coord.waits):
                log(line)
        if outcome.code == 0 or outcome.interrupted or not outcome.coordinator.started or attempt == max_restarts:
            if cfg.log_dir is not None and outcome.coordinator.started:
                where = " on its host" if len(job.hosts) > 1 else ""
                cut = sorted(outcome.coordinator.cut_logs)
                if cut:  # its agent said where, and why
                    where += (f", cut short for rank{'s' if len(cut) > 1 else ''} {', '.join(map(str, cut))} "
                              f"(no room on the disk)")
                log(f"each rank's output is also in {os.path.join(cfg.cwd, cfg.log_dir, 'rank-K.log')}{where}")
            return outcome.code
        root = outcome.coordinator.root_cause()
        kind = (root.exit.error or {}).get("type") if root is not None and root.exit is not None else None
        if kind in NOT_RESTARTED:
            log(f"not restarting: the job failed with {kind}, a mistake in the script that a restart would meet "
                f"again (--max-restarts is for lost Macs and crashes)")
            return outcome.code
        log(f"restart {attempt + 1} of {max_restarts} after: {root.reason if root else 'a failure'}")
    return 1


def run_on_reachable_hosts(cfg: LaunchConfig, stdin: StdinRelay | None,
                           trace: TraceFile | None = None) -> tuple[JobOutcome, LaunchConfig]:
    """One attempt of the job, and the configuration it ran with. With ``--min-hosts``, hosts
    whose agents cannot be started (a Mac asleep, its lid closed, off the network) are left out
    and the job starts again on the others, as long as that many remain. Each attempt starts
    from every host: a Mac that is back joins at the next restart."""
    job = cfg
    while True:
        outcome = run_job(job, stdin, trace)
        if not outcome.left_out:
            return outcome, job
        gone = [job.hosts[i].name for i in sorted(outcome.left_out)]
        for index in sorted(outcome.left_out):
            log(outcome.left_out[index])
        first = job.hosts[0]
        job = dataclasses.replace(job, hosts=[h for i, h in enumerate(job.hosts) if i not in outcome.left_out])
        moved = "" if job.hosts[0] is first else \
            (f"; rank 0 now runs on {job.hosts[0].name}: a checkpoint that rank 0 kept on {first.name}'s disk is not "
             f"there, unless the Macs share that directory")
        ranks = f"{job.world_size} rank{'s' if job.world_size > 1 else ''}"
        log(f"going on without {', '.join(gone)}: {ranks} on {len(job.hosts)} of {len(cfg.hosts)} hosts "
            f"(--min-hosts {cfg.min_hosts}){moved}")
        if job.show_ranks is not None and max(job.show_ranks) >= job.world_size:  # checked against every host
            shown = [r for r in job.show_ranks if r < job.world_size]
            log(f"--show-ranks: no rank {', '.join(str(r) for r in job.show_ranks if r >= job.world_size)} now; "
                + (f"showing {', '.join(map(str, shown))}" if shown else "showing rank 0"))
            job = dataclasses.replace(job, show_ranks=shown or [0])
