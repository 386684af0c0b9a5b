"""Ranks (or hosts) grouped by what each holds, and named in a line: which ranks share a value,
which are the odd ones out, and "ranks 0-2, 5" for the launcher's messages and tables."""

from __future__ import annotations

from typing import Hashable, TypeVar

K = TypeVar("K")
V = TypeVar("V", bound=Hashable)


def ordinal(n: int) -> str:
    """2 -> '2nd', 11 -> '11th'."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def ranks_text(ranks: list[int]) -> str:
    """'rank 2', 'ranks 0-1'."""
    return f"rank{'s' if len(ranks) > 1 else ''} {spans(ranks)}"


def grouped(values: dict[K, V]) -> dict[V, list[K]]:
    """The keys that hold each value, each group in the order of its first key."""
    by_value: dict[V, list[K]] = {}
    for key, value in values.items():
        by_value.setdefault(value, []).append(key)
    return by_value


def spans(ranks: list[int]) -> str:
    """Sorted ranks in runs: [0, 1, 2, 5] -> '0-2, 5'."""
    runs: list[list[int]] = []
    for r in ranks:
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def odd_ones(values: dict[K, V]) -> list[K]:
    """The keys whose value is not the one most keys share, or every key where no one value
    leads; none where all agree (the launcher's tables of hosts that differ mark these)."""
    groups = grouped(values)
    if len(groups) < 2:
        return []
    ranked = sorted(groups.values(), key=len, reverse=True)
    leads = len(ranked[0]) > len(ranked[1])
    return [key for group in (ranked[1:] if leads else ranked) for key in group]
