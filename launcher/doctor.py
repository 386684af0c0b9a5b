"""``macfleet doctor``: check every host and ring link before a real job, and say what is wrong.

First every remote host is tried over ssh, in parallel. If all answer, a probe job runs with
one rank per host (``macfleet.workers.linkprobe``): the agents report versions and addresses,
the ranks report devices and measure the link to their ring neighbour. One table comes out,
with problems marked and a suggestion for each.
"""

from __future__ import annotations

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor

from macfleet.commands import WITHOUT_CWD
from macfleet.launcher import cabling
from macfleet.launcher.hosts import Host
from macfleet.launcher.launch import LaunchConfig, run_job
from macfleet.launcher.remote import ssh_command
from macfleet.launcher.report import VERSION_KEYS
from macfleet.netaddr import CABLE_ADVICE, local_network_advice, over_wifi

SLOW_GBIT_S = 2.0      # below this a link is probably Wi-Fi or a congested LAN
HIGH_LATENCY_US = 1000.0


# Whether the modules are there, without importing them: importing torch takes a second or two
# per host, and the probe job right after imports it anyway (a broken torch fails there, named
# in the job's report). Exits 3 with the missing names on stderr. The working directory is left
# off the path, as the job leaves it: a checkout's macfleet/ is not an install.
FIND_MODULES = (f"{WITHOUT_CWD}; import importlib.util; "
                "missing = [m for m in sys.argv[1:] if importlib.util.find_spec(m) is None]; "
                "sys.stderr.write(' '.join(missing)); sys.exit(3 if missing else 0)")


def check_host(host: Host, cfg: LaunchConfig) -> str | None:
    """None if ``host`` runs our Python with macfleet and torch (over ssh, unless it is this
    machine: a --python without them is named in the table too), else what is wrong."""
    python = cfg.python_on(host)
    command = [python, "-c", FIND_MODULES, "macfleet", "torch"]
    if not host.is_local:
        command = ssh_command(host, cfg.ssh, cfg.cwd, command)
    try:
        out = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                             timeout=cfg.ssh.connect_timeout_s + 60,  # from --cwd, as the job runs it
                             cwd=None if not host.is_local else os.path.expanduser(cfg.cwd))
    except subprocess.TimeoutExpired:
        return "unreachable: ssh did not answer"
    except OSError as exc:  # no ssh on this machine, say
        return f"cannot run {command[0]}: {exc.strerror}"
    if out.returncode == 0:
        return None
    if out.returncode == 3:
        return f"{python} there has no {' and no '.join(out.stderr.split())}"
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    said = lines[-1] if lines else f"exited with code {out.returncode}"
    return f"unreachable: {said}" if out.returncode == 255 else said  # 255: ssh's own failure, else the command's


