"""``macfleet cabling``: the Thunderbolt cables between Macs, a subnet for each, and the
hostfile of a ring over them (what ``mlx.distributed_config`` does for MLX's rings).

A Thunderbolt Bridge (``bridge0``) puts every Thunderbolt port of a Mac on one interface, so
a Mac in the middle of a chain passes its neighbours' traffic on. A ring trains faster with
each cable a link of its own: each Mac sends half its data over each of its two cables at
once. Each Mac says which of its ports leads to which port of another Mac, and which network
interface each port is:

- ``system_profiler SPThunderboltDataType -json``: an entry per Thunderbolt bus, with its own
  ``domain_uuid_key``, its receptacle (``receptacle_1_tag.receptacle_id_key``: "1" is the
  port macOS calls "Thunderbolt 1"), and under ``_items`` what is plugged in there; another
  Mac shows as an item with the ``domain_uuid_key`` of its own bus at the other end.
- ``networksetup -listallhardwareports``: "Hardware Port: Thunderbolt 1" then "Device: en2".

A cable joins two ports whose entries name each other (either naming is enough). Each gets
a /30 of the ``--subnet`` (one address at each end), and each Mac the commands that set them
up: ``bridge0`` down, an address on each cable's interface. Nothing here runs them: they
need sudo, and last until the Mac restarts.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from macfleet import netaddr
from macfleet.launcher import cabling
from macfleet.launcher.hosts import Host
from macfleet.launcher.remote import SshOptions, ssh_command

DEFAULT_SUBNET = "10.78.0.0/16"  # rarely a home or office LAN's (192.168.0.x and 192.168.1.x are)
SPLIT = "@@macfleet-cabling@@"
# One shell line for each Mac: its Thunderbolt buses, its ports' interfaces, its addresses
PROBE = (f"system_profiler SPThunderboltDataType -json && echo {SPLIT} && networksetup -listallhardwareports "
         f"&& echo {SPLIT} && ifconfig")


@dataclass(frozen=True)
class Port:
    iface: str        # the network interface of the port ("en2")
    uuid: str         # the port's own Thunderbolt domain
    peer: str | None  # the domain at its other end, where a Mac is plugged in


@dataclass(frozen=True)
class Probe:
    ports: list[Port]
    held: list[tuple[str, netaddr.Network]]  # the Mac's interfaces' addresses now


@dataclass(frozen=True)
class Cable:
    a: int                          # the host at one end, by its index in the host list,
    a_iface: str                    # the interface of its port there,
    a_addr: ipaddress.IPv4Interface  # and its address on the cable's /30
    b: int                          # the same at the other end
    b_iface: str
    b_addr: ipaddress.IPv4Interface

    def end(self, host: int) -> tuple[str, ipaddress.IPv4Interface] | None:
        """``host``'s interface and address on this cable, or None if it is not at either end."""
        if host == self.a:
            return self.a_iface, self.a_addr
        if host == self.b:
            return self.b_iface, self.b_addr
        return None


@dataclass(frozen=True)
class Plan:
    cables: list[Cable]
    order: list[int] | None  # the hosts in ring order (host 0 first); None: the cables close no ring


def parse_probe(text: str) -> Probe:
    """A Mac's answer to ``PROBE``. ``ValueError`` naming what is not as macOS writes it."""
    parts = text.split(SPLIT)
    if len(parts) != 3:
        raise ValueError("it did not answer as a Mac does (system_profiler, networksetup and ifconfig)")
    try:
        buses = json.loads(parts[0]).get("SPThunderboltDataType", [])
    except (ValueError, AttributeError):
        raise ValueError("system_profiler's Thunderbolt report is not the JSON it writes") from None
    devices = {port: device for device, port in netaddr.hardware_ports(parts[1]).items()}
    ports = []
    for bus in buses if isinstance(buses, list) else []:
        uuid = bus.get("domain_uuid_key") if isinstance(bus, dict) else None
        tag = (bus.get("receptacle_1_tag") or {}).get("receptacle_id_key") if uuid else None
        iface = devices.get(f"Thunderbolt {tag}")
        if iface is None:  # a bus with no port of its own, or no network interface on it
            continue
        peers = [item["domain_uuid_key"] for item in bus.get("_items") or []
                 if isinstance(item, dict) and item.get("domain_uuid_key")]
        ports.append(Port(iface, str(uuid), str(peers[0]) if peers else None))
    return Probe(sorted(ports, key=lambda p: p.iface), netaddr.ifconfig_addresses(parts[2]))


def plan(ports: list[list[Port]], subnet: ipaddress.IPv4Network) -> Plan:
    """The cables between the hosts' ports, each with a /30 of ``subnet`` in turn, and a ring
    order through them. ``ValueError`` where ``subnet`` has too few /30s."""
    where = {p.uuid: (host, p.iface) for host, own in enumerate(ports) for p in own}
    joined: set[frozenset[tuple[int, str]]] = set()
    for host, own in enumerate(ports):
        for p in own:
            far = where.get(p.peer or "")
            if far is not None and far[0] != host:
                joined.add(frozenset({(host, p.iface), far}))
    pairs = sorted(tuple(sorted(j)) for j in joined)
    blocks = subnet.subnets(new_prefix=30) if subnet.prefixlen <= 30 else iter(())
    cables = []
    for (a, a_iface), (b, b_iface) in pairs:
        block = next(blocks, None)
        if block is None:
            raise ValueError(f"{subnet} has fewer than {len(pairs)} subnets of 4 addresses, one for each cable")
        first, second = list(block.hosts())
        cables.append(Cable(a, a_iface, ipaddress.IPv4Interface(f"{first}/30"),
                            b, b_iface, ipaddress.IPv4Interface(f"{second}/30")))
    ends = {frozenset({c.a, c.b}) for c in cables}
    return Plan(cables, cabling.ring_through([[frozenset({i, j}) in ends for j in range(len(ports))]
                                              for i in range(len(ports))]))


