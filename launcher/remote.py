"""Reaching other hosts: the ssh command line, and which addresses to use.

The system ``ssh`` is used, so the user's ~/.ssh/config, keys and agent apply. It always runs
with BatchMode (never a password prompt that would hang a job) and a connect timeout.
Everything that crosses ssh is shell-quoted; the job secret goes over stdin, never argv.
"""

from __future__ import annotations

import ipaddress
import shlex
import socket
import subprocess
from dataclasses import dataclass, field, replace

from macfleet import netaddr
from macfleet.launcher.hosts import Host


@dataclass
class SshOptions:
    port: int | None = None
    identity: str | None = None
    options: list[str] = field(default_factory=list)  # extra `-o Key=Value`
    connect_timeout_s: int = 10

    def base(self) -> list[str]:
        cmd = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={self.connect_timeout_s}",
               # a silent network is noticed by ssh itself too, not only by our heartbeats
               "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3", "-o", "LogLevel=ERROR"]
        if self.port:
            cmd += ["-p", str(self.port)]
        if self.identity:
            cmd += ["-i", self.identity]
        for option in self.options:
            cmd += ["-o", option]
        return cmd


def find_this_machine(hosts: list[Host], ssh: SshOptions) -> list[Host]:
    """``hosts``, with the ones that name this machine marked to start here."""
    return [replace(h, here=True) if is_this_machine(h, ssh) else h for h in hosts]


def ssh_command(host: Host, ssh: SshOptions, cwd: str, command: list[str]) -> list[str]:
    """``ssh ... host 'cd CWD && exec COMMAND'`` with every word quoted for the remote shell,
    but for a leading ``~/`` of the directory and of the program: that host's home."""
    program, *args = command
    remote = f"cd {home_quote(cwd)} && exec {' '.join([home_quote(program), *map(shlex.quote, args)])}"
    return [*ssh.base(), host.ssh_target, remote]


def home_quote(path: str) -> str:
    """``path`` quoted for a shell, its leading ``~`` or ``~/`` left for the shell to expand:
    Macs whose users have different names keep a project at the same place in each home."""
    if path == "~":
        return path
    if path.startswith("~/"):
        return "~/" + shlex.quote(path[2:])
    return shlex.quote(path)


def is_this_machine(host: Host, ssh: SshOptions) -> bool:
    """Whether ``host`` names the machine we run on, as a hostfile that lists every Mac of a
    cluster does for the launching one: its agent then starts here, not over ssh to ourselves,
    which would need Remote Login switched on and our own key authorized on this Mac.
    Loopback addresses are left to ssh (127.0.0.2 stands for another Mac in the tests)."""
    if host.is_local or host.user is not None:
        return False
    ip = resolve(host, ssh)
    if ip is None or ipaddress.ip_address(ip.partition("%")[0]).is_loopback:
        return False
    return netaddr.interface_of(ip) is not None


def resolve(host: Host, ssh: SshOptions) -> str | None:
    """The IP address ssh would connect to for ``host`` (following ~/.ssh/config), or None."""
    name = host.name
    try:
        out = subprocess.run([*ssh.base(), "-G", host.ssh_target], capture_output=True, text=True, timeout=10)
        for line in out.stdout.splitlines():
            key, _, value = line.partition(" ")
            if key == "hostname" and value:
                name = value.strip()
                break
    except (OSError, subprocess.TimeoutExpired):
        pass
    try:
        found = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except OSError:
        return None
    # IPv4 first where a name has both: a Mac's name.local often resolves to an IPv6 link-local
    # address first, whose scope (%en0) names an interface of this Mac, not of the others.
    ipv4 = [info for info in found if info[0] == socket.AF_INET]
    return (ipv4 or found)[0][4][0] if found else None
