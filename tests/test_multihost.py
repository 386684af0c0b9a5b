"""Several Macs, played by loopback addresses behind a real sshd: ``--hosts`` through ssh."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from conftest import (BIN, MNIST, bare_python, Job, job_processes, kill_group, launch_command, run_launch,
                      small_mnist, start_launch, wait_for_no_job_processes)
from test_collectives import run_cases
from test_faults import RunningJob, behave_line
from test_training import STEPS, reference_parameters

BEHAVE = str(BIN / "behave.py")
MNIST_ARGS = [str(MNIST), "--epochs", "1", "--seed", "3"]


def params(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path / "model.pt")["model"]


def test_mnist_across_hosts_matches_the_single_host_run(sshd, tmp_path) -> None:
    """On the ring (MACFLEET_SHM=0) every layout sums in the same order: the same parameters.
    The default path sums inside each host first, (a+b)+c rather than a+b+c, so a different
    layout changes only the rounding: within 2e-3 after an epoch (max |param| ~0.4). Three
    ranks, not two: two would take the pair exchange instead of the ring."""
    # the same kernels everywhere, so results can be compared exactly: CPU ones (a GPU's
    # convolutions are not deterministic), on one thread; 2,400 images (12 steps of 192) say as
    # much about the sums as the generated 12,000, in a fifth of the time
    same = ["--device", "cpu", "--env", "OMP_NUM_THREADS=1"]
    mnist = [*MNIST_ARGS, "--data-url", str(small_mnist(tmp_path / "data", 2400, 300))]
    ring = {"MACFLEET_SHM": "0"}
    single = run_launch("--nproc", "3", *same, *mnist, "--train-url", str(tmp_path / "one"), env=ring,
                        timeout=300)
    assert single.code == 0, single.output
    # the single-host run is a layout too: against it, uneven slots on the ring, and the default path
    runs = [("127.0.0.2:1,127.0.0.3:2", ring, 1e-6), ("127.0.0.2:2,127.0.0.3:1", {}, 2e-3)]
    for layout, env, tolerance in runs:
        out = tmp_path / (layout.replace(":", "_").replace(",", "-") + ("-ring" if env else "-shm"))
        job = run_launch("--hosts", layout, *sshd.launch_options(), *same, *mnist, "--train-url", str(out),
                         env=env, timeout=300)
        assert job.code == 0, job.output
        assert "[rank 0 127.0.0.2] epoch 1/1" in job.stdout  # only rank 0 prints; prefixed with its host
        assert "3 ranks on 2 hosts" in job.stderr
        ring_table = job.stderr[job.stderr.index("3 ranks on 2 hosts"):].splitlines()[2:5]
        on_first = int(layout[10])
        assert [line.split()[2] for line in ring_table] == ["127.0.0.2"] * on_first + ["127.0.0.3"] * (3 - on_first)
        got, want = params(out), params(tmp_path / "one")
        for name in want:
            assert torch.allclose(got[name], want[name], atol=tolerance, rtol=0), (layout, env, name)


def broadcast_over_a_slow_link(netns_hosts, nbytes: int, stall_timeout_s: float, first_slots: int = 1,
                               env: dict[str, str] | None = None) -> Job:
    """Two hosts joined by a 100 Mbit/s link (Wi-Fi speed), ``first_slots`` ranks on the first:
    rank 0 broadcasts ``nbytes`` and its script ends at once (``last_send.py``)."""
    import netns

    hosts, server = netns_hosts
    try:
        for host in hosts:
            netns.set_rate(host, "100mbit")
        return run_launch("--hosts", f"{hosts[0].addr}:{first_slots},{hosts[1].addr}:1", *server.launch_options(),
                          "--stall-timeout", str(stall_timeout_s), str(BIN / "last_send.py"), str(nbytes), timeout=90,
                          env=env)
    finally:
        for host in hosts:
            netns.set_rate(host, None)


def test_a_rank_that_ends_right_after_sending_still_delivers_it(netns_hosts) -> None:
    """The broadcast returned on rank 0 with most of its 8 MiB still queued, and shutdown used to
    drop the queue: rank 1 waited for data that never came until the stall report aborted the job.
    The agent's torch.distributed store used to log a c10d warning ("The hostname of the client
    socket cannot be retrieved") whenever a host's address had no reverse DNS name, as these
    have none, nor do those of a LAN of Macs: one unprefixed, alarming line in every job."""
    job = broadcast_over_a_slow_link(netns_hosts, 8 << 20, stall_timeout_s=5)
    assert job.code == 0, job.output
    assert "[rank 1 " in job.stdout and "received every byte" in job.stdout, job.output
    assert "c10d" not in job.stderr and "cannot be retrieved" not in job.stderr, job.stderr


def test_a_long_exchange_over_a_slow_link_is_not_a_stall(netns_hosts) -> None:
    """48 MiB take about 4 s at 100 Mbit/s, far over the 1 s stall timeout, with data arriving
    all along: the stall report used to name rank 0 ("made no progress") and abort the job at
    2 s, as it would a big model's first broadcast over Wi-Fi at the default 60 s. Nor may the
    launcher stay silent all that time. Rank 0, its script over, waits for its data to reach
    rank 1 as rank 1 waits to receive it: the pace line used to name rank 0 as the slow Mac,
    where the link sets the pace."""
    job = broadcast_over_a_slow_link(netns_hosts, 48 << 20, stall_timeout_s=1)
    assert job.code == 0, job.output
    assert "received every byte" in job.stdout and "stall" not in job.stderr, job.output
    assert "macfleet: communication sets the pace" in job.stderr, job.stderr
    # a silent terminal looks like a hang: the launcher says what goes on, once a stall timeout
    notes = re.findall(r"^macfleet: rank 1 has been in broadcast \(op 2\) for (\d+) s, and data keeps arriving",
                       job.stderr, re.M)
    assert len(notes) >= 2 and notes == sorted(notes, key=int), job.stderr


def test_a_rank_that_passes_a_broadcast_on_over_a_slow_link_does_not_set_the_pace(netns_hosts) -> None:
    """Over sockets alone, ranks 0 and 1 on the first host and rank 2 on the second: rank 1 gets
    the data at once and passes it on over the slow link, and its script ends while most of it is
    still queued. Delivering it took rank 1's last seconds, and the pace line named rank 1 the
    slow Mac, where the link sets the pace."""
    job = broadcast_over_a_slow_link(netns_hosts, 24 << 20, stall_timeout_s=5, first_slots=2,
                                     env={"MACFLEET_SHM": "0"})
    assert job.code == 0 and job.stdout.count("received every byte") == 2, job.output
    assert "macfleet: communication sets the pace" in job.stderr, job.stderr


def test_hosts_named_by_ipv6_addresses(netns_hosts) -> None:
    """A host list of IPv6 addresses (or names that resolve only to them): the coordinator's
    bind used to fail with ZeroMQ's "No such device", as a launcher traceback, for its sockets
    were IPv4-only and its endpoints unbracketed."""
    hosts, server = netns_hosts
    if hosts[0].addr6 is None:
        pytest.skip("no IPv6 in this kernel")
    job = run_launch("--hosts", ",".join(f"[{h.addr6}]:1" for h in hosts), *server.launch_options(),
                     str(BIN / "last_send.py"), str(1 << 20), timeout=60)
    assert job.code == 0, job.output
    assert "received every byte" in job.stdout, job.output
    ring = job.stderr[job.stderr.index("2 ranks on 2 hosts"):].splitlines()[2:4]
    assert [line.split()[2] for line in ring] == [h.addr6 for h in hosts], ring  # the data goes over IPv6
    assert [line.split()[3] for line in ring] == [h.veth for h in hosts], ring  # the interface that holds it


def test_a_name_with_both_kinds_of_address_is_reached_over_ipv4(netns_hosts, tmp_path) -> None:
    """A Mac's name.local often resolves to an IPv6 address first, a link-local one, which
    names an interface of that Mac only. The ring goes over the name's IPv4 address. The names
    resolve so for the launcher alone: a private /etc/hosts, in a mount namespace of its own."""
    hosts, server = netns_hosts
    if hosts[0].addr6 is None or shutil.which("unshare") is None:
        pytest.skip("needs IPv6 and unshare(1)")
    names = ["mf-dual1", "mf-dual2"]
    table = tmp_path / "hosts"
    table.write_text("127.0.0.1 localhost\n" + "".join(f"{host.addr6} {name}\n{host.addr} {name}\n"
                                                        for host, name in zip(hosts, names, strict=True)))
    private = ["unshare", "--mount", "sh", "-c", f'mount --bind "{table}" /etc/hosts && exec "$@"', "sh"]
    order = subprocess.run([*private, "getent", "ahosts", names[0]], capture_output=True, text=True, timeout=30)
    if order.returncode != 0:
        pytest.skip(f"no private /etc/hosts here: {order.stderr.strip()}")
    if order.stdout.split()[0] != hosts[0].addr6:
        pytest.skip("this resolver lists the IPv4 address first already")
    job = run_launch("--hosts", ",".join(f"{name}:1" for name in names), *server.launch_options(),
                     str(BIN / "last_send.py"), str(1 << 20), timeout=60, prefix=private)
    assert job.code == 0, job.output
    assert "received every byte" in job.stdout, job.output
    ring = job.stderr[job.stderr.index("2 ranks on 2 hosts"):].splitlines()[2:4]
    assert [line.split()[2] for line in ring] == [host.addr for host in hosts], ring
    assert [line.split()[3] for line in ring] == [host.veth for host in hosts], ring


def blocked(netns_hosts, block: str) -> tuple[Job, str]:
    """A two-host job while the second host's firewall blocks ``block`` (``netns.firewall``):
    the job, and its report from the root cause on."""
    import netns

    hosts, server = netns_hosts
    with netns.firewall(hosts[1], block):
        job = run_launch("--hosts", f"{hosts[0].addr}:1,{hosts[1].addr}:1", *server.launch_options(),
                         "--env", "MACFLEET_CONNECT_TIMEOUT=5", "--heartbeat-timeout", "3", str(BIN / "last_send.py"),
                         "4096", timeout=120)
    assert job.code != 0
    return job, job.stderr[job.stderr.index("root cause"):]


def test_a_firewall_on_a_rank_s_host_is_named_in_seconds(netns_hosts) -> None:
    """The second host drops connections to its data ports, as macOS's firewall does for a
    Python nobody allowed to accept them (on a Mac reached over ssh, nobody can). The ring
    never connects: the job used to wait the 600 s collective timeout and then ask whether
    rank 1 was "stuck or behind"; now the rank that cannot connect says so, and what to do."""
    job, report = blocked(netns_hosts, "incoming")
    assert f"rank 0 cannot connect to rank 1 at {netns_hosts[0][1].addr} port" in report, report
    assert "for 5 s: connection attempts get no answer" in report and "Firewall" in report, report
    assert job.seconds < 30


def test_a_firewall_on_the_launcher_s_mac_is_named(netns_hosts) -> None:
    """The other side of it: the second host cannot connect to the launcher. Its agent used to
    say only "no word from the launcher"."""
    job, report = blocked(netns_hosts, "launcher")
    assert f"agent on {netns_hosts[0][1].addr}: cannot reach the launcher" in report, report
    assert "for 3 s: connection attempts get no answer" in report and "Firewall" in report, report
    assert job.seconds < 20


def test_the_launcher_suggests_shares_for_macs_of_different_speeds(sshd, tmp_path) -> None:
    """Rank 2, alone on its host, works four times as long per step as ranks 0 and 1: the last
    lines name it and suggest shares in proportion to the speeds measured (about 4:4:1). The
    timeline (written on the launching machine) has every rank, named with its host, and shows
    the others waiting for rank 2 at the end of every backward."""
    timeline = tmp_path / "timeline.json"
    job = run_launch("--hosts", "127.0.0.2:2,127.0.0.3:1", *sshd.launch_options(), "--timeline", str(timeline),
                     str(BIN / "pace.py"), "2", "dp", "8", timeout=120)
    assert job.code == 0, job.output
    assert "rank 2 (on 127.0.0.3) sets the pace" in job.stderr, job.stderr
    found = re.search(r"shares=\[(\d+), (\d+), (\d+)\] would give each rank work in proportion", job.stderr)
    assert found, job.stderr
    first, second, slow = map(int, found.groups())
    assert first == second and 3.0 <= first / slow <= 4.5, job.stderr
    events = json.loads(timeline.read_text())
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {0: "rank 0 (127.0.0.2)", 1: "rank 1 (127.0.0.2)", 2: "rank 2 (127.0.0.3)"}
    waits = {r: sorted(e["dur"] for e in events if e["pid"] == r and e["name"] == "waiting for gradients")
             for r in names}
    assert all(len(w) == 8 for w in waits.values()), waits
    assert waits[2][4] * 10 < min(waits[0][4], waits[1][4]), waits  # 0.3 s a step for the others, none for it


def test_an_unmodified_ddp_gloo_script_runs_across_hosts(sshd) -> None:
    job = run_launch("--hosts", "127.0.0.2:2,127.0.0.3:1", *sshd.launch_options(), str(BIN / "ddp_gloo.py"))
    assert job.code == 0, job.output
    for rank, local in ((0, "0/2"), (1, "1/2"), (2, "0/1")):
        assert f"ddp ok rank {rank} of 3 local {local}" in job.stdout


def test_ranks_that_split_their_data_by_the_rank_on_their_mac_are_named(sshd) -> None:
    """A stream split into a part per rank by ``macfleet.local_rank()``, where ``rank()`` was
    meant: on two Macs of two ranks, ranks 0 and 2 read part 0, ranks 1 and 3 part 1, and parts
    2 and 3 nobody. It trains without an error; the launcher names the two pairs."""
    job = run_launch("--hosts", "127.0.0.2:2,127.0.0.3:2", *sshd.launch_options(), str(BIN / "same_batches.py"),
                     "by-local-rank", timeout=60)
    assert job.code == 0 and job.stdout.count(" trained") == 4, job.output
    warned = [line for line in job.stderr.splitlines() if "train on the same batches" in line]
    assert len(warned) == 1, job.stderr
    assert warned[0].startswith("macfleet: warning: some ranks train on the same batches: the first 3 training "
                                "forwards of ranks 0, 2 and of ranks 1, 3 got the same inputs (each group its own)")
    assert "not by macfleet.local_rank()" in warned[0]


def test_the_torch_distributed_store_outlives_rank_0(sshd) -> None:
    """Rank 0 leaves at once; the rank on the other host still reaches the store afterwards."""
    job = run_launch("--hosts", "127.0.0.2:1,127.0.0.3:1", *sshd.launch_options(), str(BIN / "store_after_rank0.py"),
                     timeout=60)
    assert job.code == 0, job.output
    assert "[rank 1 127.0.0.3] store served rank 1 after rank 0 left: yes" in job.stdout, job.output


def test_hosts_with_different_versions_are_refused(sshd, tmp_path) -> None:
    # On "host" 127.0.0.3 the interpreter sees a different torch distribution (a dist-info that
    # shadows the real one), as a Mac with another torch install would.
    fake = tmp_path / "shadow" / "torch-1.0.0.dist-info"
    fake.mkdir(parents=True)
    (fake / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 1.0.0\n")
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\ncase \"$SSH_CONNECTION\" in *127.0.0.3*) "
                      f"export PYTHONPATH={fake.parent};; esac\nexec {os.sys.executable} \"$@\"\n")
    python.chmod(0o755)
    job = run_launch("--hosts", "127.0.0.2:1,127.0.0.3:1", *sshd.launch_options(), "--python", str(python),
                     BEHAVE, "-1", "none", timeout=60)
    assert job.code != 0
    table = job.stderr[job.stderr.index("disagree on versions"):]
    assert "127.0.0.3" in table and "1.0.0 <-" in table
    assert "ready" not in job.stdout  # no rank was started
    ok = run_launch("--hosts", "127.0.0.2:1,127.0.0.3:1", *sshd.launch_options(), "--python", str(python),
                    "--allow-version-mismatch", BEHAVE, "-1", "none", timeout=60)
    assert ok.code == 0, ok.output


def python_with_other_disk(tmp_path: Path, host: str, mount: str) -> Path:
    """A Python that on ``host`` runs in a mount namespace of its own, after ``mount MOUNT``
    there: that "Mac" sees other files at the same paths, as a Mac with its own disk would."""
    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("needs unshare -m (root) for a host with files of its own")
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\ncase \"$SSH_CONNECTION\" in *{host}*) exec unshare -m --propagation private "
                      f"sh -c 'mount {mount} && exec \"$@\"' sh {os.sys.executable} \"$@\";; esac\n"
                      f"exec {os.sys.executable} \"$@\"\n")
    python.chmod(0o755)
    return python


def two_versions(tmp_path: Path) -> tuple[Path, Path]:
    """A script, and an older copy of it."""
    (tmp_path / "code").mkdir()
    script, old = tmp_path / "code" / "train.py", tmp_path / "old.py"
    for path, version in ((script, "new"), (old, "old")):
        path.write_text(f"import macfleet\nmacfleet.init()\nprint('{version} version', flush=True)\n"
                        f"macfleet.shutdown()\n")
    return script, old


def one_host_apart(sshd, tmp_path: Path, mount: str, *run: str, what: str) -> tuple[Job, str]:
    """``run`` on three hosts of a rank each, where 127.0.0.3 (rank 1) has ``mount`` on a disk of
    its own. The job must pass, and each rank print which ``what`` it ran: "new" on the others;
    rank 1's is returned with the job."""
    python = python_with_other_disk(tmp_path, "127.0.0.3", mount)
    job = run_launch("--hosts", "127.0.0.2:1,127.0.0.3:1,127.0.0.1:1", *sshd.launch_options(), "--python", str(python),
                     *run, timeout=60)
    assert job.code == 0, job.output
    ran = dict(re.findall(rf"\[rank (\d) \S+\] (\w+) {what}", job.stdout))
    assert sorted(ran) == ["0", "1", "2"] and ran["0"] == ran["2"] == "new", job.stdout
    return job, ran["1"]


