"""The ``macfleet`` command line: ``launch``, ``doctor``, ``cabling`` and ``bench``.

Every option can also come from an environment variable (``MACFLEET_<COMMAND>_<OPTION>``,
shown in ``--help``). User mistakes are one-line usage errors, never tracebacks.
"""

from __future__ import annotations

import difflib
import ipaddress
import math
import os
import re
import shutil
import sys
from dataclasses import replace
from typing import Any, Callable, NoReturn

import click

from macfleet import knobs, openfiles
from macfleet.env import AGENT_SETS, DEVICES
from macfleet.launcher.hosts import Host, data_addresses, parse_hostfile, parse_hosts
from macfleet.launcher.launch import LaunchConfig, run_with_restarts
from macfleet.launcher.remote import SshOptions, find_this_machine
from macfleet.launcher.thunderbolt import DEFAULT_SUBNET, run_cabling
from macfleet.lines import NO_ROOM, forward_nowhere, reopen_closed_std_streams


@click.group(context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "MACFLEET"})
@click.version_option(package_name="macfleet")
def main() -> None:
    """Train one PyTorch model on one or several Macs."""
    reopen_closed_std_streams()


class FiniteRange(click.FloatRange):
    """A FloatRange that refuses nan and inf as well. Both pass its comparisons: a heartbeat
    timeout of nan never ran out, so a lost Mac was never noticed, and a memory fraction of nan
    reached every rank, to fail there."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


def not_empty(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """"" for a path, a program or an interface (``--log-dir "$LOGS"`` with LOGS unset) was
    taken for the current directory (--cwd, --log-dir) or for no choice at all (--data-iface,
    --ssh-identity): a mistake, named as one. (An empty MACFLEET_* variable is unset to click.)"""
    if value == "":
        raise click.BadParameter("is empty: give a value, or leave the option out", ctx, param)
    return value


def file_to_write(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """A file the command writes at its end (bench's --json, cabling's hostfile): a directory
    that is not there, or not ours to write in, is said before minutes of work, not after."""
    value = not_empty(ctx, param, value)
    if value is not None:
        directory = os.path.dirname(os.path.abspath(value))
        if not os.path.isdir(directory) or not os.access(directory, os.W_OK):
            raise click.BadParameter(f"cannot write in {directory}", ctx, param)
    return value


def key_file(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """An ssh key that is not there: ssh only warns of it, then fails as "Permission denied"
    (as ssh does, ``~`` is the home directory)."""
    value = not_empty(ctx, param, value)
    if value is not None and not os.path.isfile(os.path.expanduser(value)):
        raise click.BadParameter(f"no such file: {value}", ctx, param)
    return value


def host_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Where to run and how to get there, and what the ranks run with: shared by every command
    that starts a job."""
    return reach_options(job_options(command))


