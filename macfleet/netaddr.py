"""Which local address to use: shared by the launcher and the agents."""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import struct
import subprocess
import sys
from collections.abc import Mapping

import zmq

Network = ipaddress.IPv4Interface | ipaddress.IPv6Interface  # an address with its subnet: 10.0.0.2/24

SIOCGIFADDR = 0x8915  # Linux's ioctl for an interface's (primary) IPv4 address
WIFI = "Wi-Fi"  # what link_of calls a wireless link, as System Settings does
PROBE_TIMEOUT_S = 3.0
# macOS asks whether an unsigned program such as Python may accept incoming connections; on a
# Mac nobody sits at (reached over ssh) nobody answers, and the connections are dropped.
FIREWALL_ADVICE = ("A firewall on that Mac may block incoming connections: allow them for Python (macOS: System "
                   "Settings > Network > Firewall > Options) or turn it off")
CABLE_ADVICE = ("connect the Macs with Thunderbolt or Ethernet and train over that address (addr= in a hostfile, "
                "or --data-iface bridge0; README: Several Macs)")


def allow_ipv6(sock: zmq.Socket, address: str) -> None:
    """Let ``sock`` bind or connect to ``address`` (or an endpoint) if it is IPv6: libzmq's
    sockets are IPv4-only unless told. Only then, since a socket told so binds an IPv4 address
    as an IPv4-mapped IPv6 one (``::ffff:10.0.0.2``)."""
    if ":" in address.removeprefix("tcp://").rpartition(":")[0]:
        sock.setsockopt(zmq.IPV6, 1)


def bracket(addr: str) -> str:
    """An address as it goes into an endpoint: IPv6 ones in brackets (``tcp://[fd00::2]:5555``)."""
    return f"[{addr}]" if ":" in addr and not addr.startswith("[") else addr


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """(address, port) of a ZeroMQ TCP endpoint such as ``tcp://[fe80::1]:5555``."""
    address, _, port = endpoint.removeprefix("tcp://").rpartition(":")
    return address.strip("[]"), int(port)


def probe(address: str, port: int) -> str:
    """What one plain TCP connection attempt meets, to tell a silent drop from a refusal."""
    try:
        socket.create_connection((address, port), timeout=PROBE_TIMEOUT_S).close()
    except TimeoutError:
        return "connection attempts get no answer"
    except ConnectionRefusedError:
        return "connections are refused"
    except OSError as exc:
        return with_local_network_advice(f"connecting fails ({exc.strerror or exc})")
    return "the port accepts a plain TCP connection, but no ZeroMQ peer answers on it"


NO_ROUTE = "No route to host"
_APPS = {"iTerm.app": "iTerm", "vscode": "your editor (Visual Studio Code, Cursor...)", "WezTerm": "WezTerm",
         "ghostty": "Ghostty", "WarpTerminal": "Warp"}


def local_network_advice(said: str, system: tuple[str, str] | None = None,
                         env: Mapping[str, str] | None = None, root: bool | None = None) -> str:
    """Why a connection meets "No route to host" on macOS 15+, or "" when that cannot be the cause.
    macOS 15 (Darwin 24) blocks a program's local-network connections unless the app it runs
    under (the terminal) has Local Network permission, and the block reads as EHOSTUNREACH, which
    looks like a routing or firewall fault. Root, programs started over ssh and programs started
    from Apple's Terminal are exempt (Apple TN3179). ``system``: (sysname, release), ``env`` and
    ``root`` default to this process's; they are arguments so every case can be tested anywhere."""
    if NO_ROUTE not in said:
        return ""
    sysname, release = system or (os.uname().sysname, os.uname().release)
    env = os.environ if env is None else env
    root = os.geteuid() == 0 if root is None else root
    major = release.split(".")[0]
    if sysname != "Darwin" or not major.isdigit() or int(major) < 24 or root:
        return ""
    if "SSH_CONNECTION" in env or env.get("TERM_PROGRAM") == "Apple_Terminal":
        return ""
    app = _APPS.get(env.get("TERM_PROGRAM", ""), "the app you launched from")
    return (f"on macOS 15 and later this is also how a missing Local Network permission shows: allow {app} "
            "in System Settings > Privacy & Security > Local Network (or answer Allow where macOS asks), "
            "or launch from Terminal, which needs none")


