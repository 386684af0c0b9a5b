"""Fixtures for tests that start real jobs: real processes, real sockets, timeouts, no leftovers."""

from __future__ import annotations

import glob
import gzip
import os
import signal
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from macfleet.segments import PREFIX, object_name

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


# Two test files run at a time on Linux (pytest-xdist, ``-n auto --dist loadfile`` in
# pyproject.toml): most of a test's time is its ranks importing torch, and a 2-core machine was a
# third idle running them one by one. Each worker sees only its own jobs: the processes it started
# (as their subreaper, orphans included) and the job directories in its own MACFLEET_SCRATCH_DIR.
# A file runs whole on one worker, so the tests that share a module's job stay together, and the
# network namespaces, whose names are fixed, are made in test_multihost.py alone. pytest-xdist
# (3.5 on) hands out the files with the most tests first, whatever order they are collected in;
# with these files the two workers end within about 10 s of each other (session 61, from each
# file's time in a whole run).
WORKER = os.environ.get("PYTEST_XDIST_WORKER")
SCRATCH_ROOT = "/dev/shm" if os.path.isdir("/dev/shm") else "/tmp"
SCRATCH = f"{SCRATCH_ROOT}/pytest-macfleet-{WORKER}" if WORKER else SCRATCH_ROOT


def pytest_xdist_auto_num_workers(config) -> int:
    """Two workers where a worker can be the subreaper of its jobs (Linux); elsewhere one at a time."""
    return 2 if sys.platform == "linux" else 0


