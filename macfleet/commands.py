"""How macfleet starts its own Python processes (the hosts' agents, the ranks, the store):
``python -m`` without the working directory on ``sys.path``.

The launcher starts agents with it and the agents start ranks with it, so it lives in the
library that both import (DESIGN.md section 1: the launcher and the workers share no code of
each other's).
"""

from __future__ import annotations

import os
import sys

NOT_INSTALLED = "macfleet is not installed for "  # then the Python's path
# The first statement of our -c lines: take off the working directory that -c puts first on
# sys.path (as '', unless -P or PYTHONSAFEPATH kept it off), so that a folder named macfleet
# there is not taken for the installed package.
WITHOUT_CWD = "import sys; del sys.path[:sys.path[:1] == ['']]"
# Files whose frames start a script rather than belong to it, besides runpy's and the -c line's
# ("<string>"): the bootstrap adds its own (``starter``), as the library does not know where the
# workers are installed.
_STARTERS: set[str] = set()


def module_command(python: str, module: str, *args: str, same_python: bool = False) -> list[str]:
    """The command that runs ``python -m module args``, but for one thing: the working directory
    is not put on ``sys.path``. ``python -m`` puts it first, so where the job runs in a folder
    that holds a ``macfleet`` folder (the root of a checkout of macfleet, whose ``workers``
    package lies beside it, with a non-editable install), that folder was imported in place of
    the installed package, and every agent and rank died with "No module named
    'macfleet.workers'". macfleet's modules need no working directory; the bootstrap puts on
    ``sys.path`` what the script's own ``python`` would (``bootstrap.script_path``).

    ``same_python``: ``python`` is the Python running this (the agent, starting its ranks), so
    its version is known. From 3.11 its ``-P`` leaves the working directory off, and the
    command is ``python -P -m module args``, which is what ``ps`` shows. Otherwise a ``-c``
    line takes the working directory off again and runs the module as ``-m`` would (as
    ``__main__``, its own file as ``sys.argv[0]``); a Python without macfleet says so in one
    line (``NOT_INSTALLED``), not in a traceback."""
    if same_python and sys.version_info >= (3, 11):
        return [python, "-P", "-m", module, *args]
    code = (f"{WITHOUT_CWD}; import importlib.util, runpy; "
            f"importlib.util.find_spec('macfleet') or sys.exit({NOT_INSTALLED!r} + sys.executable); "
            f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)")
    return [python, "-c", code, *args]


def starter(path: str) -> None:
    """Frames in file ``path`` start scripts (the bootstrap's): see ``starts_script``."""
    _STARTERS.add(os.path.abspath(path))


def starts_script(path: str) -> bool:
    """Whether a frame in file ``path`` is of what starts the script (the ``-c`` line of
    ``module_command``, runpy, the bootstrap), not of the script: stack reports leave them out."""
    return path in ("<frozen runpy>", "<string>") or os.path.basename(path) == "runpy.py" or \
        os.path.abspath(path) in _STARTERS
