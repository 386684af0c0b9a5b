"""Which hosts are cabled to which, for a ring of Macs with a subnet per cable.

There each Mac reaches only the Macs it has a cable to, and the ring sends from each host to
the next in the host list (and back): two hosts listed next to each other with no cable
between them cannot connect. Every agent says its data addresses with their subnets
(``10.78.1.1/30``); two hosts are cabled where a subnet of one holds a data address of the
other. Checked before any rank starts, so a host list out of cabling order is one clear
error, with the order that works, instead of every rank's connect timeout.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass


@dataclass(frozen=True)
class OutOfOrder:
    gaps: list[tuple[int, int]]  # hosts next to each other in the list that no cable joins
    order: list[int] | None      # an order in which every host is cabled to the next (first host first); None: none


def out_of_order(nets: list[list[str]]) -> OutOfOrder | None:
    """What is wrong where the hosts are a ring of cables (a host has more than one data
    address; ``nets``: each host's, with subnets) listed out of cabling order; None where
    nothing is. Hosts with one address each (a bridge, a LAN, routed networks) are not judged:
    routing may join them."""
    if not any(len(n) > 1 for n in nets):
        return None
    missing = gaps(nets)
    return OutOfOrder(missing, ring_order(nets)) if missing else None


def hellos_out_of_order(hellos: dict[int, dict], count: int) -> OutOfOrder | None:
    """``out_of_order`` for the ``count`` hosts whose agents said hello (each names its
    ``data_nets``); a host not heard from counts as one with no address."""
    return out_of_order([list(hellos.get(i, {}).get("data_nets") or []) for i in range(count)])


def cabled(a: list[str], b: list[str]) -> bool:
    """Whether a subnet of one host's data addresses (``a``) holds one of the other's (``b``)."""
    nets = [ipaddress.ip_interface(x).network for x in a]
    return any(ipaddress.ip_interface(y).ip in net for net in nets for y in b)


def gaps(nets: list[list[str]]) -> list[tuple[int, int]]:
    """The pairs of hosts next to each other in the ring that no cable joins."""
    n = len(nets)
    pairs = [(i, (i + 1) % n) for i in range(n if n > 2 else n - 1)]
    return [(i, j) for i, j in pairs if not cabled(nets[i], nets[j])]


def ring_order(nets: list[list[str]]) -> list[int] | None:
    """An order of the hosts, the first one first, in which each is cabled to the next and the
    last to the first; None if the cables close no such ring."""
    n = len(nets)
    return ring_through([[cabled(nets[i], nets[j]) for j in range(n)] for i in range(n)])


def ring_through(joined: list[list[bool]]) -> list[int] | None:
    """An order of the hosts, host 0 first, in which ``joined[a][b]`` holds for each host and
    the next, and the last and the first; None if there is none."""
    n = len(joined)

    def extend(path: list[int]) -> list[int] | None:
        if len(path) == n:
            return path if n < 3 or joined[path[-1]][0] else None
        for j in range(1, n):
            if j not in path and joined[path[-1]][j]:
                found = extend([*path, j])
                if found:
                    return found
        return None

    return extend([0])