def with_local_network_advice(said: str) -> str:
    """``said``, followed by ``local_network_advice`` where it applies."""
    advice = local_network_advice(said)
    return said + (advice and f"; {advice}")


def route_source(addr: str) -> str:
    """The local address the kernel would send from to reach ``addr`` (no packet is sent)."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((addr, 9))
        return s.getsockname()[0]


def interface_address(iface: str) -> str:
    """The IPv4 address of network interface ``iface`` (``bridge0``, ``en0``, ``eth0``...)."""
    for command in (["ipconfig", "getifaddr", iface], ["ip", "-o", "-4", "addr", "show", "dev", iface]):
        try:
            out = subprocess.run(command, capture_output=True, text=True, timeout=5).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        match = re.search(r"(\d+\.\d+\.\d+\.\d+)", out)
        if match:
            return match.group(1)
    for name, addr in _kernel_addresses():
        if name == iface and ":" not in addr:
            return addr
    raise ValueError(f"network interface {iface!r} has no IPv4 address on {socket.gethostname()}")


def interface_of(addr: str, held: list[tuple[str, Network]] | None = None) -> str | None:
    """The name of the network interface that holds ``addr``, or None if none is found.
    ``held``: ``held_addresses()``, when the caller has it already."""
    for name, net in held_addresses() if held is None else held:
        if _same_address(str(net.ip), addr):
            return name
    for name, held in _kernel_addresses():
        if _same_address(held, addr):
            return name
    return None


def facing(peer: str, networks: list[Network] | None = None) -> str | None:
    """This Mac's address on a subnet that holds ``peer``: its own end of the cable to a Mac
    it is cabled to. None if no interface's subnet holds it, or the address is this Mac's.
    ``networks``: ``local_networks()``, when the caller asks about several peers."""
    try:
        target = _unmapped(ipaddress.ip_address(peer.strip("[]")))
    except ValueError:
        return None
    mine = [net for net in (local_networks() if networks is None else networks) if not net.ip.is_loopback]
    if any(net.ip == target for net in mine):
        return None
    return next((str(net.ip) for net in mine if target in net.network and net.network.prefixlen < net.max_prefixlen),
                None)


def with_subnets(addrs: list[str], networks: list[Network]) -> list[str]:
    """Each of ``addrs`` with its subnet from ``networks`` (``10.78.1.1/30``); alone where none
    holds it."""
    found = {net.ip: net for net in networks}
    return [str(found.get(ipaddress.ip_address(a), ipaddress.ip_interface(a))) for a in addrs]


def local_networks() -> list[Network]:
    """Every address of this machine with its subnet (``10.0.0.2/24``)."""
    return [net for _, net in held_addresses()]


def held_addresses() -> list[tuple[str, Network]]:
    """(interface, address with its subnet) for every address of this machine, from ``ip``
    (Linux) or ``ifconfig`` (macOS); empty where neither runs or says anything we read."""
    for command in (["ip", "-o", "addr", "show"], ["ifconfig"]):
        try:
            out = subprocess.run(command, capture_output=True, text=True, timeout=5).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        found = _ip_addresses(out) if command[0] == "ip" else ifconfig_addresses(out)
        if found:  # else on: an `ip` that is not iproute2's (iproute2mac on a Mac) may print another format
            return found
    return []


def _ip_addresses(text: str) -> list[tuple[str, Network]]:
    """From ``ip -o addr show``: "2: eth0    inet 10.0.0.2/24 brd ..." per address."""
    found = []
    for fields in (line.split() for line in text.splitlines()):
        if len(fields) > 3 and fields[2] in ("inet", "inet6"):
            try:
                found.append((fields[1].split("@")[0], ipaddress.ip_interface(fields[3])))
            except ValueError:
                continue
    return found


def ifconfig_addresses(text: str) -> list[tuple[str, Network]]:
    """From macOS's ``ifconfig``: "en0: flags=..." then indented "inet 192.168.0.1 netmask
    0xfffffffc broadcast ..." and "inet6 fe80::1%en0 prefixlen 64 ..." lines."""
    found: list[tuple[str, Network]] = []
    iface = None
    for line in text.splitlines():
        fields = line.split()
        if line and not line[0].isspace():
            iface = line.split(":")[0]
        try:
            if iface and len(fields) > 3 and fields[0] == "inet" and fields[2] == "netmask":
                mask = ipaddress.IPv4Address(int(fields[3], 16))  # 0xfffffffc
                found.append((iface, ipaddress.IPv4Interface(f"{fields[1]}/{mask}")))
            elif iface and len(fields) > 3 and fields[0] == "inet6" and fields[2] == "prefixlen":
                found.append((iface, ipaddress.IPv6Interface(f"{fields[1].split('%')[0]}/{fields[3]}")))
        except ValueError:
            continue
    return found


