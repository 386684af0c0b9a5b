"""Start a training script the way ``python script.py args`` would, recording how it fails.

``python -m macfleet.workers.bootstrap SCRIPT [ARGS...]`` runs SCRIPT as ``__main__`` (and
``... bootstrap -m MODULE [ARGS...]`` a module, as ``python -m`` would). An
uncaught exception is printed as Python would (its traceback starting at the script, without
the bootstrap's own frames) and written to ``MACFLEET_ERROR_FILE`` for the launcher's
report. Imports no torch: the environment the agent prepared must be in place before the
script imports it.
"""

from __future__ import annotations

import faulthandler
import gc
import importlib.machinery
import importlib.util
import io
import os
import runpy
import sys
import sysconfig
import threading
import time
import traceback
import types
import warnings

import macfleet
from macfleet import errorfile, knobs, whereabouts
from macfleet.errors import MacfleetError
from macfleet.workers import dumps, leftovers


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python -m macfleet.workers.bootstrap SCRIPT [ARGS...]")
    module = sys.argv[2] if sys.argv[1] == "-m" and len(sys.argv) > 2 else None
    # inherited by the script's subprocesses, which macfleet.init() then tells from the rank itself
    os.environ["MACFLEET_RANK_PID"] = str(os.getpid())
    # A crash below Python (a segfault in a native extension, Metal's assertions aborting the
    # process) prints every thread's Python stack on stderr, whose last lines the report shows,
    # before the process dies of its signal as it would have: the line of the script that did it.
    faulthandler.enable()
    # Line-buffered, as on a terminal, not unbuffered as PYTHONUNBUFFERED made them (the rank's
    # own Python children keep that, so their output still streams). Unbuffered, print() writes
    # its text and its newline in two calls, and a rank held up between them for longer than
    # the agent's SETTLE_S (a loaded Mac) had its line forwarded in two pieces, another rank's
    # line between them. Line-buffered, a line leaves in one write, and a bar's \r redraw too.
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(line_buffering=True, write_through=False)
    if os.environ.get("MACFLEET_AGENT_FD"):
        _start_keeper(int(os.environ.pop("MACFLEET_AGENT_FD")))
    if os.environ.get("MACFLEET_STACKS_FILE"):  # where a rank that holds the GIL for good is (dumps.py)
        dumps.arm(os.environ["MACFLEET_STACKS_FILE"])
    whereabouts.watch_input()  # a prompt of the script's, waiting for its user, is no stall
    # torch warns when it is imported where NumPy is not installed at all (torch does not need
    # it), and every rank printed the same two lines at every start. A script that does use
    # NumPy still gets torch's own error ("Numpy is not available"); a NumPy that is installed
    # but broken still warns.
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy: No module named 'numpy'")
    script = os.path.abspath(sys.argv[1])
    code: object = 0
    try:
        if module is not None:
            sys.argv = sys.argv[2:]
            script_path(os.getcwd())
            spec = _find_module(module)
            if spec is None:  # the user's mistake: one line, none of our frames
                _report(ModuleNotFoundError(f"No module named {module!r} in {os.getcwd()} or the installed "
                                            f"packages (-m runs it as python -m would, from --cwd)"), module)
                sys.exit(1)
            script = os.path.abspath(spec.origin) if spec.origin else module
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            sys.argv = sys.argv[1:]
            script_path(os.path.dirname(script))
            runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = exc.code
        if code not in (0, None):
            _tell_the_job(exc)
    except BaseException as exc:
        _report(exc, script)
        code = 130 if isinstance(exc, KeyboardInterrupt) else 1
        _tell_the_job(exc)
    _free_script_objects()
    if code in (0, None):
        code = _leave_job(script)
    _watch_the_exit()
    sys.exit(code)


def _tell_the_job(exc: BaseException) -> None:
    """Say in the heartbeats that the script ended by ``exc``, for as long as the process has
    not exited (Python may wait for threads of the script, for good: the launcher then ends the
    job with ``exc`` as its cause)."""
    runtime = sys.modules.get("macfleet.runtime")  # not imported: the script never joined a job
    if runtime is not None:
        runtime.script_failed(exc)


