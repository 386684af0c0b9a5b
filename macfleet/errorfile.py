"""Write an uncaught exception to ``MACFLEET_ERROR_FILE`` as JSON, for the launcher's report.

The worker bootstrap catches what the training script raises (even an ImportError before
``macfleet.init()``) and records it here. Imports nothing heavy (no torch).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback


def write(path: str, exc: BaseException, text: str | None = None) -> None:
    """Record ``exc``, with ``text`` for its traceback where the rank printed it otherwise than
    Python would (without macfleet's own frames)."""
    record = {
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": text or "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        "time": time.time(),
        "pid": os.getpid(),
        "collectives": "\n".join(_recent_collectives()),
        "executable": sys.executable,
        # this rank's share of its GPU's memory, where it shares the GPU (env.py): for the report
        # of a rank out of GPU memory, whose cap torch's own message does not mention
        "memory_fraction": os.environ.get("MACFLEET_MEMORY_FRACTION"),
    }
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        record["module"] = exc.name  # for the report's hint: a package one host lacks
    tmp = f"{path}.{os.getpid()}.tmp"  # a rank's subprocesses may write it too (macfleet.init refusing them)
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.replace(tmp, path)


def _recent_collectives() -> list[str]:
    """The rank's last collectives, if the script got as far as making any (``macfleet.history``):
    for the report of ranks that disagree on them. Never raises: the exception is what matters."""
    recent = getattr(sys.modules.get("macfleet.runtime"), "recent_collectives", None)
    try:
        return recent() if recent is not None else []
    except Exception:
        return []
