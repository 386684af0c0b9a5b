"""Keep a Mac awake while its ranks train.

macOS puts an idle Mac to sleep (no keyboard or mouse input for the time set in its Energy
settings; a laptop soon after its display sleeps) whatever its processes are doing, and a job
started over ssh leaves a Mac exactly that idle. A sleeping Mac answers nobody, and the job
fails with "sent no heartbeat". ``caffeinate -i -s -w PID`` holds macOS's power assertions
against idle sleep and, on AC power, system sleep until process PID exits, so the assertion
cannot outlive the agent even if the agent is killed. A laptop whose lid is closed still sleeps.
"""

from __future__ import annotations

import os
import subprocess
import sys

CAFFEINATE = "/usr/bin/caffeinate"  # by its path: Linux's caffeine-ng installs another program of that name


def keep_awake(pid: int) -> subprocess.Popen | None:
    """Hold this Mac awake until process ``pid`` exits; None where there is nothing to do (not
    macOS) or nothing to do it with."""
    if sys.platform != "darwin" or not os.access(CAFFEINATE, os.X_OK):
        return None
    try:
        return subprocess.Popen([CAFFEINATE, "-i", "-s", "-w", str(pid)], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        return None


def let_sleep(guard: subprocess.Popen | None) -> None:
    """Give the assertion back now (it would go with the watched process anyway)."""
    if guard is None or guard.poll() is not None:
        return
    guard.terminate()
    try:
        guard.wait(timeout=2)
    except subprocess.TimeoutExpired:
        guard.kill()
        guard.wait()
