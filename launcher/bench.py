"""``macfleet bench allreduce``: macfleet's all-reduce against torch.distributed gloo, side by side.

Runs a job (``macfleet.workers.benchallreduce``) whose ranks time both libraries on the same
processes and tensors, each result checked against the exact sum, and prints one table:
size, time, algorithm and bus bandwidth (2(N-1)/N x bytes / time) of each, and the ratio.
"""

from __future__ import annotations

import json
from typing import Any

from macfleet.launcher.launch import LaunchConfig, log, run_job


def run_bench(cfg: LaunchConfig, json_path: str | None) -> int:
    outcome = run_job(cfg)
    result = outcome.coordinator.reports.get(0)
    if outcome.code != 0 or not result:
        return outcome.code or 1
    code = 0
    if json_path:  # first: an output with no room for the table (run's one line) loses nothing else
        try:
            with open(json_path, "w") as f:
                json.dump(result, f, indent=2)
        except OSError as exc:  # the disk filled while we measured, say: the table below stands
            log(f"cannot write {json_path}: {exc.strerror or exc}")
            code = 1
    print(format_table(result))
    return code


def human(nbytes: int) -> str:
    for unit, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= size:
            return f"{nbytes / size:g}{unit}"
    return f"{nbytes}B"


def format_table(result: dict[str, Any]) -> str:
    rows = result["rows"]
    by_size: dict[int, dict[str, dict]] = {}
    for row in rows:
        by_size.setdefault(row["bytes"], {})[row["library"]] = row
    header = (f"all-reduce, {result['world']} ranks, {result['dtype']} "
              f"(streams {result.get('streams')}, shared memory {'on' if result.get('shm') != '0' else 'off'}"
              f"{', slots of ' + human(result['slot_bytes']) if result.get('slot_bytes') else ''}"
              f"{', tensors in shared memory' if result.get('shared_tensors') else ''})")
    gloo = any(row["library"] == "gloo" for row in rows)
    lines = [header, f"{'size':>6} | {'macfleet':>10} {'algorithm':<24} {'busbw GB/s':>10}"
                     + (f" | {'gloo':>10} {'busbw GB/s':>10} | {'speed-up':>8}" if gloo else "")]
    for nbytes, libs in sorted(by_size.items()):
        mf, gl = libs.get("macfleet"), libs.get("gloo")
        line = f"{human(nbytes):>6} | {mf['seconds'] * 1e3:>8.3f}ms {mf['algorithm']:<24} {mf['busbw_gbs']:>10.3f}"
        if gl:
            line += f" | {gl['seconds'] * 1e3:>8.3f}ms {gl['busbw_gbs']:>10.3f} | {gl['seconds'] / mf['seconds']:>7.2f}x"
        lines.append(line)
    return "\n".join(lines)