def test_a_script_that_differs_on_one_host_is_named_and_each_host_runs_its_own(sshd, tmp_path) -> None:
    """With no disk the Macs share, each runs its own copy of the script, and an edit not
    copied to one of them makes its ranks run other code, with nothing to show for it. On
    127.0.0.3 an older copy is at the script's path: the launcher names that host, by the
    digest of its copy, and the job runs as written."""
    script, old = two_versions(tmp_path)
    job, ran = one_host_apart(sshd, tmp_path, f"--bind {old} {script}", str(script), what="version")
    assert ran == "old"
    table = job.stderr[job.stderr.index(f"warning: {script} is not the same on every host"):]
    marked = [line.split()[0] for line in table.splitlines() if line.endswith("<-")]
    assert marked == ["127.0.0.3"], table


@pytest.mark.parametrize("how", ["script", "-m"])
def test_a_module_of_the_script_that_differs_on_one_host_is_named(sshd, tmp_path, how: str) -> None:
    """The script is the same everywhere, but the model.py beside it that it imports was edited
    on one Mac alone (on 127.0.0.3 an older copy): each host's first rank sends the digests of
    the script's own modules it imported at init, and the launcher names the odd copy. With
    ``-m train`` (from --cwd), which the agents do not compare, train.py itself is the older one
    there, and is named as one of those modules."""
    (tmp_path / "code").mkdir()
    script, model = tmp_path / "code" / "train.py", tmp_path / "code" / "model.py"
    script.write_text("import macfleet\nimport model\nmacfleet.init()\nprint(model.VERSION, 'model', flush=True)\n"
                      "macfleet.shutdown()\n")
    model.write_text("VERSION = 'new'\n")
    odd, old = (model, "VERSION = 'older'\n") if how == "script" else \
        (script, "import macfleet\nimport model\nmacfleet.init()\nprint('older model', flush=True)\nmacfleet.shutdown()\n")
    (tmp_path / "old.py").write_text(old)  # another size: a bytecode cache that another host wrote is not taken for it
    run = [str(script)] if how == "script" else ["--cwd", str(script.parent), "-m", "train"]
    job, ran = one_host_apart(sshd, tmp_path, f"--bind {tmp_path / 'old.py'} {odd}", *run, what="model")
    assert ran == "older"
    assert "warning: modules of the script are not the same on every host (edits not copied to every Mac?), and " \
           f"each host runs its own: {odd.name} on 127.0.0.3\n" in job.stderr, job.stderr
    assert "is not the same on every host (an edit" not in job.stderr, job.stderr  # not the agents' warning