# How long a rank's exit may wait for its script's threads before the rank says which ones.
THREADS_NOTE_S = 3.0


def _watch_the_exit() -> None:
    """Python waits at exit for every thread that is not a daemon. One that never ends (a
    prefetcher that loops until a flag the script never sets) kept the rank, and so the job,
    running after every rank had printed its last line, with no word of why (under torchrun
    too). A daemon timer names such threads, and where each is, once the exit has waited for
    them THREADS_NOTE_S; it stops none of them (one may be finishing an upload)."""
    timer = threading.Timer(THREADS_NOTE_S, _name_threads_that_hold_the_exit)
    timer.daemon = True
    timer.name = "macfleet-exit-watch"
    timer.start()


def _name_threads_that_hold_the_exit() -> None:
    held = [t for t in threading.enumerate() if not t.daemon and t is not threading.main_thread() and t.is_alive()]
    if not held:
        return  # they ended: the exit goes on with atexit's handlers, which take their own time
    frames = sys._current_frames()
    where = "; ".join(f"thread {t.name!r} at {_place(frames.get(t.ident or 0))}" for t in held)
    print(f"macfleet: the script has ended, and Python waits for its threads that are not daemons to end before "
          f"this rank exits: {where}. End them before the script does, or start them with daemon=True",
          file=sys.stderr, flush=True)


def _place(frame: types.FrameType | None) -> str:
    """``file:line in function`` of the innermost frame outside Python's own library (where a
    thread waits on a queue or a lock, the line of the script or package that waits is the news)."""
    found = innermost = frame
    while found is not None and _pythons_own(found.f_code.co_filename):
        found = found.f_back
    found = found or innermost
    if found is None:
        return "an unknown place"
    return f"{found.f_code.co_filename}:{found.f_lineno} in {found.f_code.co_name}"


def _leave_job(script: str) -> int:
    """Leave the macfleet job (if the script joined one) as ``atexit`` would, but where an
    error can still fail the rank: one that only the last reads find (ranks that named different
    sources for the script's last broadcast) was printed as "Exception ignored in atexit
    callback", and the rank exited 0."""
    runtime = sys.modules.get("macfleet.runtime")
    if runtime is None:
        return 0
    try:
        runtime.shutdown()
    except Exception as exc:
        _report(exc.with_traceback(None), script)  # its message says it all; the frames are macfleet's
        return 1
    return 0


# At the pipe's end: the rank's own check (runtime._check_parent, once a second) has had time to
# release the job's shared memory, which needs Python on macOS; then what is left goes. Only a
# cat that read to the end (exit 0) means the agent is gone: a cat killed by a signal (a stray
# `pkill cat`) had the keeper SIGKILL a live rank 3 s later, and the report then blamed the
# rank. Another cat reads on from where that one stopped, since the pipe is the shell's stdin.
# Before the group, what the ranks started in sessions of their own, by the marks in their
# environment, as the agent finds them at the job's end (leftovers.py). The keeper's own
# environment holds neither mark, so neither it nor its ps is among them.
KEEPER = ('while ! cat >/dev/null; do sleep 1; done; sleep 3; '
          '[ -n "$MACFLEET_SHM_DIR" ] && rm -rf "$MACFLEET_SHM_DIR"; '
          'ps -A $KEEP_PS -ww -o pid=,command= | while read -r pid rest; do case " $rest " in '
          '*" MACFLEET_JOB_ID=$KEEP_JOB "*) case " $rest " in *" MACFLEET_AGENT_PID=$KEEP_AGENT "*) '
          'kill -KILL "$pid";; esac;; esac; done; kill -KILL 0')


