"""Fixtures for tests that start real jobs: real processes, real sockets, timeouts, no leftovers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(__file__).resolve().parent / "bin"
MNIST = ROOT / "examples" / "mnist" / "train.py"


@dataclass
class Job:
    code: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def pytest_configure(config) -> None:
    """The tests that press Ctrl-C mean a launcher started from a terminal, where SIGINT has its
    default action. Under a runner that ignores it (a background job of a shell script, as
    ``nohup bash .ci/run &`` is), every launcher would start with it ignored, and rightly keep
    ignoring it (test_a_launcher_started_with_ctrl_c_ignored_keeps_ignoring_it)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


def launch_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "macfleet.launcher.cli", "launch", *args]


def run_launch(*args: str, timeout: float = 120, env: dict[str, str] | None = None, cwd: str | None = None,
               prefix: list[str] | None = None) -> Job:
    """Run ``macfleet launch ARGS`` to completion (behind ``prefix``, a command that runs it);
    on timeout kill its whole process group and fail."""
    started = time.monotonic()
    proc = subprocess.Popen(
        [*(prefix or []), *launch_command(*args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **(env or {})}, cwd=cwd, start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc.pid)
        out, err = proc.communicate()
        pytest.fail(f"macfleet launch {' '.join(args)} ran over {timeout} s\n{out}\n{err}")
    return Job(proc.returncode, out, err, time.monotonic() - started)


def start_launch(*args: str, ready: str, ranks: int, env: dict[str, str] | None = None,
                 stderr: int = subprocess.PIPE, preexec_fn=None) -> tuple[subprocess.Popen, list[str]]:
    """Start ``macfleet launch ARGS`` in a session of its own; return it once ``ranks`` lines of
    its output hold ``ready`` (one from each rank), with the lines read so far."""
    proc = subprocess.Popen(launch_command(*args), stdout=subprocess.PIPE, stderr=stderr, text=True,
                            start_new_session=True, env={**os.environ, **(env or {})}, preexec_fn=preexec_fn)
    assert proc.stdout is not None
    lines: list[str] = []
    while sum(ready in line for line in lines) < ranks:
        line = proc.stdout.readline()
        if not line:
            kill_group(proc.pid)
            _, err = proc.communicate()
            pytest.fail(f"job ended before its ranks were ready: {err}")
        lines.append(line)
    return proc, lines


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def job_processes() -> list[str]:
    """Processes of any macfleet job on this machine (agents and ranks)."""
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line.strip() for line in out.splitlines()
            if "macfleet.workers" in line or "macfleet.launcher.cli" in line]


def shm_scratch() -> list[str]:
    """What jobs keep in /dev/shm: the agents' per-job directories (error files, shared-memory
    segments), and segments made as macOS makes them (MACFLEET_SHM_OBJECTS=1: glibc's shm_open
    puts them in /dev/shm)."""
    import glob

    return glob.glob("/dev/shm/macfleet-*") + glob.glob("/dev/shm/mf-*")


@pytest.fixture(autouse=True)
def no_leftover_processes(request):
    """Every test must leave no process of a job behind; give exiting ones a moment to be reaped.
    (A module's shared live job is exempt until the test that ends it.)"""
    yield
    if "live_job" in request.fixturenames and request.getfixturevalue("live_job")["proc"].poll() is None:
        return
    deadline = time.monotonic() + 10
    while job_processes() and time.monotonic() < deadline:
        time.sleep(0.1)  # polling for an exit to finish, not standing in for synchronisation
    left = job_processes()
    for line in left:
        try:
            os.kill(int(line.split()[0]), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    assert not left, f"processes left behind: {left}"
    segments = shm_scratch()
    for path in segments:
        subprocess.run(["rm", "-rf", path])
    assert not segments, f"shared memory left behind: {segments}"


@pytest.fixture(scope="session")
def sshd(tmp_path_factory):
    """A real sshd on 127.0.0.1-3; in CI it must be there (.ci/run installs openssh-server)."""
    import sshd as helper

    if not helper.available():
        if os.environ.get("CI"):
            pytest.fail("sshd/ssh/ssh-keygen missing in CI: .ci/run should have installed openssh-server")
        pytest.skip("no sshd on this machine (apt-get install openssh-server)")
    server = helper.start_sshd(tmp_path_factory.mktemp("sshd"), ["127.0.0.1", "127.0.0.2", "127.0.0.3"])
    yield server
    server.stop()


@pytest.fixture(scope="session")
def netns_hosts(tmp_path_factory):
    """Two hosts in their own network namespaces, each with its own sshd (where root and ip allow)."""
    import netns
    import sshd as helper

    if not (helper.available() and netns.available()):
        pytest.skip("needs root, iproute2 and sshd for network namespaces")
    hosts = netns.create(2)
    directory = tmp_path_factory.mktemp("netns-sshd")
    servers = []
    try:
        port = helper.free_port()
        while port in netns.ANY_PORTS:  # or a firewall() test would block ssh too (1 run in 28)
            port = helper.free_port()
        for host in hosts:
            addresses = [host.addr] + ([host.addr6] if host.addr6 else [])
            servers.append(helper.start_sshd(directory, addresses, port=port, prefix=host.exec_prefix()))
        yield hosts, servers[0]
    finally:
        for server in servers:
            server.stop()
        netns.destroy(2)