def test_a_module_imported_after_init_that_differs_on_one_host_is_named(sshd, tmp_path) -> None:
    """A script that calls macfleet.init() first and imports its model after it: the modules it
    had imported by init were all that was compared, so an older model.py on one Mac went
    unseen. Each host's first rank now reports at its first training step those imported since,
    and the launcher names the odd copy; a module that rank 0 alone imports (its logging's) is no
    difference, though only its host has it imported."""
    (tmp_path / "code").mkdir()
    script, model = tmp_path / "code" / "train.py", tmp_path / "code" / "model.py"
    script.write_text("import torch\nimport macfleet\nmacfleet.init()\nimport model\n"
                      "if macfleet.rank() == 0:\n    import logs\n"
                      "net = macfleet.DataParallel(torch.nn.Linear(2, 1))\nnet(torch.ones(1, 2)).sum().backward()\n"
                      "print(model.VERSION, 'model', flush=True)\nmacfleet.shutdown()\n")
    model.write_text("VERSION = 'new'\n")
    (tmp_path / "code" / "logs.py").write_text("")
    (tmp_path / "old.py").write_text("VERSION = 'older'\n")
    job, ran = one_host_apart(sshd, tmp_path, f"--bind {tmp_path / 'old.py'} {model}", str(script), what="model")
    assert ran == "older"
    told = [line for line in job.stderr.splitlines() if "are not the same on every host" in line]
    assert told == ["macfleet: warning: modules that the script imported after macfleet.init() are not the same on "
                    "every host (edits not copied to every Mac?), and each host runs its own: model.py on 127.0.0.3"], \
        job.stderr


