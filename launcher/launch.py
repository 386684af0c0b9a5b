"""Run one job: coordinator, one agent per host, supervision, the final report and exit code.

The call chain from the CLI to the training processes is short on purpose:
``cli.launch`` -> ``run_job`` -> ``start_agent`` -> (agent) ``Popen``.
"""

from __future__ import annotations

import os
import secrets
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

import zmq

from macfleet.launcher.coordinator import Coordinator, Failure
from macfleet.launcher.hosts import Host
from macfleet.launcher.report import failure_report
from macfleet.protocol import AgentSpec

SIGNAL_EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143}


@dataclass
class LaunchConfig:
    hosts: list[Host]
    script: str
    args: list[str]
    device: str = "auto"
    seed: int = 0
    memory_fraction: float | None = None
    python: str = sys.executable
    cwd: str = field(default_factory=os.getcwd)
    env: dict[str, str] = field(default_factory=dict)
    heartbeat_timeout_s: float = 10.0
    start_timeout_s: float = 60.0
    grace_s: float = 3.0

    @property
    def world_size(self) -> int:
        return sum(h.slots for h in self.hosts)


@dataclass
class AgentProc:
    host: Host
    spec: AgentSpec
    proc: subprocess.Popen


def log(message: str) -> None:
    print(f"macfleet: {message}", file=sys.stderr, flush=True)


def start_agent(spec: AgentSpec, host: Host, python: str) -> subprocess.Popen:
    """Start the agent for ``host`` and hand it its spec on stdin (kept open: its EOF means we died)."""
    command = [python, "-m", "macfleet.workers.agent"]
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, start_new_session=True)
    assert proc.stdin is not None
    proc.stdin.write((spec.to_json() + "\n").encode())
    proc.stdin.flush()
    return proc


def run_job(cfg: LaunchConfig) -> int:
    job_id = secrets.token_hex(6)
    secret = secrets.token_bytes(32)
    ctx = zmq.Context()
    control_addr = "127.0.0.1" if all(h.is_local for h in cfg.hosts) else "0.0.0.0"
    coord = Coordinator(ctx, control_addr, secret, job_id, cfg.world_size, len(cfg.hosts), cfg.heartbeat_timeout_s)
    port = coord.endpoint.rsplit(":", 1)[1]
    interrupted: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        interrupted.append(signum)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    agents: list[AgentProc] = []
    try:
        rank_base = 0
        for index, host in enumerate(cfg.hosts):
            spec = AgentSpec(
                job_id=job_id, coordinator=f"tcp://127.0.0.1:{port}", secret_hex=secret.hex(), host_index=index,
                host=host.name, data_addr=host.addr or "127.0.0.1", rank_base=rank_base, slots=host.slots,
                world_size=cfg.world_size, script=cfg.script, args=list(cfg.args), device=cfg.device,
                seed=cfg.seed, memory_fraction=cfg.memory_fraction, cwd=cfg.cwd, python=cfg.python,
                env=dict(cfg.env), grace_s=cfg.grace_s, prefix_host=len(cfg.hosts) > 1,
            )
            agents.append(AgentProc(host, spec, start_agent(spec, host, cfg.python)))
            rank_base += host.slots
        return _supervise(cfg, coord, agents, interrupted)
    finally:
        for agent in agents:
            _stop_agent(agent)
        coord.close()
        ctx.destroy(linger=0)
        for s, handler in previous.items():
            signal.signal(s, handler)


def _supervise(cfg: LaunchConfig, coord: Coordinator, agents: list[AgentProc], interrupted: list[int]) -> int:
    started_at = time.monotonic()
    abort_at: float | None = None
    while True:
        coord.poll(0.05)
        if interrupted and coord.aborted is None:
            log(f"{signal.Signals(interrupted[0]).name} received, stopping every rank")
            coord.abort("stopped by the user")
        if not coord.started:
            if len(coord.hellos) == len(agents):
                coord.start_agents(master_addr=agents[0].spec.data_addr)
            elif time.monotonic() - started_at > cfg.start_timeout_s and coord.aborted is None:
                missing = [a.host.name for i, a in enumerate(agents) if i not in coord.hellos]
                coord.fail(Failure(time.time(), f"no agent answered from {', '.join(missing)} "
                                                f"within {cfg.start_timeout_s:.0f} s"))
        for index, agent in enumerate(agents):
            if agent.proc.poll() is not None and index not in coord.agents_done and coord.aborted is None:
                coord.fail(Failure(time.time(), f"the agent on {agent.host.name} exited unexpectedly "
                                                f"(code {agent.proc.returncode})"))
        if coord.aborted is not None and abort_at is None:
            abort_at = time.monotonic()
        all_down = all(a.proc.poll() is not None for a in agents)
        if all_down:
            coord.poll(0.05)  # messages the agents sent just before exiting
            break
        if abort_at is not None and time.monotonic() - abort_at > 2 * cfg.grace_s + 5:
            log("agents did not stop in time; killing them")
            break
    return _result(cfg, coord, interrupted)


def _result(cfg: LaunchConfig, coord: Coordinator, interrupted: list[int]) -> int:
    if interrupted:
        log("job stopped by the user")
        return SIGNAL_EXIT.get(signal.Signals(interrupted[0]), 1)
    root = coord.root_cause()
    if root is None:
        missing = [r for r in range(cfg.world_size) if r not in coord.exits]
        if not missing:
            return 0
        root = Failure(time.time(), f"ranks {missing} never reported an exit")
    print(failure_report(root, coord.exits, cfg.world_size), file=sys.stderr, flush=True)
    if coord.dropped:
        log(f"{coord.dropped} malformed or unauthenticated control messages were dropped")
    return root.exit.code if root.exit is not None else 1


def _stop_agent(agent: AgentProc) -> None:
    """Close its stdin (it stops its ranks on EOF), then make sure it is gone."""
    try:
        if agent.proc.stdin:
            agent.proc.stdin.close()
    except OSError:
        pass
    try:
        agent.proc.wait(timeout=agent.spec.grace_s * 2 + 2)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(agent.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        agent.proc.wait()


def quote(args: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in args)
