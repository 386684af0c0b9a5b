"""Time from an injected fault to the job being fully down, with default settings.

    python benchmarks/failure_times.py [--json FILE]

Starts a 3-rank job (tests/bin/behave.py, ranks waiting in all-reduces), injects one fault,
and measures until the launcher has exited and no process of the job remains.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

BEHAVE = str(Path(__file__).resolve().parent.parent / "tests" / "bin" / "behave.py")


def job_processes() -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "macfleet.workers" in line or "macfleet.launcher.cli" in line]


def start(mode: str = "hang", fail_rank: str = "-1") -> tuple[subprocess.Popen, dict[int, int]]:
    proc = subprocess.Popen([sys.executable, "-m", "macfleet.launcher.cli", "launch", "--nproc", "3", BEHAVE,
                             fail_rank, mode], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    pids: dict[int, int] = {}
    while len(pids) < 3:
        line = proc.stdout.readline()
        if not line:
            break
        if " ready pid=" in line:
            pids[int(line.split()[1].rstrip("]"))] = int(line.rsplit("=", 1)[1])
    return proc, pids


def down_after(proc: subprocess.Popen, started: float) -> float:
    proc.wait(timeout=120)
    while job_processes():
        time.sleep(0.05)
    return time.monotonic() - started


def host_cut() -> float:
    """Two hosts in network namespaces (the test suite's helpers), the second one's link cut."""
    import tempfile

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    import netns
    import sshd

    hosts = netns.create(2)
    servers = []
    try:
        directory = Path(tempfile.mkdtemp(prefix="macfleet-cut-"))
        port = sshd.free_port()
        servers = [sshd.start_sshd(directory, [h.addr], port=port, prefix=h.exec_prefix()) for h in hosts]
        proc = subprocess.Popen([sys.executable, "-m", "macfleet.launcher.cli", "launch", "--hosts",
                                 f"{hosts[0].addr}:1,{hosts[1].addr}:2", *servers[0].launch_options(), BEHAVE,
                                 "-1", "hang"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                start_new_session=True)
        ready = 0
        while ready < 3:
            line = proc.stdout.readline()
            if not line:
                break
            ready += " ready pid=" in line
        t0 = time.monotonic()
        netns.set_link(hosts[1], up=False)
        return down_after(proc, t0)
    finally:
        for server in servers:
            server.stop()
        netns.destroy(2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", default=None)
    parser.add_argument("--host-cut", action="store_true", help="also cut a namespace host's link (root, ip, sshd)")
    args = parser.parse_args()
    results = {}
    for fault in ("kill -9 a rank", "SIGSTOP a rank", "kill -9 the agent", "SIGTERM the launcher"):
        proc, pids = start()
        t0 = time.monotonic()
        if fault == "kill -9 a rank":
            os.kill(pids[1], signal.SIGKILL)
        elif fault == "SIGSTOP a rank":
            os.kill(pids[1], signal.SIGSTOP)
        elif fault == "kill -9 the agent":
            agent = subprocess.run(["pgrep", "-f", "macfleet.workers.agent"], capture_output=True, text=True)
            os.kill(int(agent.stdout.split()[0]), signal.SIGKILL)
        else:
            os.kill(proc.pid, signal.SIGTERM)
        results[fault] = down_after(proc, t0)
    if args.host_cut:
        results["a host cut off (netns link down)"] = host_cut()
    # a rank raising: the fault happens inside the job, right after every rank is ready
    t0 = time.monotonic()
    proc, _ = start("raise", "1")
    ready = time.monotonic()
    results["a rank raises (from all ready)"] = down_after(proc, ready)
    print(f"{'fault':<34} {'fully down after':>16}")
    for fault, seconds in results.items():
        print(f"{fault:<34} {seconds:>14.2f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