def test_a_script_missing_on_a_host_is_named_before_any_rank_starts(sshd, tmp_path) -> None:
    """Where a Mac lacks the script, each of its ranks failed with Python's "can't open file"."""
    script, _ = two_versions(tmp_path)
    python = python_with_other_disk(tmp_path, "127.0.0.3", f"-t tmpfs none {script.parent}")
    job = run_launch("--hosts", "127.0.0.2:1,127.0.0.3:1", *sshd.launch_options(), "--python", str(python),
                     str(script), timeout=60)
    assert job.code != 0 and "version" not in job.stdout, job.output
    root = job.stderr[job.stderr.index("root cause"):].splitlines()[1]
    assert f"the script {script} is not on 127.0.0.3: every Mac runs its own copy" in root, root


def test_a_remote_hosts_missing_python_or_directory_is_named_as_the_root_cause(sshd, tmp_path) -> None:
    """The launching Mac cannot check them; the report said only 'exited unexpectedly (code 127)'."""
    hosts = ["--hosts", "127.0.0.2:1,127.0.0.3:1", *sshd.launch_options()]
    for option, wanted in ((["--python", str(tmp_path / "python")], f"{tmp_path / 'python'}: No such file"),
                           (["--cwd", str(tmp_path / "gone")], f"cd: {tmp_path / 'gone'}: No such file")):
        job = run_launch(*hosts, *option, BEHAVE, "-1", "none")
        assert job.code == 1, job.output
        root = job.stderr[job.stderr.index("root cause"):].splitlines()[1]
        assert wanted in root, root


def test_the_launching_machine_in_the_host_list_starts_without_ssh(sshd) -> None:
    """A hostfile lists every Mac of the cluster, the launching one too. Its agent used to be
    started over ssh to itself, which needs Remote Login and our own key on the Mac launching
    (a MacBook seldom has them): "cannot reach ... over ssh". No sshd listens on this
    machine's own address here, so only a start without ssh can work."""
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True)
    ours = [line.split()[3].split("/")[0] for line in out.stdout.splitlines()]
    if not ours:
        pytest.skip("no non-loopback IPv4 address on this machine")
    job = run_launch("--hosts", f"{ours[0]}:1,127.0.0.2:1", *sshd.launch_options(), str(BIN / "last_send.py"),
                     "4096", timeout=60)
    assert job.code == 0, job.output
    assert "[rank 1 127.0.0.2] received every byte" in job.stdout, job.output


def test_an_unreachable_host_is_reported_within_the_connect_timeout(sshd) -> None:
    job = run_launch("--hosts", "127.0.0.2:1,127.0.0.9:1", *sshd.launch_options(), "--ssh-connect-timeout", "5",
                     BEHAVE, "-1", "none", timeout=60)
    assert job.code != 0
    assert "cannot reach 127.0.0.9 over ssh" in job.stderr
    assert job.seconds < 5 + 15


def test_with_min_hosts_the_job_starts_on_the_hosts_it_can_reach(sshd) -> None:
    """A Mac asleep or off the network when the job starts: --min-hosts 2 goes on without it,
    numbering the others' ranks from 0, and says so; it runs two hosts all the same."""
    hosts = ["--hosts", "127.0.0.2:1,127.0.0.9:1,127.0.0.3:2,127.0.0.8:1", *sshd.launch_options(),
             "--ssh-connect-timeout", "5"]
    job = run_launch(*hosts, "--min-hosts", "2", BEHAVE, "-1", "env", timeout=90)
    assert job.code == 0, job.output
    assert "cannot reach 127.0.0.9 over ssh" in job.stderr and "cannot reach 127.0.0.8 over ssh" in job.stderr
    going = re.findall(r"going on without (.*): (\d) ranks on (\d) of 4 hosts \(--min-hosts 2\)", job.stderr)
    assert {host for names, _, _ in going for host in names.split(", ")} == {"127.0.0.9", "127.0.0.8"}, job.stderr
    assert going[-1][1:] == ("3", "2"), job.stderr
    seen = [(host, json.loads(text)) for host, text in re.findall(r"\[rank \d (\S+)\] ENV (.*)", job.stdout)]
    assert sorted((host, env["RANK"], env["WORLD_SIZE"]) for host, env in seen) == \
        [("127.0.0.2", "0", "3"), ("127.0.0.3", "1", "3"), ("127.0.0.3", "2", "3")], job.stdout
    # the default share is per host: the two ranks of 127.0.0.3 share its GPU, 127.0.0.2's is uncapped
    assert sorted((env["RANK"], env["MACFLEET_MEMORY_FRACTION"]) for _, env in seen) == \
        [("0", None), ("1", "0.45"), ("2", "0.45")], job.stdout
    fewer = run_launch(*hosts, "--min-hosts", "3", BEHAVE, "-1", "none", timeout=90)
    assert fewer.code != 0 and "ready" not in fewer.stdout, fewer.output
    cause = fewer.stderr[fewer.stderr.index("root cause"):]
    assert "cannot reach 127.0.0.9 over ssh" in cause or "cannot reach 127.0.0.8 over ssh" in cause, cause
    assert "hosts could be reached, fewer than --min-hosts 3" in fewer.stderr, fewer.stderr


def test_each_host_s_share_reaches_its_ranks_and_follows_the_hosts_that_run(sshd, tmp_path) -> None:
    """share= in a hostfile reaches every rank as macfleet.shares(), one per rank in rank
    order. With a Mac left out (--min-hosts), they are the other Macs' shares: a list made for
    the whole host list would not match the ranks, and the script would stop. (Only the ranks
    --show-ranks names show their output.)"""
    hostfile = tmp_path / "hosts"
    hostfile.write_text("127.0.0.2 slots=1 share=3\n127.0.0.9 slots=1 share=2\n127.0.0.3 slots=2\n")
    job = run_launch("--hostfile", str(hostfile), *sshd.launch_options(), "--ssh-connect-timeout", "5",
                     "--min-hosts", "2", "--show-ranks", "0,2,3", BEHAVE, "-1", "env", timeout=90)
    assert job.code == 0, job.output
    assert "going on without 127.0.0.9: 3 ranks on 2 of 3 hosts" in job.stderr, job.stderr
    seen = sorted((env["RANK"], env["shares"]) for env in map(json.loads, re.findall(r"\] ENV (.*)", job.stdout)))
    assert seen == [("0", [3, 1, 1]), ("2", [3, 1, 1])], job.stdout
    # --show-ranks was checked against the whole host list: rank 3 is no more, and says so
    assert "--show-ranks: no rank 3 now; showing 0, 2" in job.stderr, job.stderr


def test_a_host_cut_off_from_the_network(netns_hosts) -> None:
    import netns

    hosts, server = netns_hosts
    job = RunningJob("--hosts", f"{hosts[0].addr}:1,{hosts[1].addr}:1", *server.launch_options(),
                     "--heartbeat-timeout", "3", BEHAVE, "-1", "hang", ranks=2)
    try:
        netns.set_link(hosts[1], up=False)  # pull the cable of the second host
        code, err, seconds = job.wait(60)
        assert code != 0
        assert "sent no heartbeat for 3 s" in err
        assert seconds < 3 + 20
        assert wait_for_no_job_processes(15) == []  # the cut-off host's agent stops its ranks on its own
    finally:
        netns.set_link(hosts[1], up=True)
        job.close()


