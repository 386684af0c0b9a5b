"""A real sshd for tests: throwaway host and user keys, a high port, chosen addresses only.

Distinct loopback addresses (127.0.0.2, 127.0.0.3) stand for distinct Macs; in a network
namespace the same helper serves that namespace's address.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


@dataclass
class Sshd:
    port: int
    identity: Path
    proc: subprocess.Popen

    def launch_options(self) -> list[str]:
        """The `macfleet launch/doctor` options that reach this sshd."""
        return ["--ssh-port", str(self.port), "--ssh-identity", str(self.identity),
                "--ssh-option", "StrictHostKeyChecking=no", "--ssh-option", "UserKnownHostsFile=/dev/null"]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def available() -> bool:
    return os.path.exists(SSHD) and shutil.which("ssh") is not None and shutil.which("ssh-keygen") is not None


def not_here(addresses: list[str]) -> list[str]:
    """Those of ``addresses`` that no socket here can bind. Linux answers for the whole of
    127.0.0.0/8; macOS has 127.0.0.1 alone on lo0 until more are added, and sshd there failed
    to listen on 127.0.0.2, so every test of several hosts waited 20 s, then erred."""
    missing = []
    for addr in addresses:
        with socket.socket() as s:
            try:
                s.bind((addr, 0))
            except OSError:
                missing.append(addr)
    return missing


def free_port(addr: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def make_keys(directory: Path) -> Path:
    """A user key pair with its public half authorized; returns the private key's path."""
    identity = directory / "user_key"
    if not identity.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(identity)], check=True)
        (directory / "authorized_keys").write_text((directory / "user_key.pub").read_text())
    return identity


def start_sshd(directory: Path, addresses: list[str], port: int | None = None,
               prefix: list[str] | None = None) -> Sshd:
    """Start sshd listening on ``addresses`` (``prefix`` e.g. runs it inside a namespace)."""
    directory.mkdir(parents=True, exist_ok=True)
    identity = make_keys(directory)
    host_key = directory / f"host_key_{addresses[0]}"
    if not host_key.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True)
    port = port or free_port()
    config = directory / f"sshd_config_{addresses[0]}"
    lines = [f"Port {port}", *(f"ListenAddress {a}" for a in addresses), f"HostKey {host_key}",
             f"AuthorizedKeysFile {directory / 'authorized_keys'}", "PubkeyAuthentication yes",
             "PasswordAuthentication no", "KbdInteractiveAuthentication no", "StrictModes no", "UsePAM no",
             f"PidFile {directory / ('sshd_' + addresses[0] + '.pid')}", "LogLevel ERROR",
             f"AllowUsers {getpass.getuser()}"]
    if os.geteuid() == 0:
        lines.append("PermitRootLogin prohibit-password")
        os.makedirs("/run/sshd", exist_ok=True)  # its privilege-separation directory
    config.write_text("\n".join(lines) + "\n")
    log = directory / f"sshd_{addresses[0]}.log"
    # a file, not a pipe: nobody reads sshd's log while it runs, and a pipe that fills stalls sshd
    with open(log, "wb") as errors:
        proc = subprocess.Popen([*(prefix or []), SSHD, "-D", "-e", "-f", str(config)],
                                stdout=subprocess.DEVNULL, stderr=errors)
    deadline = time.monotonic() + 20
    for addr in addresses:  # ready when every address accepts a connection
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"sshd exited: {log.read_text(errors='replace')}")
            try:
                probe = [*(prefix or []), sys.executable, "-c",
                         f"import socket; socket.create_connection(('{addr}', {port}), 1).close()"]
                if subprocess.run(probe, capture_output=True).returncode == 0:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"sshd did not listen on {addr}:{port}")
            time.sleep(0.1)  # polling a port for readiness
    return Sshd(port, identity, proc)