def reach_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The hosts and how to reach them."""
    options = [
        click.option("--nproc", type=click.IntRange(min=1), default=None,
                     help="Training processes per host (the slots of hosts that give none) [default: 1]."),
        click.option("--hosts", default=None, metavar="[USER@]HOST[:SLOTS],...",
                     help="Hosts in rank order, e.g. mac1:2,mac2:2. Default: this Mac only."),
        click.option("--hostfile", type=click.Path(exists=True, dir_okay=False), default=None,
                     help="Hosts from a file: 'host slots=N [addr=IP[,IP...]] [share=N] [max_slots=N] "
                          "[python=PATH]' per line, # comments, quotes as in a shell; or MLX's JSON hostfile."),
        click.option("--ssh-port", type=click.IntRange(1, 65535), default=None, help="ssh port of the remote hosts."),
        click.option("--ssh-identity", type=click.Path(dir_okay=False), callback=key_file, default=None,
                     help="ssh private key."),
        click.option("--ssh-option", "ssh_options", multiple=True, metavar="KEY=VALUE",
                     help="Extra ssh -o option (repeatable)."),
        click.option("--ssh-connect-timeout", type=click.IntRange(1, 600), default=10, show_default=True,
                     help="Seconds to wait for an ssh connection."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def job_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """What a job's agents and ranks run with on every host."""
    options = [
        click.option("--python", "python", callback=not_empty, default=sys.executable, show_default=True,
                     help="Python interpreter on the hosts (with macfleet and torch installed; a relative "
                          "path is taken from --cwd); a hostfile line's python=PATH names that host's own."),
        click.option("--cwd", callback=not_empty, default=None,
                     help="Working directory on every host [default: the current one]."),
        click.option("--data-addr", callback=not_empty, default=None, metavar="IP[,IP...]",
                     help="This Mac's data-plane address (e.g. a Thunderbolt bridge IP), or one per cable."),
        click.option("--data-iface", callback=not_empty, default=None,
                     help="Train over this interface on every host (e.g. bridge0)."),
        click.option("--env", "env_pairs", multiple=True, metavar="K=V", help="Extra environment for every rank."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def make_config(script: str, script_args: list[str], nproc: int | None, hosts: str | None,
                hostfile: str | None, ssh_port: int | None, ssh_identity: str | None,
                ssh_options: tuple[str, ...], ssh_connect_timeout: int, python: str, cwd: str | None,
                data_addr: str | None, data_iface: str | None, env_pairs: tuple[str, ...], **rest: Any) -> LaunchConfig:
    if hosts is not None and hostfile:
        raise click.UsageError("give --hosts or --hostfile, not both")
    try:
        if hosts is not None:  # "" too: an empty list is a mistake, not this Mac
            host_list = parse_hosts(hosts, nproc or 1)
        elif hostfile:
            host_list = parse_hostfile(hostfile, nproc or 1)
        else:
            host_list = [Host("localhost", nproc or 1)]
        given = parse_hosts(hosts, 1) if hosts is not None else parse_hostfile(hostfile, 1) if hostfile else host_list
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--hostfile" if hostfile else "--hosts") from None
    total = sum(h.slots for h in host_list)
    refused = openfiles.refusal("the launcher", total, openfiles.launcher_needs(total, len(host_list)))
    if refused is not None:  # each host's agent sees to its own
        raise click.UsageError(refused)
    if nproc is not None and (hosts or hostfile) and host_list == given and nproc not in (1, total):
        # Horovod's -np is a total, ours the slots of the hosts given without any: a silent no-op
        ranks = f"{total} rank{'s' if total != 1 else ''}"
        raise click.UsageError(f"--nproc {nproc} gives the slots of hosts listed without any, and every host "
                               f"has its own ({ranks} in all): drop --nproc, or a host's slots")
    data_addrs: tuple[str, ...] = ()
    if data_addr is not None:
        try:
            data_addrs = data_addresses(data_addr, "")
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--data-addr") from None
    for option in ssh_options:
        if "=" not in option:
            raise click.BadParameter(f"{option!r} is not KEY=VALUE", param_hint="--ssh-option")
    ssh = SshOptions(port=ssh_port, identity=ssh_identity, options=list(ssh_options),
                     connect_timeout_s=ssh_connect_timeout)
    host_list = find_this_machine(host_list, ssh)
    here = [h.ssh_target for h in host_list if h.is_local]
    if len(here) > 1:  # two agents, whose ranks would exchange over sockets instead of shared memory
        raise click.BadParameter(f"{', '.join(here[:-1])} and {here[-1]} name this machine alike: list it once, "
                                 f"with more slots",
                                 param_hint="--hostfile" if hostfile else "--hosts")
    env: dict[str, str] = {}
    for pair in env_pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.isidentifier():
            raise click.BadParameter(f"{pair!r} is not K=V", param_hint="--env")
        if key in AGENT_SETS:
            raise click.BadParameter(f"{key} is set for each rank by its agent, whatever --env says: "
                                     f"{AGENT_SETS[key]}", param_hint="--env")
        env[key] = value
    wrong = knobs.problems({**os.environ, **env})  # before any rank starts, once, not once a rank
    if wrong:
        raise click.UsageError("; ".join(wrong))
    cwd = cwd if in_home(cwd) else os.path.abspath(cwd or os.getcwd())  # ~/...: each host's own home
    cfg = LaunchConfig(hosts=host_list, script=script, args=list(script_args), python=python,
                       cwd=cwd, env=env, ssh=ssh, data_addrs=data_addrs,
                       data_iface=data_iface, **rest)
    local = next((h for h in host_list if h.is_local), None)
    if local is not None:  # remote hosts' agents report their own
        if not os.path.isdir(os.path.expanduser(cwd)):
            raise click.BadParameter(f"no such directory: {cwd}", param_hint="--cwd")
        program = cfg.python_on(local)
        found = _program_at(program, cwd)
        if shutil.which(found) is None:
            named = f" (the python= of {local.name})" if local.python else ""
            if found != os.path.expanduser(program):
                named += f" in {cwd}, where the ranks run (a relative path is taken from --cwd)"
            raise click.BadParameter(f"no such program: {program}{named}",
                                     param_hint="--hostfile" if local.python else "--python")
    return cfg


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@host_options
@click.option("--device", type=click.Choice(DEVICES), default="auto", show_default=True, show_envvar=True,
              help="Device of every rank: auto picks mps, then cuda, then cpu.")
# torch takes seeds below 2**64: each rank's seed + r, and the sampler's seed + epoch, stay
# below it. Out of range, every rank failed in macfleet.init() with "Overflow when unpacking".
@click.option("--seed", type=click.IntRange(0, 2**63 - 1), default=0, show_default=True, show_envvar=True,
              help="Base seed; rank r seeds its generators with seed + r.")
@click.option("--memory-fraction", type=FiniteRange(0.0, 1.0, min_open=True), default=None, show_envvar=True,
              help="Each process's share of its GPU's memory [default: 0.9 / the processes on that GPU; "
                   "a process alone on its GPU: no cap].")
@click.option("--heartbeat-timeout", type=FiniteRange(min=1.0), default=10.0, show_default=True,
              show_envvar=True, help="Seconds without a heartbeat before a rank or host counts as lost.")
@click.option("--stall-timeout", type=FiniteRange(min=0), default=60.0, show_default=True, show_envvar=True,
              help="Report ranks that others have waited on this long (0: never).")
@click.option("--stall-action", type=click.Choice(["warn", "abort"]), default="abort", show_default=True,
              show_envvar=True, help="After a stall report: keep waiting, or abort if it lasts twice as long.")
@click.option("--max-restarts", type=click.IntRange(min=0), default=0, show_default=True, show_envvar=True,
              help="After a failure, restart the whole job up to this many times (the script resumes from its checkpoint).")
@click.option("--min-hosts", type=click.IntRange(min=1), default=None, show_envvar=True,
              help="Go on without hosts that cannot be reached (asleep, off the network) while this many remain: "
                   "at the start, and at each restart [default: every host].")
@click.option("--allow-version-mismatch", is_flag=True, help="Run even if hosts have different torch/macfleet.")
@click.option("--log-dir", type=click.Path(file_okay=False), callback=not_empty, default=None, show_envvar=True,
              help="Also write each rank's output to DIR/rank-K.log on the rank's host (relative to --cwd); "
                   "a restart appends.")
@click.option("--show-ranks", callback=not_empty, default=None, metavar="RANKS", show_envvar=True,
              help="Show only these ranks' output on the terminal, e.g. 0 or 0,4-7 (--log-dir keeps every rank's).")
@click.option("--timeline", type=click.Path(dir_okay=False), callback=not_empty, default=None, show_envvar=True,
              help="Write when every rank's collectives, forwards, backwards and waits ran to FILE on this Mac, "
                   "for https://ui.perfetto.dev or chrome://tracing.")
@click.option("-m", "--module", is_flag=True, help="SCRIPT is a module, run as python -m runs it (from --cwd).")
@click.argument("script", type=click.Path())
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
def launch(script: str, script_args: tuple[str, ...], device: str, seed: int, memory_fraction: float | None,
           heartbeat_timeout: float, stall_timeout: float, stall_action: str, max_restarts: int,
           min_hosts: int | None, allow_version_mismatch: bool, log_dir: str | None, show_ranks: str | None,
           timeline: str | None, module: bool, **hosts: Any) -> None:
    """Run SCRIPT [ARGS]... as one data-parallel job.

    \b
    macfleet launch --nproc 2 examples/mnist/train.py --epochs 1
    macfleet launch --hosts mac1:2,mac2:2 examples/mnist/train.py
    macfleet launch --nproc 2 -m mypackage.train --epochs 1
    """
    if module:  # python -m's rules: the bootstrap finds it on each host, and says so if it is not there
        if not all(part.isidentifier() for part in script.split(".")):
            raise click.BadParameter(f"{script!r} is not a module name like mypackage.train", param_hint="-m")
        script, script_args = "-m", (script, *script_args)
    else:
        if script.startswith("-") and not os.path.exists(script):  # an option mistyped before SCRIPT
            _no_such_option(script)
        if INTERPRETER.fullmatch(os.path.basename(script)):
            _not_the_interpreter(script, script_args)
        script = _find_script(script, hosts.get("cwd"))
    cfg = make_config(script, list(script_args), device=device, seed=seed,
                      memory_fraction=memory_fraction, heartbeat_timeout_s=heartbeat_timeout,
                      stall_timeout_s=stall_timeout, stall_action=stall_action,
                      allow_version_mismatch=allow_version_mismatch, log_dir=log_dir, **hosts)
    if show_ranks is not None:
        cfg.show_ranks = parse_ranks(show_ranks, cfg.world_size)
    if min_hosts is not None and min_hosts > len(cfg.hosts):
        raise click.BadParameter(f"{min_hosts} is more hosts than the job has ({len(cfg.hosts)})",
                                 param_hint="--min-hosts")
    cfg.min_hosts = min_hosts
    if log_dir is not None and any(h.is_local for h in cfg.hosts):  # the others' agents check theirs
        directory = os.path.join(os.path.expanduser(cfg.cwd), log_dir)
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as exc:
            raise click.BadParameter(f"cannot make {directory}: {exc.strerror}", param_hint="--log-dir") from None
        if not os.access(directory, os.W_OK):
            raise click.BadParameter(f"cannot write in {directory}", param_hint="--log-dir")
    if timeline is not None:
        try:
            open(timeline, "a").close()  # before any host starts: the file is written as the job runs
        except OSError as exc:
            raise click.BadParameter(f"cannot write {timeline}: {exc.strerror}", param_hint="--timeline") from None
        cfg.timeline = timeline
    sys.exit(run_with_restarts(cfg, max_restarts))


def in_home(path: str | None) -> bool:
    """Whether ``path`` is given relative to a home directory (``~/proj``): each host's own."""
    return path is not None and (path == "~" or path.startswith("~/"))


# Other launchers' options for what ``--nproc`` and ``--hosts`` say, as their users type them
# from habit (torchrun's with ``_`` or ``-`` alike): whose each is, and what does its job here.
OTHER_LAUNCHERS = {
    "--nproc-per-node": ("torchrun's", "macfleet's is --nproc"),
    "--nnodes": ("torchrun's", "macfleet's --hosts lists every host with its processes: --hosts mac1:2,mac2:2"),
    "--node-rank": ("torchrun's", "macfleet needs none: the launcher starts every host of --hosts itself, over ssh"),
    "--master-addr": ("torchrun's", "macfleet needs none: the launching Mac coordinates the job "
                      "(--data-addr picks the address that training data goes over)"),
    "-np": ("horovodrun's and mpirun's", "macfleet's is --nproc (processes on this Mac) or --hosts mac1:2,mac2:2"),
    "-H": ("horovodrun's", "macfleet's is --hosts"),
    "-n": ("mlx.launch's", "macfleet's is --nproc"),
}
# ``python``, ``python3``, ``python3.12``, ``pythonw``: the interpreter typed before the script,
# as horovodrun and mpirun take it.
INTERPRETER = re.compile(r"python[0-9.]*w?")


def _no_such_option(given: str) -> NoReturn:
    """``--nprocs 2 train.py``: the unknown option reached us as SCRIPT (unknown options pass on
    to the script, after it), and was "no such file: --nprocs". Say what click says elsewhere,
    and for another launcher's option, which of ours does its job."""
    ctx = click.get_current_context()
    name = given.split("=", 1)[0]
    other = OTHER_LAUNCHERS.get(name.replace("_", "-"))
    if other is not None:
        whose, ours = other
        raise click.NoSuchOption(name, message=f"No such option: {name} (that is {whose}; {ours})",
                                 ctx=ctx)
    known = [opt for param in ctx.command.params for opt in param.opts if opt.startswith("-")]
    raise click.NoSuchOption(name, possibilities=difflib.get_close_matches(name, known), ctx=ctx)


def _not_the_interpreter(python: str, script_args: tuple[str, ...]) -> NoReturn:
    """``macfleet launch --nproc 2 python train.py``, as horovodrun takes it: the ranks would
    run the interpreter binary as a Python script (or "no such file: python"). Every rank runs
    under the agent's Python (``--python`` picks another), so SCRIPT is the script, as for
    torchrun and mlx.launch: say so, with the command line that works."""
    rest = list(script_args)
    while rest and rest[0].startswith("-") and rest[0] != "-m":  # the interpreter's own flags (-u, -O)
        rest.pop(0)
    meant = " ".join(rest) or "train.py"
    raise click.BadParameter(
        f"{python} is the interpreter: macfleet runs every rank with Python itself (--python picks which), "
        f"so give the script first: macfleet launch [OPTIONS] {meant}", param_hint="SCRIPT")


def _find_script(script: str, cwd: str | None) -> str:
    """The script's absolute path: as given, else (relative) in ``--cwd``, where the ranks run
    it, as ``cd CWD && python SCRIPT`` would. Under a ``--cwd`` in the home directory, its path
    from there: each host finds it under its own home."""
    script = _main_of_a_folder(script, cwd)
    if cwd is not None and in_home(cwd):
        here = os.path.realpath(os.path.expanduser(cwd))
        found = os.path.realpath(script if os.path.isfile(script) else os.path.join(here, script))
        if os.path.isfile(found) and os.path.commonpath([found, here]) == here:
            _a_python_script(found, script)
            return os.path.relpath(found, here)
    if os.path.isfile(script):
        _a_python_script(script, script)
        return os.path.abspath(script)
    if cwd is not None and not os.path.isabs(script) and os.path.isfile(os.path.join(cwd, script)):
        _a_python_script(os.path.join(cwd, script), script)
        return os.path.abspath(os.path.join(cwd, script))
    where = f" (in {os.getcwd()}" + (f" or --cwd {cwd})" if cwd is not None else ")")
    raise click.BadParameter(f"no such file: {script}{where if not os.path.isabs(script) else ''}",
                             param_hint="SCRIPT")


SHELLS = {"sh", "bash", "zsh", "dash", "ksh", "fish", "csh", "tcsh"}  # macOS's and Linux's


def _program_at(program: str, cwd: str) -> str:
    """``program`` as this Mac's agent finds it: a relative path (``.venv/bin/python``) from
    ``--cwd``, where the agent starts, as ``cd CWD && exec PROGRAM`` finds it on the others; a
    bare name on the PATH. It was looked for from the launcher's directory."""
    path = os.path.expanduser(program)
    return path if os.path.isabs(path) or os.sep not in path else os.path.join(os.path.expanduser(cwd), path)


def _main_of_a_folder(script: str, cwd: str | None) -> str:
    """A folder given as SCRIPT is run as ``python FOLDER`` runs it: its ``__main__.py``."""
    folders = [script] + ([os.path.join(os.path.expanduser(cwd), script)] if cwd and not os.path.isabs(script) else [])
    folder = next((f for f in folders if os.path.isdir(f)), None)
    if folder is None:
        return script
    if not os.path.isfile(os.path.join(folder, "__main__.py")):
        raise click.BadParameter(f"{script} is a folder without a __main__.py: give the script in it, or -m "
                                 f"package.module for a module of a package", param_hint="SCRIPT")
    return os.path.join(script, "__main__.py")


def _a_python_script(path: str, given: str) -> None:
    """A script whose ``#!`` line names a shell (``run.sh``, a wrapper that sets things up
    and then runs ``python train.py``) was run by every rank as Python: a
    SyntaxError from each. Every rank runs SCRIPT with Python, as under torchrun and
    mlx.launch: say so before anything starts. A file without a ``#!`` line, or whose ``#!``
    line names another runner of Python scripts (``uv run --script``), is Python, as python
    itself takes it."""
    try:
        with open(path, "rb") as f:
            first = f.readline(512)
    except OSError:
        return  # unreadable here: the ranks say why, where they run it
    words = first[2:].decode(errors="replace").split() if first.startswith(b"#!") else []
    if words and os.path.basename(words[0]) == "env":  # #!/usr/bin/env [-S] [K=V] bash
        words = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
    shell = os.path.basename(words[0]) if words else ""
    if shell not in SHELLS:  # python, or a Python script's runner (uv run --script): python runs it
        return
    raise click.BadParameter(
        f"{given} is a {shell} script ({first.decode(errors='replace').strip()}), and every "
        f"rank runs SCRIPT with Python (--python picks which): give the Python script it runs, with its "
        f"arguments (macfleet launch [OPTIONS] train.py [ARGS]); what it sets up, set it before macfleet "
        f"launch or with --env K=V", param_hint="SCRIPT")


def parse_ranks(text: str, world_size: int) -> list[int]:
    """'0,4-7' -> [0, 4, 5, 6, 7], each a rank of the job."""
    ranks: set[int] = set()
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise click.BadParameter(f"{part.strip()!r} is not a rank or a range like 4-7", param_hint="--show-ranks")
        span = range(int(first), int(last if dash else first) + 1)
        if not span:
            raise click.BadParameter(f"{part.strip()!r} is an empty range", param_hint="--show-ranks")
        if span[-1] >= world_size:
            raise click.BadParameter(f"{part.strip()!r} is not among the job's ranks 0-{world_size - 1}",
                                     param_hint="--show-ranks")
        ranks.update(span)
    return sorted(ranks)


@main.command()
@host_options
@click.option("--megabytes", type=click.IntRange(1, 4096), default=64, show_default=True,
              help="Bulk transfer per link for the bandwidth measurement.")
def doctor(megabytes: int, **hosts: Any) -> None:
    """Check hosts before training: ssh, versions, devices, addresses, and every ring link."""
    from macfleet.launcher.doctor import run_doctor

    hosts["nproc"] = 1  # one rank per host: the probe measures links between hosts
    cfg = make_config("-m", ["macfleet.workers.linkprobe", "--megabytes", str(megabytes)],
                      allow_version_mismatch=True, device="cpu", **hosts)
    cfg.hosts = [replace(h, slots=1) for h in cfg.hosts]  # each host as the job knows it: here, its Python
    sys.exit(run_doctor(cfg))


@main.command()
@reach_options
@click.option("--subnet", callback=not_empty, default=DEFAULT_SUBNET, show_default=True,
              help="The range each cable's /30 comes from (one no network of these Macs uses).")
@click.option("--output", "-o", type=click.Path(dir_okay=False), callback=file_to_write, default=None,
              help="Write the hostfile here (else it is printed).")
def cabling(subnet: str, output: str | None, **hosts: Any) -> None:
    """Find the Thunderbolt cables between Macs: print each Mac's commands that give every cable
    a subnet of its own, and the hostfile of a ring over them."""
    try:
        network = ipaddress.IPv4Network(subnet)
    except ValueError:
        raise click.BadParameter(f"{subnet!r} is not an IPv4 range like 10.78.0.0/16", param_hint="--subnet") from None
    cfg = make_config("-m", ["macfleet"], python=sys.executable, cwd=None, data_addr=None, data_iface=None,
                      env_pairs=(), allow_version_mismatch=True, device="cpu", **hosts)
    if len(cfg.hosts) < 2:
        raise click.UsageError("give the Macs to look at with --hosts or --hostfile (two or more)")
    sys.exit(run_cabling(cfg.hosts, cfg.ssh, network, output))


@main.group()
def bench() -> None:
    """Measure macfleet against torch.distributed (gloo) on your own Macs."""


@bench.command("allreduce")
@host_options
@click.option("--sizes", default="4K,1M,16M,64M,256M", show_default=True, help="Tensor sizes in bytes (K, M, G).")
@click.option("--dtype", type=click.Choice(["float32", "float16", "bfloat16"]), default="float32", show_default=True)
@click.option("--budget", type=FiniteRange(min=0.05), default=1.0, show_default=True,
              help="Seconds of timing per size and library.")
@click.option("--shared-tensors", is_flag=True, help="Allocate the tensors with macfleet.host_tensor, in memory "
              "this host's ranks share (as DataParallel's buckets are): macfleet reduces them where they are.")
@click.option("--no-gloo", is_flag=True, help="Time macfleet's alone (left out anyway where a host has one address "
              "per cable: gloo connects every rank to every other, over one interface).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), callback=file_to_write, default=None,
              help="Also write the results here.")
def bench_allreduce(sizes: str, dtype: str, budget: float, shared_tensors: bool, no_gloo: bool, json_path: str | None,
                    **hosts: Any) -> None:
    """Time macfleet's all-reduce and gloo's on the same processes and tensors, side by side."""
    from macfleet.launcher.bench import run_bench

    itemsize = 4 if dtype == "float32" else 2
    for text in sizes.split(","):
        try:
            size = knobs.parse_size(text)
        except ValueError:
            raise click.BadParameter(f"{text!r} is not a size like 4K, 16M or 1G", param_hint="--sizes") from None
        if size < itemsize:
            raise click.BadParameter(f"{text!r} is less than one {dtype} element ({itemsize} bytes)",
                                     param_hint="--sizes")
    cfg = make_config("-m", ["macfleet.workers.benchallreduce", "--sizes", sizes, "--dtype", dtype,
                             "--budget", str(budget), *(["--shared-tensors"] if shared_tensors else [])],
                      device="cpu", **hosts)
    if no_gloo:
        cfg.args.append("--no-gloo")  # and the ranks leave gloo out where hosts have one address per cable
    if cfg.world_size < 2:
        raise click.UsageError("an all-reduce needs at least 2 ranks: give --nproc 2 or more, or several hosts")
    sys.exit(run_bench(cfg, json_path))


def run() -> None:
    """The ``macfleet`` command: ``main``, where an output that takes no more (``> out.txt`` on
    a full disk) is one line on stderr instead of a traceback. (click itself ends quietly where
    the reader has gone, ``| head``.)"""
    try:
        main()
    except OSError as exc:
        if exc.errno not in NO_ROOM:
            raise
        forward_nowhere(1)  # else the interpreter's last flush fails again, with a traceback
        print(f"macfleet: cannot write its output ({exc.strerror})", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    run()