def test_a_mac_lost_mid_run_is_left_out_at_the_restart(sshd, tmp_path) -> None:
    """Its lid closed: the agent gone and its ssh refusing. The restart goes on with the
    others (--min-hosts 2), and the all-reduce sums over exactly them."""
    import sshd as helper

    third = helper.start_sshd(sshd.identity.parent, ["127.0.0.4"], port=sshd.port)
    try:
        job = RunningJob("--hosts", "127.0.0.2:1,127.0.0.3:1,127.0.0.4:1", *sshd.launch_options(), "--min-hosts", "2",
                         "--max-restarts", "1", BEHAVE, "-1", "hang-first", ranks=3)
        try:
            agent = int(subprocess.run(["ps", "-o", "ppid=", "-p", str(job.pids[2])], capture_output=True, text=True,
                                       check=True).stdout)  # rank 2's parent: the agent on 127.0.0.4
            third.stop()  # new connections refused; the agent's own session lives on until killed
            os.kill(agent, signal.SIGKILL)
            code, err, _ = job.wait(90)
        finally:
            job.close()
    finally:
        third.stop()
    assert code == 0, err
    assert "restart 1 of 1 after: the agent on 127.0.0.4 ended" in err, err
    assert "going on without 127.0.0.4: 2 ranks on 2 of 3 hosts" in err, err
    assert sorted(re.findall(r"\[rank (\d) \S+\] sum (\d) of world (\d)", job.out)) == [("0", "2", "2"), ("1", "2", "2")]
    assert job_processes() == []


def test_a_remote_agent_killed_is_not_reported_as_unreachable(sshd) -> None:
    """ssh exits with 255 when it cannot connect and when its command is killed by a signal
    (macOS ending a process when memory runs out, say). The report said "cannot reach 127.0.0.3
    over ssh: no message" for both; an agent that had said hello was reached."""
    job = RunningJob("--hosts", "127.0.0.2:1,127.0.0.3:1", *sshd.launch_options(), BEHAVE, "-1", "hang", ranks=2)
    try:
        agent = int(subprocess.run(["ps", "-o", "ppid=", "-p", str(job.pids[1])], capture_output=True, text=True,
                                   check=True).stdout)  # rank 1's parent: the agent on 127.0.0.3
        os.kill(agent, signal.SIGKILL)
        code, err, seconds = job.wait(30)
    finally:
        job.close()
    cause = err[err.index("root cause"):]
    assert code != 0
    assert "the agent on 127.0.0.3 ended without a word after it had started" in cause, cause
    assert "cannot reach" not in cause
    assert seconds < 15


def test_a_launcher_paused_for_longer_than_a_heartbeat_timeout_does_not_stop_the_job(sshd, tmp_path) -> None:
    """Ctrl-Z on the launcher, then fg 4 s later (or the launching Mac asleep for as long): the
    hosts' agents heard nothing for over a heartbeat timeout (3 s) and stopped their ranks, and
    the launcher, back, took its own pause for everyone's silence. The launcher judges lost hosts;
    an agent now waits two timeouts, and the launcher does not count time it did not run."""
    stop = tmp_path / "stop"
    proc, _ = start_launch("--hosts", "127.0.0.2:1,127.0.0.3:1", *sshd.launch_options(), "--heartbeat-timeout", "3",
                           str(BIN / "steady.py"), str(stop), "0.05", ready="ENDPOINTS", ranks=2)
    try:
        os.kill(proc.pid, signal.SIGSTOP)  # the launcher alone; the hosts' agents and ranks run on
        time.sleep(4)  # the pause itself: nothing to wait for but the clock
        os.kill(proc.pid, signal.SIGCONT)
        stop.touch()
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert out.count("RESULT wrong=0") == 2, out
    finally:
        kill_group(proc.pid)
        proc.communicate()


def test_killing_the_launcher_leaves_no_process_on_any_host(sshd) -> None:
    proc, _ = start_launch("--hosts", "127.0.0.2:2,127.0.0.3:1", *sshd.launch_options(), BEHAVE, "-1", "hang",
                           ready=" ready pid=", ranks=3, stderr=subprocess.DEVNULL)
    try:
        os.kill(proc.pid, signal.SIGKILL)  # the launcher alone: its agents and ranks must notice by themselves
        proc.wait()
        assert wait_for_no_job_processes(20) == []  # the ranks go
    finally:
        kill_group(proc.pid)
        proc.communicate()


def test_a_host_one_collective_ahead_fails_fast_naming_both(sshd) -> None:
    """Host 2's ranks took a shared tensor, a collective of their host alone, so their next
    all-reduce is numbered one ahead of host 1's. The hosts' leaders dropped each other's
    messages as stale and waited for the stall report; a message from a collective we have
    not reached is no replay, and says which it is."""
    job = run_launch("--hosts", "127.0.0.2:1,127.0.0.3:2", *sshd.launch_options(), BEHAVE, "1", "host-only",
                     timeout=60)
    assert job.code != 0 and "returned" not in job.stdout, job.output
    root = job.stderr[job.stderr.index("root cause"):]
    assert "ProtocolError" in root and "stalled:" not in root, root  # not the stall report
    op = int(re.search(r"is in collective #(\d+) \(all_reduce of 8 float32\) while rank \d waits for its data in "
                       r"#(\d+) \(all_reduce of 8 float32\)", root)[1])
    theirs, ours = behave_line('"host-only": lambda'), behave_line("agreed = {")
    made = root[root.index("last collectives of each rank"):]  # the ranks' own accounts, from their exits
    assert re.search(rf"ranks 1-2:\n(    .*\n)*    #{op - 1} shared_tensor .*\n    #{op} all_reduce .* at "
                     rf"\S*behave.py:{theirs}: ", made), made
    assert re.search(rf"rank 0:\n(    .*\n)*    #{op - 1} all_reduce .* at \S*behave.py:{ours}: ", made), made
    assert job.seconds < 20


def test_hosts_in_different_collectives_fail_fast_on_the_hosts_ring(sshd) -> None:
    """Host 2's ranks all-gather, host 1's rank all-reduces: both go on the ring of the hosts'
    leaders, whose messages say which collective they belong to."""
    job = run_launch("--hosts", "127.0.0.2:1,127.0.0.3:2", *sshd.launch_options(), BEHAVE, "1", "kind", timeout=60)
    assert job.code != 0 and "returned" not in job.stdout, job.output
    root = job.stderr[job.stderr.index("root cause"):]
    assert "ProtocolError" in root and "disagree on a collective's c" in root, root
    assert "'all_gather'" in root and "'all_reduce'" in root, root
    assert job.seconds < 20


def test_hosts_that_broadcast_from_different_sources_fail_on_the_hosts_ring(sshd) -> None:
    """Host 1's ranks broadcast from rank 0, host 2's rank from itself: each host's leader takes
    itself for the source on the leaders' ring, only sends, and kept its own tensor; the job
    ended well. The answer of the ring's last leader names the source it took."""
    job = run_launch("--hosts", "127.0.0.2:2,127.0.0.3:1", *sshd.launch_options(), BEHAVE, "2", "root", timeout=60)
    assert job.code != 0 and "finished" not in job.stdout, job.output
    cause = job.stderr[job.stderr.index("root cause"):].split("other ranks")[0]
    assert "ProtocolError" in cause and "every rank must name the same source" in cause, cause
    assert re.search(r"rank (2|0) is in broadcast of 8 float32 from rank \1 while rank (0|2) is in broadcast of 8 "
                     r"float32 from rank \2", cause), cause
    assert job.seconds < 20