def commands(host: int, cables: list[Cable]) -> list[str]:
    """What makes ``host``'s cables links of their own (run as an administrator, with sudo)."""
    lines = ["sudo ifconfig bridge0 down"]  # else the bridge holds the ports, and their addresses are not used
    for cable in cables:
        mine, theirs = cable.end(host), cable.end(cable.b if host == cable.a else cable.a)
        if mine is None or theirs is None:
            continue
        iface, addr = mine
        lines.append(f"sudo ifconfig {iface} inet {addr.ip} netmask {addr.netmask}")
        lines.append(f"sudo route change {theirs[1].ip} -interface {iface}")  # a route the bridge held goes
    return lines


def hostfile(hosts: list[Host], result: Plan) -> str:
    """macfleet's hostfile for the ring: the hosts in ring order, each with its cable addresses."""
    order = result.order or list(range(len(hosts)))
    lines = ["# macfleet cabling: one address per Thunderbolt cable; hosts in cabling order"]
    for i in order:
        host = hosts[i]
        addrs = [str(end[1].ip) for c in result.cables if (end := c.end(i)) is not None]
        share = f"  share={host.share}" if host.share != 1 else ""
        lines.append(f"{host.ssh_target}  slots={host.slots}" + (f"  addr={','.join(addrs)}" if addrs else "") + share)
    return "\n".join(lines) + "\n"


def probe_host(host: Host, ssh: SshOptions) -> str:
    """``host``'s answer to ``PROBE``, over ssh or here; ``ValueError`` with what went wrong."""
    command = ["/bin/sh", "-c", PROBE]
    if not host.is_local:
        command = ssh_command(host, ssh, "~", command)
    try:
        out = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                             timeout=ssh.connect_timeout_s + 60)
    except subprocess.TimeoutExpired:
        raise ValueError("it did not answer within a minute") from None
    except OSError as exc:  # no ssh on this machine, say
        raise ValueError(f"cannot run {command[0]}: {exc.strerror}") from None
    if out.returncode != 0:
        said = [line for line in out.stderr.splitlines() if line.strip()]
        raise ValueError(said[-1] if said else f"the commands exited with code {out.returncode}")
    return out.stdout


def run_cabling(hosts: list[Host], ssh: SshOptions, subnet: ipaddress.IPv4Network, out_path: str | None) -> int:
    """Probe every host, print the cables, each host's commands and the hostfile (or write it
    to ``out_path``); 1 where a host cannot be read (each is named) or ``report`` fails."""
    def read(host: Host) -> Probe | str:
        try:
            return parse_probe(probe_host(host, ssh))
        except ValueError as exc:
            return f"{host.name}: {exc}"

    with ThreadPoolExecutor(len(hosts)) as pool:
        probes = list(pool.map(read, hosts))
    failed = [p for p in probes if isinstance(p, str)]
    for line in failed:
        print(f"cannot read the Thunderbolt ports of {line}", file=sys.stderr)
    return 1 if failed else report(hosts, [p for p in probes if isinstance(p, Probe)], subnet, out_path)


def report(hosts: list[Host], found: list[Probe], subnet: ipaddress.IPv4Network, out_path: str | None) -> int:
    """What ``run_cabling`` prints and writes from every host's answer; 1 where the cables
    close no ring, or ``subnet`` is taken."""
    taken = [(hosts[i].name, iface, net) for i, p in enumerate(found) for iface, net in p.held
             if isinstance(net, ipaddress.IPv4Interface) and net.ip in subnet
             and not any(iface == port.iface for port in p.ports)]
    if taken:
        name, iface, net = taken[0]
        print(f"{name} already uses {net} on {iface}, inside {subnet}: give another range with --subnet",
              file=sys.stderr)
        return 1
    try:
        result = plan([p.ports for p in found], subnet)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 1
    names = [h.name for h in hosts]
    if not result.cables:
        print("no Thunderbolt cable joins any two of these Macs (system_profiler shows none)", file=sys.stderr)
        return 1
    print("cables:")
    for c in result.cables:
        print(f"  {names[c.a]} {c.a_iface} {c.a_addr}  <->  {names[c.b]} {c.b_iface} {c.b_addr}")
    if result.order is None:
        alone = [names[i] for i in range(len(hosts)) if not any(i in (c.a, c.b) for c in result.cables)]
        print("these cables close no ring through every Mac" +
              (f": {', '.join(alone)} {'has' if len(alone) == 1 else 'have'} no cable to any of the others" if alone else
               ": each Mac needs a cable to the next, and the last to the first"), file=sys.stderr)
        return 1
    for i, host in enumerate(hosts):
        print(f"\non {host.name}:")
        for line in commands(i, result.cables):
            print(f"  {line}")
    text = hostfile(hosts, result)
    written = False
    if out_path:
        try:
            with open(out_path, "w") as f:
                f.write(text)
            written = True
        except OSError as exc:  # a disk that filled while the Macs were asked, say: the hostfile is printed instead
            print(f"cannot write {out_path}: {exc.strerror or exc}", file=sys.stderr)
    if written:
        print(f"\nhostfile written to {out_path}: macfleet launch --hostfile {out_path} train.py")
    else:
        print(f"\nhostfile (macfleet launch --hostfile FILE train.py):\n{text}", end="")
    print("\nThe addresses last until a Mac restarts; run the commands again after one.")
    return 0 if written or not out_path else 1
