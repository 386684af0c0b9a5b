"""The script's own modules that a rank has imported, for the launcher to compare between Macs.

Without a disk the Macs share, each runs its own copy of the script and of the modules beside it
(the ``model.py`` that ``train.py`` imports), and an edit that reached one Mac alone makes its
ranks run other code with nothing to show for it. The agents compare the script itself before
any rank starts (``workers.agent.script_digest``); at ``macfleet.init()`` each host's first rank
sends the SHA-256 of every module the script has imported from its own folder so far (its own
code, not installed packages), and at its first training step those imported since
(``runtime.note_sources_again``); the launcher names those that differ between hosts.
"""

from __future__ import annotations

import hashlib
import os
import sys

MOST = 500  # modules reported at most: a message stays small whatever the folder holds
INSTALLED = ("site-packages", "dist-packages")  # packages installed under the folder some other way


def imported_here() -> dict[str, str]:
    """``{path relative to the script's folder: first 12 hex digits of its SHA-256}`` for the
    modules imported from that folder and below it: the script's, or under ``-m`` the working
    directory (the module itself counts then)."""
    main_module = sys.modules.get("__main__")
    main = getattr(main_module, "__file__", None)
    by_path = main is not None and getattr(main_module, "__spec__", None) is None  # not -m
    # the folder the script's imports are found in first; a script run by its path the agents
    # compared already, a module run with -m they did not
    root = os.path.realpath(os.path.dirname(main) if by_path else os.getcwd())
    skip = os.path.realpath(main) if by_path else None
    # Python's own modules (its standard library and packages, where a virtual environment is
    # in the project's folder or a conda in the home folder that holds the script) differ with
    # the Python version, which may differ between hosts: left out
    prefixes = (sys.prefix, sys.base_prefix, sys.exec_prefix)
    pythons = {os.path.realpath(p) for p in prefixes} | {os.path.abspath(p) for p in prefixes}
    found: dict[str, str] = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if not isinstance(path, str) or not path.endswith(".py"):
            continue
        path = os.path.abspath(path)
        if _installed(path, pythons):
            continue  # most of them, told from the path as it is: a real path costs a system call a folder
        path = os.path.realpath(path)
        if path == skip or not _under(path, root) or _installed(path, pythons):
            continue
        try:
            found[os.path.relpath(path, root)] = digest(path)
        except OSError:
            continue
        if len(found) == MOST:
            break
    return found


def digest(path: str) -> str:
    """The first 12 hex digits of the SHA-256 of the file at ``path``: how hosts compare their
    copies of the script (the agents) and of its modules (the ranks)."""
    with open(path, "rb") as source:
        return hashlib.sha256(source.read()).hexdigest()[:12]


def _under(path: str, folder: str) -> bool:
    return os.path.commonpath([path, folder]) == folder


def _installed(path: str, pythons: set[str]) -> bool:
    return any(_under(path, p) for p in pythons) or any(part in INSTALLED for part in path.split(os.sep))