def _start_keeper(alive_fd: int) -> None:
    """A process in this rank's group that stops the group when the agent is gone. The rank
    stops itself then too (``runtime._check_parent``), but not where it holds the GIL for good,
    has left the job (``macfleet.shutdown``) or never joined it; and what it started is left
    behind once it has exited: its agent, which stops them at the job's end, may be SIGKILLed
    first. The keeper also holds the group's id, which no new group can take while it lives, so
    the agent's last killpg cannot reach another job's."""
    devnull = os.open(os.devnull, os.O_RDWR)
    env = {"PATH": "/usr/bin:/bin", "MACFLEET_SHM_DIR": os.environ.get("MACFLEET_SHM_DIR", ""),
           "KEEP_JOB": os.environ.get("MACFLEET_JOB_ID", "-"), "KEEP_AGENT": os.environ.get("MACFLEET_AGENT_PID", "-"),
           "KEEP_PS": leftovers.PS_ENVIRONMENT}
    try:
        os.posix_spawn("/bin/sh", ["sh", "-c", KEEPER], env, file_actions=[
            (os.POSIX_SPAWN_DUP2, alive_fd, 0),  # cat ends at the pipe's EOF: no agent holds it any more
            (os.POSIX_SPAWN_DUP2, devnull, 1),   # not the rank's output pipes, whose end the agent waits for
            (os.POSIX_SPAWN_DUP2, devnull, 2),
        ])
    except OSError:
        pass  # no keeper: the rank still stops itself when its agent is gone
    finally:
        os.close(devnull)
        os.close(alive_fd)


def script_path(folder: str) -> None:
    """Put ``folder`` first on ``sys.path``, as ``python`` does for the script it runs: the
    script's folder for ``python script.py``, the working directory for ``python -m``. Unless
    ``PYTHONSAFEPATH`` asks for neither (from Python 3.11). The rank started without either:
    see ``module_command``."""
    if not (os.environ.get("PYTHONSAFEPATH") and sys.version_info >= (3, 11)):
        sys.path.insert(0, folder)


def _find_module(module: str) -> importlib.machinery.ModuleSpec | None:
    """``module``'s spec, or None where it (or a package it is in) is not there. An import that
    fails inside an existing package is the package's own error, with its traceback."""
    try:
        return importlib.util.find_spec(module)
    except ModuleNotFoundError as exc:
        if exc.name and (module == exc.name or module.startswith(exc.name + ".")):
            return None
        raise


def _free_script_objects() -> None:
    """The script's objects are unreachable from here on (its globals were a temporary module's,
    and the exception that held its frames is out of scope): free them while the interpreter is
    whole. Left to Python's finalization, a gloo process group aborts the process with
    "terminate called without an active exception" (pytorch#190489; 1 plain torchrun run in 5
    of a DDP script that ends with a collective): a gloo run-loop thread drops the last
    collective's tensors just after it completes and must take the GIL to do so, which a thread
    cannot do once finalization has begun."""
    # Nothing signals when those threads are done, so first give them the GIL for a moment
    # (they need microseconds); the collection then frees the group, whose destructor joins them.
    time.sleep(0.01)
    # A DataLoader iterator that the collection frees (one left in a traceback, when the script
    # failed mid-epoch) stopped its workers by a message through a queue that the same
    # collection had already closed, then waited 5 s for them to exit (every rank's report came
    # that late). The script is over: mark it as torch's own exit hook does at the end of a plain
    # `python script.py`, so the iterator leaves its workers, which are daemons, to
    # multiprocessing's exit hook, which ends them as it does there.
    data_utils = sys.modules.get("torch.utils.data._utils")
    if data_utils is not None and hasattr(data_utils, "python_exit_status"):
        data_utils.python_exit_status = True
    gc.collect()
    # What is left is torch's and the other modules' own objects, about 160,000 of them, which
    # the interpreter's finalization goes through in several full collections: 0.35 s of a
    # rank's exit here, in every rank of every job. Frozen, the collections skip them: module
    # dictionaries are still cleared (what only they hold is freed) and objects made from here
    # on (by atexit handlers) are still collected; only reference cycles among the frozen ones
    # are left to the process's end, whose finalizers Python never promised to run at exit.
    # Not where an extension built with nanobind is loaded: nanobind counts its types and
    # functions still alive once the interpreter has ended, and frozen ones never go, so each
    # rank printed some 30 lines of "nanobind: leaked ..." after a clean run (triton, which
    # torch 2.15's CUDA build imports with the first optimizer; MLX on a Mac).
    if not _nanobind_loaded():
        gc.freeze()


