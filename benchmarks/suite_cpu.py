"""Where the test suite's CPU goes, test by test: a pytest plugin and its summary.

The suite is bound by CPU on a 2-core machine, and a test's wall time says little about its
cost: two workers share the cores. This plugin records, for every test, its wall time and the
CPU of every process it ran, including those behind the session's sshd daemons (the ranks of
test_multihost.py's jobs), which no ``RUSAGE_CHILDREN`` sees until the daemon is reaped:

    PYTHONPATH=benchmarks python -m pytest -p suite_cpu            # writes $SUITE_CPU_LOG
    python benchmarks/suite_cpu.py [/tmp/suite_cpu.jsonl]          # per file, then the top tests

A record's CPU is the worker's own, plus its reaped children's (a job's launcher, agents and
ranks, reaped when the job ends), plus what the worker's live children (the sshd daemons) and
their reaped descendants used during the test. The daemons' own end, at the end of the session,
lands on the worker's last test a second time: the summary leaves out any record whose reaped
CPU is over 20 times its wall time.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

LOG = Path(os.environ.get("SUITE_CPU_LOG", "/tmp/suite_cpu.jsonl"))
TICK = os.sysconf("SC_CLK_TCK")


def _live_children() -> dict[int, float]:
    """CPU seconds of each live child of this process, with its reaped descendants' (procfs)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after the command name, which may hold spaces
        if int(fields[1]) == os.getpid():  # ppid
            found[int(entry)] = sum(int(v) for v in fields[11:15]) / TICK  # utime stime cutime cstime
    return found


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    own, reaped, live, started = _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN), _live_children(), \
        time.monotonic()
    yield
    after = _live_children()
    record = {"test": item.nodeid, "wall": time.monotonic() - started,
              "own": _cpu(resource.RUSAGE_SELF) - own, "reaped": _cpu(resource.RUSAGE_CHILDREN) - reaped,
              "live": sum(cpu - live.get(pid, 0.0) for pid, cpu in after.items())}
    with LOG.open("a") as f:  # one line per test, appended whole: both workers write here
        f.write(json.dumps(record) + "\n")


def summary(path: Path) -> None:
    records = [json.loads(line) for line in path.read_text().splitlines()]
    kept = []
    for r in records:
        if r["reaped"] <= 20 * max(r["wall"], 1.0):
            kept.append(r)
        else:
            print(f"left out (a session fixture's end): {r['test']} {r['reaped']:.0f} s in {r['wall']:.1f} s")
    by_file: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for r in kept:
        row = by_file[r["test"].split("::")[0]]
        row[0] += 1
        row[1] += r["own"] + r["reaped"] + r["live"]
        row[2] += r["wall"]
    print(f"\n{'file':36} {'tests':>5} {'CPU s':>8} {'wall s':>8}")
    for name, (count, cpu, wall) in sorted(by_file.items(), key=lambda kv: -kv[1][1]):
        print(f"{name:36} {count:5d} {cpu:8.1f} {wall:8.1f}")
    print(f"{'all':36} {len(kept):5d} {sum(v[1] for v in by_file.values()):8.1f}")
    print(f"\n{'CPU s':>7} {'wall s':>7}  test")
    for r in sorted(kept, key=lambda r: -(r["own"] + r["reaped"] + r["live"]))[:30]:
        print(f"{r['own'] + r['reaped'] + r['live']:7.1f} {r['wall']:7.1f}  {r['test']}")


if __name__ == "__main__":
    summary(Path(sys.argv[1]) if len(sys.argv) > 1 else LOG)