def link_of(addr: str, held: list[tuple[str, Network]] | None = None) -> str | None:
    """The interface that holds ``addr``, with what kind of link it is where the system says:
    ``en0 (Wi-Fi)``, ``bridge0 (Thunderbolt Bridge)``, ``eth0``. None if no interface holds it."""
    iface = interface_of(addr, held)
    if iface is None:
        return None
    kind = _link_kind(iface)
    return f"{iface} ({kind})" if kind else iface


def links_of(addrs: list[str], held: list[tuple[str, Network]] | None = None) -> str | None:
    """``link_of`` each address, joined with commas; None if no interface holds any of them."""
    held = held_addresses() if held is None else held
    links = [link_of(addr, held) for addr in addrs]
    return ",".join(link or "?" for link in links) if any(links) else None


def over_wifi(link: str | None) -> bool:
    """Whether a link from ``link_of`` (or any of ``links_of``'s) is Wi-Fi."""
    return link is not None and f"({WIFI})" in link


def nearest(endpoints: list[str], own: list[str]) -> str | None:
    """Of a peer's ``endpoints`` (one per data address), the one this Mac reaches from one of its
    ``own`` data addresses: with one subnet per Thunderbolt cable, the address on the cable
    between the two. The only one if there is one; None if none is."""
    if len(endpoints) == 1:
        return endpoints[0]
    for endpoint in endpoints:
        try:
            source = route_source(split_endpoint(endpoint)[0])
        except OSError:  # no route at all: a subnet this Mac has no cable to
            continue
        if any(_same_address(source, addr) for addr in own):
            return endpoint
    return None


def _link_kind(iface: str) -> str | None:
    if sys.platform == "darwin":  # the names System Settings > Network shows
        try:
            out = subprocess.run(["networksetup", "-listallhardwareports"], capture_output=True, text=True,
                                 timeout=5).stdout
        except (OSError, subprocess.TimeoutExpired):
            return None
        return hardware_ports(out).get(iface)
    if os.path.exists(f"/sys/class/net/{iface}/wireless"):  # Linux: a Wi-Fi interface has this
        return WIFI
    return None


def hardware_ports(text: str) -> dict[str, str]:
    """Device -> hardware port, from macOS's ``networksetup -listallhardwareports``: blocks of
    ``Hardware Port: Wi-Fi`` / ``Device: en0`` / ``Ethernet Address: ...``."""
    ports: dict[str, str] = {}
    port = None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "Hardware Port":
            port = value.strip()
        elif key.strip() == "Device" and port:
            ports[value.strip()] = WIFI if port in ("Wi-Fi", "AirPort") else port  # AirPort: macOS before 10.7
            port = None
    return ports


def _kernel_addresses() -> list[tuple[str, str]]:
    """(interface, address) pairs straight from the Linux kernel, for hosts without iproute2
    (minimal containers): each interface's primary IPv4 address and all its IPv6 ones. Empty
    elsewhere: macOS always has ``ifconfig``."""
    if not sys.platform.startswith("linux"):
        return []
    import fcntl

    pairs = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                ifreq = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # no IPv4 address
            pairs.append((name, socket.inet_ntoa(ifreq[20:24])))
    try:
        with open("/proc/net/if_inet6") as lines:  # "fe80...0001 02 40 20 80 eth0"
            for fields in (line.split() for line in lines):
                pairs.append((fields[-1], str(ipaddress.IPv6Address(bytes.fromhex(fields[0])))))
    except OSError:
        pass
    return pairs


def _same_address(a: str, b: str) -> bool:
    try:
        return _unmapped(ipaddress.ip_address(a.strip("[]"))) == _unmapped(ipaddress.ip_address(b.strip("[]")))
    except ValueError:
        return False


def _unmapped(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """``::ffff:10.0.0.2`` as ``10.0.0.2``: a socket that allows IPv6 sees IPv4 addresses so."""
    mapped = getattr(addr, "ipv4_mapped", None)
    return mapped or addr