def run_doctor(cfg: LaunchConfig) -> int:
    with ThreadPoolExecutor(len(cfg.hosts)) as pool:
        reach = list(pool.map(lambda h: check_host(h, cfg), cfg.hosts))
    if any(reach):
        rows = [[h.ssh_target, err or "ok"] for h, err in zip(cfg.hosts, reach, strict=True)]
        print(_table(["host", "ssh"], rows))
        print("\nfix: make `ssh HOST` work without a password (ssh-copy-id HOST), and install the same Python "
              "environment with macfleet and torch on every host (--python names its interpreter; python=PATH on a "
              "hostfile line, a host's own).")
        advice = next((a for a in map(local_network_advice, filter(None, reach)) if a), "")
        if advice:  # "No route to host" on macOS 15+: the terminal's permission, not the network
            print(f"     {advice[0].upper()}{advice[1:]}.")
        return 1
    outcome = run_job(cfg)
    coord = outcome.coordinator
    facts = [dict(coord.hellos.get(i, {}).get("facts", {})) for i in range(len(cfg.hosts))]
    majority = {k: max((str(f.get(k)) for f in facts), key=lambda v: sum(str(f.get(k)) == v for f in facts))
                for k in VERSION_KEYS}
    rows, advice = [], []
    wrong = cabling.hellos_out_of_order(coord.hellos, len(cfg.hosts))
    uncabled = dict(wrong.gaps) if wrong else {}  # host -> the next in the list, which it has no cable to
    if wrong:
        advice.append(f"list the hosts in cabling order: {', '.join(cfg.hosts[i].name for i in wrong.order)}"
                      if wrong.order else "the cables join no ring through every host: each needs one to the next")
    for i, host in enumerate(cfg.hosts):
        probe = coord.reports.get(i, {})
        problems = [f"{k} differs" for k in VERSION_KEYS if str(facts[i].get(k)) != majority[k]]
        device = "mps" if probe.get("mps") else f"cuda x{probe['cuda']}" if probe.get("cuda") else "cpu only"
        if probe and device == "cpu only":
            problems.append("no GPU")
        link = "-"
        if "gbit_s" in probe:
            link = f"{probe['latency_us']:.0f} us, {probe['gbit_s']:.2f} Gbit/s"
            if probe["gbit_s"] < SLOW_GBIT_S or probe["latency_us"] > HIGH_LATENCY_US:
                problems.append("slow link")
        if i in uncabled:
            problems.append(f"no cable to {cfg.hosts[uncabled[i]].name}")
        elif not probe:
            problems.append("probe failed")
        hello = coord.hellos.get(i, {})
        address = ",".join(hello.get("data_addrs") or [hello.get("data_addr", "?")])
        address += f" on {hello['link']}" if hello.get("link") else ""
        if len(cfg.hosts) > 1 and over_wifi(hello.get("link")):
            problems.append("Wi-Fi")
        memory = facts[i].get("memory_gb")
        rows.append([host.ssh_target, "ok", str(facts[i].get("python")), str(facts[i].get("torch")),
                     str(facts[i].get("macfleet")), device, f"{memory:g} GiB" if memory else "?", address,
                     f"-> {cfg.hosts[(i + 1) % len(cfg.hosts)].name}: {link}" if len(cfg.hosts) > 1 else "-",
                     "!! " + ", ".join(problems) if problems else "ok"])
        if any("differs" in p for p in problems):
            advice.append(f"{host.name}: install the same torch and macfleet versions as the other hosts")
        if "slow link" in problems or "Wi-Fi" in problems:
            looks = "is Wi-Fi" if "Wi-Fi" in problems else "looks like Wi-Fi or a busy LAN"
            advice.append(f"{host.name}: its link {looks}; {CABLE_ADVICE}")
        if "no GPU" in problems:
            advice.append(f"{host.name}: torch sees no MPS/CUDA device; this host would train on its CPU")
    advice += memory_advice(cfg.hosts, [f.get("memory_gb") for f in facts])
    print(_table(["host", "ssh", "python", "torch", "macfleet", "device", "memory", "data address", "ring link",
                  "status"], rows))
    for line in advice:
        print("suggestion: " + line)
    failed = outcome.code != 0 or any(r[-1] != "ok" and ("differs" in r[-1] or "failed" in r[-1]) for r in rows)
    return 1 if failed else 0


def memory_advice(hosts: list[Host], memory_gb: list[float | None]) -> list[str]:
    """A Mac with much less memory a rank than another (an 8 GB MacBook Air beside a 64 GB Mac
    Studio): every rank holds the whole model and its part of the batch, so the job is as big as
    that Mac's ranks can hold. Said where the least is half the most or less."""
    known = [(gb / h.slots, h) for h, gb in zip(hosts, memory_gb, strict=True) if gb]
    if len(known) < 2:
        return []
    (least, small), (most, big) = min(known, key=lambda k: k[0]), max(known, key=lambda k: k[0])
    if least * 2 > most:
        return []
    fewer = f" (fewer ranks on {small.name} give each more)" if small.slots > 1 else ""
    return [f"{small.name}: {least:.1f} GiB of memory a rank, against {most:.1f} on {big.name}: every rank holds the "
            f"whole model and its part of the batch, so what fits {small.name} is what the job can train{fewer}"]


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [header, *rows])