def pytest_configure(config) -> None:
    """The tests that press Ctrl-C mean a launcher started from a terminal, where SIGINT has its
    default action. Under a runner that ignores it (a background job of a shell script, as
    ``nohup bash .ci/run &`` is), every launcher would start with it ignored, and rightly keep
    ignoring it (test_a_launcher_started_with_ctrl_c_ignored_keeps_ignoring_it)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if WORKER:
        import ctypes

        # PR_SET_CHILD_SUBREAPER: a rank whose agent was killed is reparented here, not to init,
        # so job_processes() still finds it among this worker's descendants
        if ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
        os.makedirs(SCRATCH, exist_ok=True)
        os.environ["MACFLEET_SCRATCH_DIR"] = SCRATCH  # reaches remote agents too (MACFLEET_* is forwarded)


def pytest_sessionfinish(session, exitstatus) -> None:
    """After every worker has ended (or after the one process, without workers): nothing of any
    job is left on the machine, whichever worker's it was."""
    if WORKER:
        try:
            os.rmdir(SCRATCH)  # empty, or kept for the check below
        except OSError:
            pass
        return
    left = wait_for_no_job_processes(find=lambda: job_processes(everyone=True))
    segments = glob.glob(f"{SCRATCH_ROOT}/pytest-macfleet-*/macfleet-*") + _unheld(shm_scratch(everyone=True))
    if left or segments:
        _remove(left, segments)
        writer = session.config.get_terminal_writer()
        writer.line()
        writer.line(f"left behind at the end of the session: processes {left}, shared memory {segments}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


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


def write_idx(path: Path, array) -> None:
    """``array`` (a torch tensor of bytes' values) as an IDX file, gzipped where ``path`` ends in .gz."""
    header = bytes([0, 0, 8, array.dim()]) + struct.pack(f">{array.dim()}I", *array.shape)
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wb") as f:
        f.write(header + bytes(array.flatten().tolist()))


def small_mnist(directory: Path, train: int, test: int) -> Path:
    """``directory`` holding MNIST's four IDX files, of ``train`` and ``test`` random images and
    labels: for the tests that compare runs of the example with each other, not its learning.
    The example's generated set (12,000 images) made each of their runs train for seconds."""
    import torch

    directory.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    for name, n in (("train", train), ("t10k", test)):
        write_idx(directory / f"{name}-images-idx3-ubyte", torch.randint(0, 256, (n, 28, 28), generator=g))
        write_idx(directory / f"{name}-labels-idx1-ubyte", torch.randint(0, 10, (n,), generator=g))
    return directory


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def bare_python(directory: Path) -> str:
    """The interpreter of a new venv in ``directory`` that has nothing installed: no macfleet."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(directory / "bare")], check=True, timeout=60)
    return str(directory / "bare" / "bin" / "python")


def job_processes(everyone: bool = False) -> list[str]:
    """Processes of this worker's macfleet jobs (agents and ranks); ``everyone``: of any job."""
    out = subprocess.run(["ps", "-ww", "-eo", "pid,ppid,args"], capture_output=True, text=True).stdout
    rows = [line.split(None, 2) for line in out.splitlines()[1:]]
    parent = {int(r[0]): int(r[1]) for r in rows if len(r) >= 2}

    def ours(pid: int) -> bool:
        while pid > 1:
            if pid == os.getpid():
                return True
            pid = parent.get(pid, 0)
        return False

    return [f"{r[0]} {r[2]}" for r in rows
            if len(r) == 3 and ("macfleet.workers" in r[2] or "macfleet.launcher.cli" in r[2])
            and (everyone or not WORKER or ours(int(r[0])))]


def shm_scratch(everyone: bool = False) -> list[str]:
    """What jobs keep in shared memory: the agents' per-job directories (error files, segments),
    and segments made as macOS makes them (MACFLEET_SHM_OBJECTS=1: glibc's shm_open puts them in
    /dev/shm). A worker's directories are in its own MACFLEET_SCRATCH_DIR; objects have one
    namespace for all, so a worker counts only those no process holds (_unheld)."""
    directories = glob.glob(f"{SCRATCH}/macfleet-*")
    if everyone and SCRATCH != SCRATCH_ROOT:
        directories += glob.glob(f"{SCRATCH_ROOT}/macfleet-*")
    return directories + glob.glob("/dev/shm/mf-*")


def leftover_scratch() -> list[str]:
    """``shm_scratch()`` less the objects another worker's live job holds, or has left for its
    agent to release (a killed rank's, in test_faults): that worker's own check counts those."""
    found = shm_scratch()
    if not WORKER:
        return found
    theirs = {f"/dev/shm{object_name(os.path.basename(marker))}"
              for marker in glob.glob(f"{SCRATCH_ROOT}/pytest-macfleet-*/macfleet-*/{PREFIX}*")
              if not marker.startswith(f"{SCRATCH}/")}
    return [p for p in found if "/mf-" not in p] + _unheld([p for p in found if "/mf-" in p and p not in theirs])


def _unheld(paths: list[str]) -> list[str]:
    """Those of ``paths`` that no process has open or mapped. An object the other worker's job
    makes (shm_open, then mmap) is held from the moment it exists."""
    if not paths:
        return []
    held: set[str] = set()
    for proc in glob.glob("/proc/[0-9]*"):
        try:
            for fd in os.listdir(f"{proc}/fd"):
                held.add(os.readlink(f"{proc}/fd/{fd}"))
            with open(f"{proc}/maps") as maps:
                held.update(line.split(None, 5)[-1].strip() for line in maps if "/dev/shm/" in line)
        except OSError:  # gone meanwhile
            continue
    return [p for p in paths if p not in held and os.path.exists(p)]


def _remove(processes: list[str], paths: list[str]) -> None:
    """What a check found left behind, so that the next test or session starts clean."""
    for line in processes:
        try:
            os.kill(int(line.split()[0]), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    for path in paths:
        subprocess.run(["rm", "-rf", path])


def wait_for_no_job_processes(within_s: float = 10, find=job_processes) -> list[str]:
    """Those of ``find()`` still there after up to ``within_s`` for them to end."""
    deadline = time.monotonic() + within_s
    while find() and time.monotonic() < deadline:
        time.sleep(0.1)  # polling for an exit to finish, not standing in for synchronisation
    return find()


@pytest.fixture(autouse=True)
def no_leftover_processes(request):
    """Every test must leave no process of a job behind; give exiting ones a moment to be reaped.
    (A module's shared live job is exempt until the test that ends it.)"""
    yield
    if "live_job" in request.fixturenames and request.getfixturevalue("live_job")["proc"].poll() is None:
        return
    left = wait_for_no_job_processes()
    segments = leftover_scratch()
    _remove(left, segments)
    assert not left, f"processes left behind: {left}"
    assert not segments, f"shared memory left behind: {segments}"


@pytest.fixture(scope="session")
def sshd(tmp_path_factory):
    """A real sshd on 127.0.0.1-3; in CI it must be there (.ci/run installs openssh-server)."""
    import sshd as helper

    if not helper.available():
        if os.environ.get("CI"):
            pytest.fail("sshd/ssh/ssh-keygen missing in CI: .ci/run should have installed openssh-server")
        pytest.skip("no sshd on this machine (apt-get install openssh-server)")
    missing = helper.not_here(["127.0.0.2", "127.0.0.3"])
    if missing:  # a Mac: lo0 has 127.0.0.1 alone
        pytest.skip(f"{' and '.join(missing)}, which stand for other Macs, are no addresses of this machine: "
                    + "; ".join(f"sudo ifconfig lo0 alias {addr} up" for addr in missing))
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
