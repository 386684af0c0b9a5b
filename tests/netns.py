"""Hosts in network namespaces, joined by veth links to a bridge: the closest thing to separate
Macs on one machine. Needs root and `ip`; every name and address is ours and removed after.

    root namespace: bridge mfbr0 at 10.77.0.1/24 and fd77::1/64
    namespace mfh1: 10.77.0.2 and fd77::2 (veth mfv1 <-> mfv1p on the bridge)
    namespace mfh2: 10.77.0.3 and fd77::3 ...

(The IPv6 addresses only where the kernel has IPv6: ``NetnsHost.addr6`` is None elsewhere.)
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

BRIDGE = "mfbr0"
SUBNET = "10.77.0"
SUBNET6 = "fd77:"  # a unique local prefix: fd77::1 the bridge, fd77::2 the first host...


@dataclass
class NetnsHost:
    name: str
    addr: str
    veth: str  # its end of the link, inside the namespace
    addr6: str | None = None

    def exec_prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.name]


def available() -> bool:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return False
    probe = subprocess.run(["ip", "netns", "add", "mfprobe"], capture_output=True)
    subprocess.run(["ip", "netns", "del", "mfprobe"], capture_output=True)
    return probe.returncode == 0


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def create(count: int) -> list[NetnsHost]:
    destroy(count)
    _ip("link", "add", BRIDGE, "type", "bridge")
    _ip("addr", "add", f"{SUBNET}.1/24", "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")
    # nodad: usable at once, not after duplicate address detection
    ipv6 = subprocess.run(["ip", "-6", "addr", "add", f"{SUBNET6}:1/64", "dev", BRIDGE, "nodad"],
                          capture_output=True).returncode == 0
    return [add(i, ipv6) for i in range(1, count + 1)]


def add(i: int, ipv6: bool) -> NetnsHost:
    """Host ``i`` (namespace mfh{i}, 10.77.0.{i + 1}) on the bridge ``create`` made."""
    remove(i)
    host = NetnsHost(f"mfh{i}", f"{SUBNET}.{i + 1}", f"mfv{i}")
    _ip("netns", "add", host.name)
    _ip("link", "add", host.veth, "type", "veth", "peer", "name", f"{host.veth}p")
    _ip("link", "set", f"{host.veth}p", "master", BRIDGE)
    _ip("link", "set", f"{host.veth}p", "up")
    _ip("link", "set", host.veth, "netns", host.name)
    _ip("netns", "exec", host.name, "ip", "addr", "add", f"{host.addr}/24", "dev", host.veth)
    _ip("netns", "exec", host.name, "ip", "link", "set", host.veth, "up")
    _ip("netns", "exec", host.name, "ip", "link", "set", "lo", "up")
    # A host made again (after remove) has a new link-layer address: what this namespace still
    # knows of the old one sends its packets nowhere for seconds (ssh to it timed out).
    subprocess.run(["ip", "neigh", "flush", "to", host.addr], capture_output=True)
    if ipv6:
        host.addr6 = f"{SUBNET6}:{i + 1}"
        # kept while set_link cuts the link: the kernel drops IPv6 addresses of a link that goes down
        _ip("netns", "exec", host.name, "sysctl", "-w", f"net.ipv6.conf.{host.veth}.keep_addr_on_down=1")
        _ip("netns", "exec", host.name, "ip", "-6", "addr", "add", f"{host.addr6}/64", "dev", host.veth, "nodad")
        subprocess.run(["ip", "-6", "neigh", "flush", "to", host.addr6], capture_output=True)
    return host


def remove(i: int) -> None:
    """Host ``i``'s namespace and its links, bridge and cables alike."""
    subprocess.run(["ip", "netns", "del", f"mfh{i}"], capture_output=True)
    subprocess.run(["ip", "link", "del", f"mfv{i}p"], capture_output=True)


@dataclass
class Cable:
    """A direct link between two hosts, as a Thunderbolt cable between two Macs, with a /30
    subnet of its own (as MLX's setup gives each cable): ``a``'s end holds ``a_addr``."""

    a: NetnsHost
    b: NetnsHost
    a_dev: str
    b_dev: str
    a_addr: str
    b_addr: str


def cable(a: NetnsHost, b: NetnsHost, k: int) -> Cable:
    """Cable ``k`` (veths mfc{k}a and mfc{k}b, subnet 10.78.{k}.0/30) between ``a`` and ``b``.
    Nothing routes between cables: a host reaches only the subnets of its own cables."""
    c = Cable(a, b, f"mfc{k}a", f"mfc{k}b", f"10.78.{k}.1", f"10.78.{k}.2")
    _ip("link", "add", c.a_dev, "netns", a.name, "type", "veth", "peer", "name", c.b_dev, "netns", b.name)
    for host, dev, addr in ((a, c.a_dev, c.a_addr), (b, c.b_dev, c.b_addr)):
        _ip("netns", "exec", host.name, "ip", "addr", "add", f"{addr}/30", "dev", dev)
        _ip("netns", "exec", host.name, "ip", "link", "set", dev, "up")
    return c


