"""The ``macfleet`` command line.

Every option can also come from an environment variable (``MACFLEET_<OPTION>``), shown in
``--help``. User mistakes are one-line usage errors, never tracebacks.
"""

from __future__ import annotations

import os
import sys

import click

from macfleet.env import DEVICES
from macfleet.launcher.hosts import Host, parse_hosts
from macfleet.launcher.launch import LaunchConfig, run_job


@click.group(context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "MACFLEET"})
@click.version_option(package_name="macfleet")
def main() -> None:
    """Train one PyTorch model on one or several Macs."""


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--nproc", type=click.IntRange(min=1), default=None,
              help="Training processes per host (single-Mac mode: how many share this Mac's GPU).")
@click.option("--hosts", default=None, metavar="HOST[:SLOTS],...",
              help="Hosts to train on, in rank order, e.g. mac1:2,mac2:2 (several-Mac mode).")
@click.option("--device", type=click.Choice(DEVICES), default="auto", show_default=True, show_envvar=True,
              help="Device of every rank: auto picks mps, then cuda, then cpu.")
@click.option("--seed", type=int, default=0, show_default=True, show_envvar=True,
              help="Base seed; rank r seeds its generators with seed + r.")
@click.option("--memory-fraction", type=click.FloatRange(0.0, 1.0, min_open=True), default=None, show_envvar=True,
              help="Each process's share of its GPU's memory [default: 0.9 / processes per host].")
@click.option("--heartbeat-timeout", type=click.FloatRange(min=1.0), default=10.0, show_default=True,
              show_envvar=True, help="Seconds without a heartbeat before a rank or host counts as lost.")
@click.option("--env", "env_pairs", multiple=True, metavar="K=V", help="Extra environment for every rank.")
@click.argument("script", type=click.Path(dir_okay=False))
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
def launch(nproc: int | None, hosts: str | None, device: str, seed: int, memory_fraction: float | None,
           heartbeat_timeout: float, env_pairs: tuple[str, ...], script: str, script_args: tuple[str, ...]) -> None:
    """Run SCRIPT [ARGS]... as one data-parallel job.

    \b
    macfleet launch --nproc 2 examples/mnist/train.py --epochs 1
    """
    if not os.path.isfile(script):
        raise click.BadParameter(f"no such file: {script}", param_hint="SCRIPT")
    try:
        host_list = parse_hosts(hosts, nproc or 1) if hosts else [Host("localhost", nproc or 1)]
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--hosts") from None
    if any(not h.is_local for h in host_list):
        raise click.UsageError("remote hosts are not supported yet; use localhost entries or --nproc")
    env: dict[str, str] = {}
    for pair in env_pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.isidentifier():
            raise click.BadParameter(f"{pair!r} is not K=V", param_hint="--env")
        env[key] = value
    cfg = LaunchConfig(
        hosts=host_list, script=os.path.abspath(script), args=list(script_args), device=device, seed=seed,
        memory_fraction=memory_fraction, env=env, heartbeat_timeout_s=heartbeat_timeout,
    )
    sys.exit(run_job(cfg))


if __name__ == "__main__":
    main()