def _nanobind_loaded() -> bool:
    """Whether a loaded extension module holds an object of nanobind's: one whose type is
    nanobind's (a function, or a class, whose metaclass is nanobind's), or an instance of such a
    class. Extension modules only: 5 ms with torch's 2,000 modules."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    for module in list(sys.modules.values()):
        try:  # past the module's own attribute lookup: one of importlib's LazyLoader would load now
            namespace = object.__getattribute__(module, "__dict__")
        except AttributeError:
            continue  # None (an import blocked), or some object without attributes of its own
        if not str(namespace.get("__file__") or "").endswith(suffixes):
            continue
        for value in list(namespace.values()):
            if "nanobind" in (getattr(type(value), "__module__", None), getattr(type(type(value)), "__module__", None)):
                return True
    return False


def _pythons_own(filename: str) -> bool:
    """Whether ``filename`` is of Python's own library (threading, concurrent.futures), not of a
    package installed in it."""
    paths = sysconfig.get_paths()
    packages = (paths["purelib"], paths["platlib"])  # inside the standard library's folder, outside a venv
    return filename.startswith(paths["stdlib"]) and not filename.startswith(packages)


MACFLEET_DIR = os.path.dirname(os.path.abspath(macfleet.__file__)) + os.sep


def without_macfleet_frames(exc: BaseException) -> int:
    """Cut from an error macfleet raised on purpose (a ``MacfleetError``: ranks in different
    collectives, a lost peer, a bad setting), or from a Ctrl-C, the frames inside macfleet below
    the script's last call into it, and the same kind of error it was raised while handling (a
    thread's, raised again); return how many frames went. Its message says what went wrong and
    the script's line says where: a mismatched all-reduce printed thirteen frames of shm.py and
    collectives.py on every rank, and again in the report, and so did a Ctrl-C of ranks waiting
    in one. Any other exception keeps every frame: one raised inside macfleet is macfleet's bug,
    and its frames are what shows it."""
    if not isinstance(exc, (MacfleetError, KeyboardInterrupt)) or knobs.switch("MACFLEET_FULL_TRACEBACK", False):
        return 0
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append(tb)
        tb = tb.tb_next
    # the script's frames and its packages' (torch's backward calling macfleet's hooks), not
    # Python's own: one raised in a thread of macfleet's is raised again by the script's thread,
    # and its frames, threading's and concurrent.futures' among them, follow the script's
    outside = [i for i, frame in enumerate(frames) if not (
        os.path.abspath(frame.tb_frame.f_code.co_filename).startswith(MACFLEET_DIR)
        or _pythons_own(frame.tb_frame.f_code.co_filename))]
    if not outside:  # raised where the script has no frame (a thread of macfleet's): keep it whole
        return 0
    left_out = len(frames) - 1 - outside[-1]
    frames[outside[-1]].tb_next = None
    # (not for one the script raised itself, with nothing said of what is left out)
    if left_out and exc.__cause__ is None and isinstance(exc.__context__, MacfleetError):
        exc.__suppress_context__ = True
    return left_out


def _report(exc: BaseException, script: str) -> None:
    """Print the traceback as Python would, from the script's first frame, and write the error file."""
    tb = exc.__traceback__
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) != script:
        tb = tb.tb_next
    if tb is None and isinstance(exc, SyntaxError) and exc.filename and os.path.abspath(exc.filename) == script:
        exc = exc.with_traceback(None)  # the script never ran: Python shows the line alone, with no frames
    else:
        exc = exc.with_traceback(tb or exc.__traceback__)
    left_out = without_macfleet_frames(exc)
    text = "".join(traceback.format_exception(exc))
    if left_out:
        text += (f"({left_out} frame{'s' if left_out > 1 else ''} inside macfleet left out; "
                 f"MACFLEET_FULL_TRACEBACK=1 shows {'them' if left_out > 1 else 'it'})\n")
    sys.stderr.write(text)
    path = os.environ.get("MACFLEET_ERROR_FILE")
    # Already there: a subprocess of this rank failed first and wrote it (macfleet.init() in a
    # DataLoader worker), and that is the cause, not the DataLoader's "worker exited" that follows.
    if path and not os.path.exists(path):
        try:
            errorfile.write(path, exc, text)
        except OSError:
            pass  # the report falls back to the stderr tail the agent keeps


if __name__ == "__main__":
    main()