def uncable(c: Cable) -> None:
    subprocess.run([*c.a.exec_prefix(), "ip", "link", "del", c.a_dev], capture_output=True)  # and its other end


def tx_bytes(host: NetnsHost, dev: str) -> int:
    """What ``host`` has sent on its interface ``dev`` so far."""
    return int(subprocess.run([*host.exec_prefix(), "cat", f"/sys/class/net/{dev}/statistics/tx_bytes"],
                              capture_output=True, text=True, check=True).stdout)


def set_link(host: NetnsHost, up: bool) -> None:
    """Cut (or restore) a host's only link, as a pulled cable would."""
    _ip("netns", "exec", host.name, "ip", "link", "set", host.veth, "up" if up else "down")


# tbf needs a bucket that holds a few packets at the rate, or the link runs slower than its rate
BURST = {"1gbit": "256kb", "10gbit": "4mb"}


def set_rate(host: NetnsHost, rate: str | None) -> None:
    """Shape both directions of a host's link to ``rate`` (tc's units: 100mbit, 10gbit), as a
    slower cable or Wi-Fi would; ``None`` takes the shaping off again."""
    for prefix, dev in ((host.exec_prefix(), host.veth), ([], f"{host.veth}p")):  # its egress, the bridge's towards it
        _shape(prefix, dev, rate)


def set_cable_rate(c: Cable, rate: str | None) -> None:
    """``set_rate`` for a cable: both of its directions."""
    for host, dev in ((c.a, c.a_dev), (c.b, c.b_dev)):
        _shape(host.exec_prefix(), dev, rate)


def _shape(prefix: list[str], dev: str, rate: str | None) -> None:
    if rate is None:
        subprocess.run([*prefix, "tc", "qdisc", "del", "dev", dev, "root"], capture_output=True)
    else:
        subprocess.run([*prefix, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
                        "burst", BURST.get(rate, "1mb"), "latency", "100ms"], check=True, capture_output=True)


def destroy(count: int) -> None:
    for i in range(1, count + 1):
        remove(i)
    subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True)


# While ``firewall(host, "incoming")`` holds, the ports the host's programs get when they bind
# to any port (macfleet's data ports): 40960-41983, one u32 value/mask pair for tc.
ANY_PORT_RANGE = "40960 41983"
ANY_PORTS = range(40960, 41984)  # a fixed port (the hosts' sshd) must lie outside
ANY_PORT_MATCH = ["match", "ip", "dport", "0xa000", "0xfc00"]


@contextmanager
def firewall(host: NetnsHost, block: str) -> Iterator[None]:
    """Drop new TCP connections, as a Mac's firewall does for a program nobody allowed to accept
    them: ``"incoming"``, those to the ports the host binds on request (ssh on its fixed port
    still answers); ``"launcher"``, those from the host to the bridge's address, where the
    launcher listens. Only connection requests (SYN without ACK) are dropped."""
    if block == "incoming":
        saved = subprocess.run([*host.exec_prefix(), "sysctl", "-n", "net.ipv4.ip_local_port_range"],
                               capture_output=True, text=True, check=True).stdout.split()
        _ip("netns", "exec", host.name, "sysctl", "-w", f"net.ipv4.ip_local_port_range={ANY_PORT_RANGE}")
        try:
            with _dropping([], f"{host.veth}p", ANY_PORT_MATCH + SYN_ONLY):  # the bridge's end: what reaches the host
                yield
        finally:
            _ip("netns", "exec", host.name, "sysctl", "-w", f"net.ipv4.ip_local_port_range={' '.join(saved)}")
    else:
        with _dropping(host.exec_prefix(), host.veth, ["match", "ip", "dst", f"{SUBNET}.1/32", *SYN_ONLY]):
            yield


SYN_ONLY = ["match", "u8", "0x02", "0x12", "at", "33"]  # TCP flags of a header after 20 bytes of IP


@contextmanager
def _dropping(prefix: list[str], dev: str, match: list[str]) -> Iterator[None]:
    """Drop the packets ``dev`` sends that ``match`` (tc u32 terms). tc's drop action and netem
    are not in every kernel: they go to an HTB class whose queue holds none."""
    try:
        for command in (["qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "20"],
                        ["class", "add", "dev", dev, "parent", "1:", "classid", "1:10", "htb", "rate", "1gbit"],
                        ["class", "add", "dev", dev, "parent", "1:", "classid", "1:20", "htb", "rate", "10gbit"],
                        ["qdisc", "add", "dev", dev, "parent", "1:10", "pfifo", "limit", "0"],
                        ["filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1", "u32", *match,
                         "flowid", "1:10"]):
            subprocess.run([*prefix, "tc", *command], check=True, capture_output=True)
        yield
    finally:
        subprocess.run([*prefix, "tc", "qdisc", "del", "dev", dev, "root"], capture_output=True)
