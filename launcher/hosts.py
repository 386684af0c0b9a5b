"""Host lists: ``--hosts a:2,b:2,user@c`` and hostfiles in the Horovod/DeepSpeed/OpenMPI format.

Hostfile example (``#`` starts a comment, blank lines are ignored, a value with spaces is
quoted as for a shell)::

    # ssh name      slots     data-plane address (optional; e.g. a Thunderbolt bridge IP)
    mini1.local     slots=2   addr=169.254.10.2
    alice@mini2     slots=1   max_slots=1   # OpenMPI's cap: more ranks asked of it is an error
    studio3         slots=1   addr=192.168.1.2,192.168.2.1   # one address per cable, as MLX's rings
    studio4         slots=2   share=3   # each rank's part of every step (macfleet.shares())
    air5            slots=1   python=~/miniconda3/envs/ml/bin/python   # its own Python (else --python)

MLX's JSON hostfiles (``mlx.distributed_config``'s) are read too: see ``mlx_hosts``.

Parsers raise ``ValueError`` with a message naming the bad entry; the CLI turns it into a
one-line usage error.
"""

from __future__ import annotations

import ipaddress
import json
import re
import shlex
from dataclasses import dataclass, replace

LOCAL_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
_NAME = re.compile(r"^(?:(?P<user>[A-Za-z0-9._-]+)@)?(?P<host>[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\])$")


@dataclass(frozen=True)
class Host:
    name: str          # what ssh is given (or "localhost")
    slots: int         # training processes on this host
    user: str | None = None
    # data-plane addresses, when the ssh name is not the one to train over: one, or one per cable
    # where each Thunderbolt cable has a subnet of its own; the first is the host's main one
    addrs: tuple[str, ...] = ()
    share: int = 1  # each of its ranks' part of every step, against other hosts' (macfleet.shares())
    here: bool = False  # the name is this machine's (see remote.is_this_machine)
    python: str | None = None  # its agent's and ranks' Python, where it has one of its own (else --python)

    @property
    def addr(self) -> str | None:
        """The main data address (torch.distributed's store, on host 0, listens there)."""
        return self.addrs[0] if self.addrs else None

    @property
    def is_local(self) -> bool:
        """Started here, without ssh."""
        return (self.here or self.name.lower() in LOCAL_NAMES) and self.user is None

    @property
    def ssh_target(self) -> str:
        return f"{self.user}@{self.name}" if self.user else self.name


def _host(text: str, slots: int, addrs: tuple[str, ...], where: str, share: int = 1, python: str | None = None) -> Host:
    m = _NAME.match(text)
    if not m and "%" in text:  # fe80::1%en0: the interface is one of this Mac's, not the others'
        raise ValueError(f"{where}: {text!r} is a link-local IPv6 address, which names an interface of this Mac "
                         f"only; give the Mac's name or another address (a Thunderbolt bridge's 169.254.x.x)")
    if not m and ":" in text and "[" not in text:
        raise ValueError(_ipv6_unbracketed(where, text, slots_after=False))
    if not m:
        raise ValueError(f"{where}: {text!r} is not a host name (expected [user@]host)")
    if slots < 1:
        raise ValueError(f"{where}: slots must be at least 1, not {slots}")
    return Host(name=m["host"].strip("[]"), slots=slots, user=m["user"], addrs=addrs, share=share, python=python)


def _ipv6_unbracketed(where: str, text: str, slots_after: bool) -> str:
    user, at, address = text.rpartition("@")
    bracketed = f"{user}{at}[{address}]"
    return (f"{where}: {text!r} looks like an IPv6 address: write it in brackets, {bracketed}" +
            (f", with its slots after them ({bracketed}:2)" if slots_after else ""))


def parse_hosts(text: str, default_slots: int = 1) -> list[Host]:
    """``a:2,b:2,user@c`` -> hosts in order; slots default to ``default_slots``."""
    if not text.strip():  # --hosts "$HOSTS" with HOSTS unset
        raise ValueError("--hosts is empty: give hosts as mac1:2,mac2:2, or leave it out to run on this Mac alone")
    hosts = []
    for i, entry in enumerate(p.strip() for p in text.split(",")):
        where = f"--hosts entry {i + 1}"
        if not entry:
            raise ValueError(f"{where} is empty")
        if entry.count(":") > 1 and "[" not in entry:  # ::1 read as host ':' with 1 slot
            raise ValueError(_ipv6_unbracketed(where, entry, slots_after=True))
        name, sep, slots = entry.rpartition(":") if not entry.endswith("]") else ("", "", "")
        if not sep or "]" in slots:
            name, slots = entry, ""
        if sep and not slots:  # a number left out (mac1:$N with N unset): not one slot, silently
            raise ValueError(f"{where}: {entry!r} has no slots after its ':' (give {name}:2, or {name} for one)")
        if slots and not slots.isdigit():
            raise ValueError(f"{where}: slots {slots!r} in {entry!r} is not a whole number")
        hosts.append(_host(name, int(slots) if slots else default_slots, (), where))
    _check_unique(hosts)
    return hosts


def parse_hostfile(path: str, default_slots: int = 1) -> list[Host]:
    """A hostfile in the format above, or in MLX's JSON (``mlx_hosts``)."""
    try:
        with open(path, encoding="utf-8-sig") as f:  # -sig: Notepad's byte-order mark is no host name
            text = f.read()
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path} is not a text file (byte {exc.start} is not UTF-8)") from None
    # MLX's: a list of objects or an object; a line of ours may begin with an IPv6 address's "["
    if re.match(r'\s*(\{|\[\s*[{"\]])', text):
        hosts = mlx_hosts(path, text, default_slots)
    else:
        hosts = [host for number, line in enumerate(text.splitlines(), 1)
                 if (host := _hostfile_line(line, f"{path}:{number}", default_slots))]
    if not hosts:
        raise ValueError(f"{path}: no hosts")
    _check_unique(hosts)
    return hosts


