"""The per-host side of a job: the agent (``python -m macfleet.workers.agent``) and the
bootstrap every training process starts through."""

from __future__ import annotations

NOT_INSTALLED = "macfleet is not installed for "  # then the Python's path
# The first statement of our -c lines: take off the working directory that -c puts first on
# sys.path (``cwd``: whether it was there), so that a folder named macfleet there is not taken
# for the installed package.
WITHOUT_CWD = "import sys; cwd = sys.path[:1] == ['']; del sys.path[:cwd]"


def module_command(python: str, module: str, *args: str) -> list[str]:
    """The command that runs ``python -m module args``, but for one thing: the working directory
    joins ``sys.path`` only once macfleet is imported. ``python -m`` puts it first, so where the
    job runs in a folder that holds a ``macfleet`` folder (the root of a checkout of macfleet,
    whose ``workers`` package lies beside it, with a non-editable install), that folder was
    imported in place of the installed package, and every agent and rank died with "No module
    named 'macfleet.workers'". The module then runs as under ``-m``: as ``__main__``, the working
    directory first on ``sys.path``, its own file as ``sys.argv[0]``. (Under ``-I`` or
    ``PYTHONSAFEPATH`` Python adds no working directory, and neither does this.) A Python without
    macfleet says so in one line (``NOT_INSTALLED``), not in a traceback."""
    code = (f"{WITHOUT_CWD}; import importlib.util, os, runpy; "
            f"importlib.util.find_spec('macfleet') or sys.exit({NOT_INSTALLED!r} + sys.executable); "
            "import macfleet.workers; sys.path[:0] = [os.getcwd()] * cwd; "
            f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)")
    return [python, "-c", code, *args]
