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