def _hostfile_line(raw: str, where: str, default_slots: int) -> Host | None:
    try:  # words as a shell reads them: python="/Volumes/Data 2/envs/ml/bin/python" is one
        words = shlex.split(raw, comments=True)
    except ValueError as e:  # "No closing quotation"
        raise ValueError(f"{where}: {str(e).lower()} in {raw.strip()!r}") from None
    if not words:
        return None
    name, *options = words
    slots, addrs, cap, share, python = default_slots, (), None, 1, None
    for option in options:
        key, sep, value = option.partition("=")
        if key == "slots" and sep and value.isdigit():
            slots = int(value)
        elif key == "addr" and sep and value:
            addrs = data_addresses(value, f"{where}: addr=")
        elif key == "share" and sep and value.isdigit() and int(value) >= 1:
            share = int(value)
        elif key in ("max_slots", "max-slots") and sep and value.isdigit():
            cap = int(value)  # OpenMPI's cap: a job that asks this host for more is refused
        elif key == "python" and sep and value:
            # Macs set up apart (a conda env on one, a venv on another): each its own interpreter
            python = value
        else:
            raise ValueError(f"{where}: cannot read {option!r} (expected slots=N, share=N, addr=IP[,IP...] or "
                             f"python=PATH)")
    if cap is not None and slots > cap:
        raise ValueError(f"{where}: {slots} ranks asked of {name}, over its max_slots={cap} "
                         f"(give it slots=N of at most {cap}, or a smaller --nproc)")
    return _host(name, slots, addrs, where, share, python)


def mlx_hosts(path: str, text: str, default_slots: int) -> list[Host]:
    """MLX's JSON hostfile (what ``mlx.distributed_config`` writes): a list of
    ``{"ssh": "[user@]host", "ips": [...]}``, or ``{"hosts": [...], "backend": ...}``. One
    rank per entry in MLX, so an entry repeated in a row is one host with more slots
    (``default_slots`` per entry). ``ips`` are its data addresses: in a Thunderbolt ring, the one
    on each cable from a neighbour (each agent adds its own end of the cables to the others,
    ``netaddr.facing``). ``rdma`` and ``backend`` (JACCL, MLX's own) are not ours to use."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{exc.lineno}: not JSON ({exc.msg}), as an MLX hostfile is") from None
    if isinstance(data, dict):
        if data.get("envs"):
            raise ValueError(f"{path}: its \"envs\" are for MLX's launcher; give them to macfleet's with --env K=V")
        data = data.get("hosts")
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a list of hosts, or {{\"hosts\": [...]}}, as MLX's hostfiles are")
    hosts: list[Host] = []
    for i, entry in enumerate(data):
        where = f"{path}: host {i + 1}"
        ips = entry.get("ips", []) if isinstance(entry, dict) else None
        if not isinstance(entry, dict) or not isinstance(entry.get("ssh"), str) or not isinstance(ips, list) \
                or not all(isinstance(ip, str) for ip in ips):
            raise ValueError(f"{where}: expected {{\"ssh\": \"[user@]host\", \"ips\": [\"IP\", ...]}}, not {entry!r}")
        host = _host(entry["ssh"], default_slots, data_addresses(",".join(ips), f"{where}: ") if ips else (), where)
        if hosts and (hosts[-1].ssh_target, hosts[-1].addrs) == (host.ssh_target, host.addrs):
            hosts[-1] = replace(hosts[-1], slots=hosts[-1].slots + default_slots)  # MLX's -n: a rank per entry
        else:
            hosts.append(host)
    return hosts


def data_address(text: str, what: str) -> str:
    """``text`` as a data-plane address: an IPv4 or IPv6 address (brackets allowed). A name
    would leave the choice of address to the resolver, and a link-local IPv6 address's
    %interface names an interface of one Mac only."""
    try:
        addr = ipaddress.ip_address(text.strip("[]"))
    except ValueError:
        raise ValueError(f"{what}{text} is not an IP address (give the address to train over, such as a "
                         f"Thunderbolt bridge's 169.254.x.x; --data-iface picks it by interface)") from None
    if addr.version == 6 and addr.is_link_local:  # fe80::/10: its %interface is this Mac's alone
        raise ValueError(f"{what}{text} is a link-local IPv6 address, which the other Macs reach only through "
                         f"an interface of their own: give an IPv4 address (a Thunderbolt bridge's 169.254.x.x) "
                         f"or a routable IPv6 one")
    return str(addr)


def data_addresses(text: str, what: str) -> tuple[str, ...]:
    """``a,b``: a host's data-plane addresses, each checked as ``data_address`` does. Several
    are for a Mac cabled to more than one other, one subnet per cable: each neighbour then
    connects to the address on the subnet it shares with this Mac."""
    addrs = tuple(data_address(part, what) for part in text.split(","))
    repeated = sorted({a for a in addrs if addrs.count(a) > 1})
    if repeated:
        raise ValueError(f"{what}{text} lists {', '.join(repeated)} more than once")
    return addrs


def _check_unique(hosts: list[Host]) -> None:
    seen: set[tuple[str | None, str]] = set()
    for h in hosts:
        key = (h.user, h.name.lower())  # host names have no case (DNS, a Mac's .local name); user names do
        if key in seen:
            raise ValueError(f"host {h.ssh_target} is listed twice; give it more slots instead")
        seen.add(key)
