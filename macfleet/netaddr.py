"""Which local address to use: shared by the launcher and the agents."""

from __future__ import annotations

import re
import socket
import subprocess


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
    raise ValueError(f"network interface {iface!r} has no IPv4 address on {socket.gethostname()}")


def interface_of(addr: str) -> str | None:
    """The name of the network interface that holds ``addr``, or None if none is found."""
    for command in (["ip", "-o", "addr", "show"], ["ifconfig"]):
        try:
            out = subprocess.run(command, capture_output=True, text=True, timeout=5).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        current = None
        for line in out.splitlines():
            if command[0] == "ip":  # "2: eth0    inet 10.0.0.2/24 ..."
                fields = line.split()
                if len(fields) > 3 and fields[3].split("/")[0] == addr:
                    return fields[1].split("@")[0]
            else:  # ifconfig: "en0: flags=..." then indented "inet 10.0.0.2 netmask ..."
                if line and not line[0].isspace():
                    current = line.split(":")[0]
                elif current and re.search(rf"\binet6? {re.escape(addr)}\b", line):
                    return current
    return None