def test_doctor_prints_a_table_with_every_link(sshd, tmp_path) -> None:
    out = subprocess.run([os.sys.executable, "-m", "macfleet.launcher.cli", "doctor", "--hosts", "127.0.0.2,127.0.0.3",
                          *sshd.launch_options(), "--megabytes", "8"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = {line.split()[0]: line for line in out.stdout.splitlines()[1:] if line.startswith("127.")}
    assert set(rows) == {"127.0.0.2", "127.0.0.3"}
    assert "-> 127.0.0.3:" in rows["127.0.0.2"] and "Gbit/s" in rows["127.0.0.2"] and "-> 127.0.0.2:" in rows["127.0.0.3"]
    memory = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)  # both "hosts" are this machine
    assert all(f" {memory:g} GiB " in row for row in rows.values()), rows
    assert "GiB of memory a rank" not in out.stdout  # alike: nothing to say
    bad = subprocess.run([os.sys.executable, "-m", "macfleet.launcher.cli", "doctor", "--hosts", "127.0.0.2,127.0.0.9",
                          *sshd.launch_options(), "--ssh-connect-timeout", "3"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "unreachable" in bad.stdout
    # a host that answers, with a Python that lacks what a job needs: named, before any job starts
    bare = bare_python(tmp_path)  # not the base interpreter: Debian's python3.14 package has no bin/python3
    lacking = subprocess.run([os.sys.executable, "-m", "macfleet.launcher.cli", "doctor", "--hosts", "127.0.0.2",
                              *sshd.launch_options(), "--python", bare], capture_output=True, text=True, timeout=60)
    assert lacking.returncode == 1 and f"127.0.0.2  {bare} there has no macfleet and no torch" in lacking.stdout, \
        lacking.stdout + lacking.stderr


def test_a_remote_python_without_macfleet_is_named(sshd, tmp_path) -> None:
    """The agent's own one line, through ssh and the remote shell's quoting of its command."""
    python = bare_python(tmp_path)
    job = run_launch("--hosts", "127.0.0.2:1", *sshd.launch_options(), "--python", python, BEHAVE, "-1", "none",
                     timeout=60)
    root = job.stderr[job.stderr.index("root cause"):]
    assert job.code == 1 and f"macfleet is not installed for {python} on 127.0.0.2: install it there" in root, root


def test_a_host_s_own_python_from_the_hostfile_runs_its_agent_and_ranks(sshd, tmp_path) -> None:
    """Macs set up apart (a conda environment on one, a venv on another) had one --python for
    all. A hostfile line's python=PATH is that host's; the others keep --python's. A wrong one is
    named with its host, by doctor before any job and by a job's report. A path with spaces is
    quoted on the line, as for a shell."""
    (tmp_path / "Data 2").mkdir()  # an external volume's name
    marked = tmp_path / "Data 2" / "marked-python"  # the same environment, known by what it sets
    marked.write_text(f'#!/bin/sh\nMARK=own exec {os.sys.executable} "$@"\n')
    marked.chmod(0o755)
    script = tmp_path / "which.py"
    script.write_text("import os, macfleet\nmacfleet.init()\nprint('python of', macfleet.rank(), os.environ.get('MARK'))\n")
    hostfile = tmp_path / "hosts"
    hostfile.write_text(f'127.0.0.2 slots=1 python="{marked}"\n127.0.0.3 slots=1\n')
    job = run_launch("--hostfile", str(hostfile), *sshd.launch_options(), str(script), timeout=120)
    assert job.code == 0, job.output
    assert "python of 0 own" in job.stdout and "python of 1 None" in job.stdout, job.output
    bare = bare_python(tmp_path)
    hostfile.write_text(f"127.0.0.2 slots=1\n127.0.0.3 slots=1 python={bare}\n")
    doctor = subprocess.run([os.sys.executable, "-m", "macfleet.launcher.cli", "doctor", "--hostfile", str(hostfile),
                             *sshd.launch_options()], capture_output=True, text=True, timeout=120)
    rows = {line.split()[0]: line for line in doctor.stdout.splitlines() if line.startswith("127.")}
    assert doctor.returncode == 1 and rows["127.0.0.2"].split()[1] == "ok", doctor.stdout + doctor.stderr
    assert f"{bare} there has no macfleet and no torch" in rows["127.0.0.3"], doctor.stdout
    job = run_launch("--hostfile", str(hostfile), *sshd.launch_options(), str(script), timeout=60)
    root = job.stderr[job.stderr.index("root cause"):]
    assert job.code == 1 and f"macfleet is not installed for {bare} on 127.0.0.3" in root, root
    assert "python=PATH on its hostfile line" in root, root


def test_doctor_names_the_interface_each_host_trains_over(netns_hosts) -> None:
    hosts, server = netns_hosts
    out = subprocess.run([os.sys.executable, "-m", "macfleet.launcher.cli", "doctor", "--hosts",
                          ",".join(h.addr for h in hosts), *server.launch_options(), "--megabytes", "8"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    for host in hosts:
        row = next(line for line in out.stdout.splitlines() if line.startswith(host.addr + " "))
        assert f" {host.addr} on {host.veth} " in row, row


def test_collectives_across_network_namespaces(netns_hosts, tmp_path) -> None:
    """Each "host" has its own network stack; traffic crosses real veth links and a bridge."""
    hosts, server = netns_hosts
    # --device cpu: the table's device column is then known wherever the suite runs (auto
    # picks cuda on the device machine)
    job = run_launch("--hosts", f"{hosts[0].addr}:2,{hosts[1].addr}:1", "--device", "cpu", *server.launch_options(),
                     str(BIN / "oracle.py"), str(STEPS), str(tmp_path / "params.pt"), timeout=120)
    assert job.code == 0, job.output
    ring = job.stderr[job.stderr.index("3 ranks on 2 hosts"):].splitlines()[2:5]
    assert [line.split()[2] for line in ring] == [hosts[0].addr, hosts[0].addr, hosts[1].addr]
    assert [line.split()[3] for line in ring] == [hosts[0].veth, hosts[0].veth, hosts[1].veth]  # the link
    assert [line.split()[4] for line in ring] == ["cpu"] * 3  # each rank's device, as it registered
    got, want = torch.load(tmp_path / "params.pt"), reference_parameters()
    for name in want:
        assert torch.allclose(got[name], want[name], atol=1e-5, rtol=0), name


@contextmanager
def cable_ring(netns_hosts, count: int) -> Iterator[tuple[list, list]]:
    """``count`` namespace hosts (the fixture's two and more, each with an sshd) in a ring of
    veth cables, a /30 each: cable k joins host k (its ``a`` end) to host k + 1. Nothing routes
    between cables. Yields (hosts, cables); removes what it added."""
    import netns
    import sshd as helper

    hosts, server = netns_hosts
    more = [netns.add(i, ipv6=hosts[0].addr6 is not None) for i in range(3, count + 1)]
    servers, cables = [], []
    try:
        servers += [helper.start_sshd(server.identity.parent, [h.addr], port=server.port, prefix=h.exec_prefix())
                    for h in more]
        ring = [*hosts, *more]
        cables += [netns.cable(ring[k], ring[(k + 1) % count], k + 1) for k in range(count)]
        yield ring, cables
    finally:
        for sshd_server in servers:
            sshd_server.stop()
        for c in cables:
            netns.uncable(c)
        for i in range(3, count + 1):
            netns.remove(i)


@pytest.mark.parametrize("hostfile_format", ["macfleet", "mlx"])
def test_a_ring_of_macs_cabled_to_each_neighbour_trains_over_the_cables(netns_hosts, tmp_path,
                                                                      hostfile_format: str) -> None:
    """Three Macs in a ring of Thunderbolt cables, each cable with a subnet of its own (MLX's
    setup): each Mac has two data addresses, and reaches a neighbour only at the address on
    the cable between them. Each rank sends to both neighbours, each over their cable, and
    nothing of the data goes over the network the launcher reaches them by (the bridge).
    The hostfile lists both addresses of each Mac (ours), or, as mlx.distributed_config writes
    it (JSON), only the one its previous neighbour connects to: each agent adds its own end of
    the cable to the next."""
    import netns

    server = netns_hosts[1]
    with cable_ring(netns_hosts, 3) as (ring, cables):
        hostfile = tmp_path / "hosts"
        if hostfile_format == "mlx":
            addrs = [[cables[k - 1].b_addr, cables[k].a_addr] for k in range(3)]  # listed, then added by the agent
            ends = [[(cables[k - 1].b, cables[k - 1].b_dev), (cables[k].a, cables[k].a_dev)] for k in range(3)]
            hostfile.write_text(json.dumps([{"ssh": h.addr, "ips": a[:1]} for h, a in zip(ring, addrs, strict=True)]))
        else:
            # each Mac's main address is on the cable to the next, except the second's: the order
            # of its addresses must not matter
            addrs = [[cables[k].a_addr, cables[k - 1].b_addr] for k in range(3)]
            ends = [[(cables[k].a, cables[k].a_dev), (cables[k - 1].b, cables[k - 1].b_dev)] for k in range(3)]
            addrs[1].reverse()
            ends[1].reverse()
            hostfile.write_text("".join(f"{h.addr} slots=1 addr={','.join(a)}\n" for h, a in zip(ring, addrs,
                                                                                                strict=True)))
        watched = [*(end for pair in ends for end in pair), *((h, h.veth) for h in ring)]
        sent = {dev: netns.tx_bytes(h, dev) for h, dev in watched}
        numel = 4 << 20  # 16 MiB of float32: each Mac sends about 5 MiB each way round the ring
        job = run_cases(tmp_path, 3, [
            {"kind": "all_reduce", "dtype": "float32", "numel": numel, "seed": 5, "op": "sum", "src": 0},
            {"kind": "broadcast", "dtype": "int32", "numel": numel // 4, "seed": 6, "op": "sum", "src": 2}],
            hosts=["--hostfile", str(hostfile), *server.launch_options()])
        moved = {dev: netns.tx_bytes(h, dev) - sent[dev] for h, dev in watched}
        # doctor and bench find the cables as the job above did, whichever format listed them: one
        # format each is enough. doctor measures each ring link over its cable, and shows every
        # address on its link (the agents add the mlx format's missing ends, as for the job).
        doctor = subprocess.run([os.sys.executable, "-m", "macfleet.launcher.cli", "doctor", "--hostfile", str(hostfile),
                                 *server.launch_options(), "--megabytes", "4"], capture_output=True, text=True,
                                timeout=120) if hostfile_format == "mlx" else None
        # gloo cannot run here (it connects every rank to every other, over one interface): bench times
        # macfleet's alone, and says why, instead of waiting for gloo's connections for 30 minutes.
        bench = subprocess.run([os.sys.executable, "-m", "macfleet.launcher.cli", "bench", "allreduce", "--hostfile",
                                str(hostfile), *server.launch_options(), "--sizes", "4K,1M", "--budget", "0.1"],
                               capture_output=True, text=True, timeout=120) if hostfile_format == "macfleet" else None
    table = job.stderr[job.stderr.index("3 ranks on 3 hosts"):].splitlines()[2:5]
    assert [line.split()[2] for line in table] == [",".join(a) for a in addrs], table
    assert "10.77.0.2, 10.77.0.3, 10.77.0.4 have one address per cable: macfleet's ring sends over each; " \
           "torch.distributed (gloo)" in job.stderr, job.stderr
    assert [line.split()[3] for line in table] == [",".join(dev for _, dev in e) for e in ends], table
    for pair in ends:
        for _, dev in pair:
            assert moved[dev] > 4 << 20, moved  # both cables of every Mac carried its share
    for h in ring:
        assert moved[h.veth] < 1 << 20, moved  # control messages only
    if doctor is not None:
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr
        for h, a, e in zip(ring, addrs, ends, strict=True):
            row = next(line for line in doctor.stdout.splitlines() if line.startswith(h.addr + " "))
            assert f" {','.join(a)} on {','.join(dev for _, dev in e)} " in row, row
        return
    assert bench is not None and bench.returncode == 0, bench.stdout + bench.stderr
    assert "timing macfleet alone: 10.77.0.2, 10.77.0.3, 10.77.0.4 have one address per cable" in bench.stderr, \
        bench.stderr
    table = bench.stdout[bench.stdout.index("all-reduce, 3 ranks"):].splitlines()
    assert "gloo" not in "\n".join(table) and [row.split()[0] for row in table[2:]] == ["4K", "1M"], bench.stdout


def test_macs_listed_out_of_cabling_order_are_named_with_the_order_that_works(netns_hosts, tmp_path) -> None:
    """Four Macs in a ring of cables, listed A, C, B, D: A and C have no cable between them, nor
    B and D. Every rank waited for its connect timeout, and said only that it could not
    connect. The launcher now refuses the list before any rank starts, naming the pairs and the
    order that works; doctor marks the hosts and suggests the order."""
    server = netns_hosts[1]
    with cable_ring(netns_hosts, 4) as (ring, cables):
        hostfile = tmp_path / "hosts"
        listed = [0, 2, 1, 3]
        hostfile.write_text("".join(f"{ring[k].addr} addr={cables[k].a_addr},{cables[k - 1].b_addr}\n" for k in listed))
        job = run_launch("--hostfile", str(hostfile), *server.launch_options(), BEHAVE, "-1", "none", timeout=60)
        doctor = subprocess.run([os.sys.executable, "-m", "macfleet.launcher.cli", "doctor", "--hostfile", str(hostfile),
                                 *server.launch_options()], capture_output=True, text=True, timeout=120)
    a, b, c, d = (h.addr for h in ring)
    assert job.code != 0 and "ready" not in job.stdout, job.output  # no rank started
    cause = job.stderr[job.stderr.index("root cause"):]
    assert f"no cable joins hosts next to each other in the host list ({a} and {c}; {b} and {d}: no subnet holds a " \
           f"data address of each)" in cause, cause
    assert f"list them in cabling order: {a}, {b}, {c}, {d}" in cause, cause
    # doctor says the same, in its table and its suggestion
    rows = {line.split()[0]: line for line in doctor.stdout.splitlines() if line.startswith("10.77.")}
    assert rows[a].endswith(f"!! no cable to {c}") and rows[b].endswith(f"!! no cable to {d}"), doctor.stdout
    assert f"suggestion: list the hosts in cabling order: {a}, {b}, {c}, {d}" in doctor.stdout, doctor.stdout
    assert doctor.returncode == 1


def test_a_cwd_and_python_in_the_home_directory_are_each_host_s_own(sshd) -> None:
    """Macs whose users have different names: ``--cwd '~/proj' --python '~/venv/bin/python'``
    (quoted) is each host's home. The launcher made an absolute path of it ("/here/~/proj"),
    and quoted it for the remote shell, which then did not expand it either. Here every host's
    home is the same one, so the test can only show that the shells and the agents expand it
    (this machine's launching host, 127.0.0.1, without ssh; the others through ssh)."""
    import sys
    import uuid

    name = f".macfleet-test-{uuid.uuid4().hex[:8]}"
    home = Path.home() / name
    home.mkdir()
    try:
        shutil.copy(BEHAVE, home / "behave.py")
        python = home / "python"  # a program at a path that only exists from the home directory
        python.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
        python.chmod(0o755)
        job = run_launch("--hosts", "127.0.0.1:1,127.0.0.2:1,127.0.0.3:1", *sshd.launch_options(),
                         "--cwd", f"~/{name}", "--python", f"~/{name}/python", "behave.py", "-1", "env",
                         cwd=str(home))
        assert job.code == 0, job.output
        seen = [json.loads(line.split(" ENV ", 1)[1]) for line in job.stdout.splitlines() if " ENV " in line]
        assert sorted(fields["RANK"] for fields in seen) == ["0", "1", "2"], job.output
        assert all(fields["cwd"] == str(home) for fields in seen), seen
    finally:
        shutil.rmtree(home)


@pytest.fixture(scope="module")
def remote_job(sshd, tmp_path_factory) -> tuple[Job, Path]:
    """A job of a rank on each of two hosts, given an environment, a --cwd (returned) and a
    --log-dir under it; each rank prints the environment it sees."""
    cwd = tmp_path_factory.mktemp("remote-cwd")
    job = run_launch("--hosts", "127.0.0.2:1,127.0.0.3:1", *sshd.launch_options(), "--env", "EXTRA_ONE=a b'c",
                     "--cwd", str(cwd), "--memory-fraction", "0.3", "--log-dir", "logs", BEHAVE, "-1", "env",
                     env={"MACFLEET_TEST_FORWARDED": "yes"})
    return job, cwd


def test_environment_and_working_directory_reach_remote_ranks(remote_job) -> None:
    job, cwd = remote_job
    assert job.code == 0, job.output
    seen = [json.loads(line.split(" ENV ", 1)[1]) for line in job.stdout.splitlines() if " ENV " in line]
    assert len(seen) == 2
    for fields in seen:
        assert fields["MACFLEET_TEST_FORWARDED"] == "yes"  # MACFLEET_* travels to remote hosts
        assert fields["EXTRA_ONE"] == "a b'c"  # --env, quoted safely through the remote shell
        assert fields["cwd"] == str(cwd)
        assert fields["MACFLEET_JOB_SECRET"] is None
        # a share given is taken as given, though each rank is alone on its host (and GPU)
        assert fields["MACFLEET_MEMORY_FRACTION"] == fields["PYTORCH_MPS_HIGH_WATERMARK_RATIO"] == "0.3"
        assert fields["rings"] == [[0, 1]]  # one rank per host: the hosts' ring alone, not a second of all ranks


def test_lines_printed_on_two_hosts_at_once_arrive_whole(sshd) -> None:
    """Two ranks on each of two hosts print at once. Forwarding a line in the pieces print()
    writes it in let another rank's line land between its text and its newline; so did ssh,
    whose packets need not end at a line's end, while the agents' stdout went straight to the
    launcher's (CI: '[rank 1 127.0.0.2] chatter 1 [rank 3 127.0.0.3] chatter 3 8...')."""
    job = run_launch("--hosts", "127.0.0.2:2,127.0.0.3:2", *sshd.launch_options(), str(BIN / "chatter.py"), "2000",
                     timeout=120)
    assert job.code == 0, job.output
    for rank, host in ((0, "127.0.0.2"), (1, "127.0.0.2"), (2, "127.0.0.3"), (3, "127.0.0.3")):
        got = [line for line in job.stdout.splitlines() if line.startswith(f"[rank {rank} {host}] ")]
        wanted = [f"[rank {rank} {host}] chatter {rank} {i} {'.' * 100}" for i in range(2000)]
        assert got == wanted, [g for g, w in zip(got, wanted) if g != w][:2] or (len(got), len(wanted))
    assert len(job.stdout.splitlines()) == 8000, job.stdout[:2000]


def test_a_job_whose_stdout_reader_has_gone_ends_quietly_across_hosts(sshd) -> None:
    """``macfleet launch --hosts ... | head``: the job ran to its end and exited 0, but each
    remote agent, whose stdout (its ssh channel) had been closed, printed a BrokenPipeError as
    it exited ("Exception ignored in: <stdout>"), at the end of a job in which nothing failed."""
    read, write = os.pipe()
    os.close(read)  # gone before the first line
    proc = subprocess.Popen(launch_command("--hosts", "127.0.0.2:1,127.0.0.3:1", *sshd.launch_options(),
                                           str(BIN / "reader_gone.py"), "stdout"),
                            stdout=write, stderr=subprocess.PIPE, text=True, start_new_session=True)
    os.close(write)
    try:
        _, err = proc.communicate(timeout=90)
    finally:
        kill_group(proc.pid)
    assert proc.returncode == 0 and err.count("finished") == 2, (proc.returncode, err)
    assert "Exception ignored" not in err and "BrokenPipeError" not in err, err


def test_an_output_with_no_room_left_is_said_once_across_hosts(sshd) -> None:
    """The launcher's stdout on a full disk (/dev/full), ranks on this Mac and on two others:
    the local agent and the launcher's relay of the remote agents' output both meet it, and
    the user is told once, not once by each."""
    with open("/dev/full", "wb") as full:
        proc = subprocess.Popen(launch_command("--hosts", "127.0.0.1:1,127.0.0.2:1,127.0.0.3:1", *sshd.launch_options(),
                                               str(BIN / "chatter.py"), "200"),
                                stdout=full, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=90)
    finally:
        kill_group(proc.pid)
    assert proc.returncode == 0, err
    assert err.count("cannot write the ranks' output (No space left on device)") == 1, err


def test_remote_ranks_write_their_logs_on_their_host(sshd, remote_job, tmp_path) -> None:
    """Each agent writes its ranks' logs under --cwd on its own host (here one file system),
    and an agent that cannot says why as the root cause."""
    job, cwd = remote_job
    assert job.code == 0, job.output
    for rank, host in ((0, "127.0.0.2"), (1, "127.0.0.3")):
        log = (cwd / "logs" / f"rank-{rank}.log").read_text()
        assert f": rank {rank} on {host}, " in log.splitlines()[0] and "ready pid=" in log, log
    assert "also in" in job.stderr and "on its host" in job.stderr
    hosts = ["--hosts", "127.0.0.2:1,127.0.0.3:1", *sshd.launch_options(), "--cwd", str(tmp_path)]
    job = run_launch(*hosts, "--log-dir", "/proc/none", BEHAVE, "-1", "none")
    assert job.code == 1, job.output
    root = job.stderr[job.stderr.index("root cause"):]
    assert re.search(r"macfleet agent on 127\.0\.0\.[23]: cannot write rank logs in /proc/none", root), root
