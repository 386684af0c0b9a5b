"""The pieces that need no job: environment contract, wire format, host lists, sampler, dtypes."""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import ctypes
import dataclasses
import functools
import gc
import gzip
import importlib.util
import json
import math
import os
import pty
import re
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
import warnings
from typing import Any, Iterator

import msgpack
import pytest
import torch
import zmq
from hypothesis import given
from hypothesis import strategies as st

from conftest import BIN, MNIST, write_idx
from macfleet import ConfigError, hostops, netaddr, whereabouts, wire
from macfleet.backends import CudaDevice, Device, MpsDevice, PolledEvent, check_tensor
from macfleet.env import WorkerEnv
from macfleet.launcher.agreement import odd_copies, same_batches
from macfleet.launcher.hosts import parse_hostfile, parse_hosts
from macfleet.launcher.relay import Output, Relay, Screen
from macfleet.launcher.report import pace_report, stood_by_report
from macfleet.launcher.stdin import StdinRelay
from macfleet.lines import LONGEST, pieces
from macfleet.buckets import Bucket, bucket_layout
from macfleet.checkpoint import TORCH_VERSION
from macfleet.ddp_options import input_device, to_device
from macfleet.same_model import difference, layout
from macfleet.sampler import DistributedSampler
from macfleet.transport import Channel, ChannelId, Liveness

SECRET = b"k" * 32


# -- environment contract ---------------------------------------------------------------------
def test_no_launcher_means_a_job_of_one() -> None:
    env = WorkerEnv.from_environ({})
    assert (env.rank, env.world_size, env.distributed, env.shares) == (0, 1, False, None)


def test_shares_are_one_whole_number_per_rank() -> None:
    assert WorkerEnv.from_environ({"WORLD_SIZE": "3", "MACFLEET_SHARES": "3,1,1"}).shares == (3, 1, 1)
    for bad in ("3,1", "3,0,1", "3,x,1", "3,1,1,"):
        with pytest.raises(ConfigError, match=r"MACFLEET_SHARES=.* must be 3 whole numbers above 0, one per rank"):
            WorkerEnv.from_environ({"WORLD_SIZE": "3", "MACFLEET_SHARES": bad})


def test_what_the_agent_sets_over_env_is_what_launch_refuses_in_env() -> None:
    """``--env RANK=3`` or ``--env MACFLEET_DEVICE=cuda`` was dropped without a word: the agent
    sets those for each rank over --env. Every variable it sets so is refused (AGENT_SETS), and
    none that --env can still set. (PYTHONUNBUFFERED is left out: the agent sets it to 1, and a
    script that asks for 1 gets it.)"""
    from macfleet.env import AGENT_SETS
    from macfleet.protocol import AgentSpec
    from macfleet.workers.agent import worker_env

    others = {"MACFLEET_MEMORY_FRACTION", "OMP_WAIT_POLICY", "OMP_NUM_THREADS", "COLUMNS", "LINES",
              "PYTORCH_ENABLE_MPS_FALLBACK", "PYTORCH_MPS_HIGH_WATERMARK_RATIO", "GLOO_SOCKET_IFNAME",
              "MALLOC_MMAP_THRESHOLD_", "MACFLEET_STREAMS", "MACFLEET_SCRATCH_DIR", "TRAIN_FLAG"}
    given = {name: "given" for name in {*AGENT_SETS, *others}}
    spec = AgentSpec(job_id="j", coordinator="tcp://127.0.0.1:1", secret_hex="00", host_index=0, host="mac1",
                     data_addrs=["127.0.0.1"], rank_base=2, slots=2, world_size=4, script="train.py", args=[],
                     env=given)
    env = worker_env(spec, 1, ["127.0.0.1"], "lo", "127.0.0.1", 29500, "/tmp/job/rank-3.json", 9)
    assert {name for name in given if env[name] != "given"} == set(AGENT_SETS)


def _mps_allocator_accepts(env: dict[str, str]) -> bool:
    """torch's check at its first MPS allocation (aten/src/ATen/mps/MPSAllocator.mm, init_allocator
    and setLowWatermarkRatio), with its defaults on a Mac's unified memory: high 1.7, low 1.4."""
    high = float(env.get("PYTORCH_MPS_HIGH_WATERMARK_RATIO", 1.7))
    low = float(env.get("PYTORCH_MPS_LOW_WATERMARK_RATIO", 1.4))
    return 0 <= high <= 2 and 0 <= low <= (high if high else 2.0)


@pytest.mark.parametrize("slots, fraction", [(1, None), (2, None), (4, None), (2, 0.5)])
@pytest.mark.parametrize("given", [{}, {"PYTORCH_MPS_HIGH_WATERMARK_RATIO": "0.3"},
                                   {"PYTORCH_MPS_HIGH_WATERMARK_RATIO": "0.0"},
                                   {"PYTORCH_MPS_HIGH_WATERMARK_RATIO": "0.9"},
                                   {"PYTORCH_MPS_LOW_WATERMARK_RATIO": "0.5"}])
def test_a_watermark_the_user_set_is_kept_and_the_other_fits_it(monkeypatch, slots: int, fraction: float | None,
                                                                given: dict[str, str]) -> None:
    """A user's own PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.3 with two ranks on a Mac got the agent's
    low watermark of 0.36 beside it, and torch stopped every rank at its first MPS allocation with
    "invalid low watermark ratio 0.36", a value the user never set; a low one of 0.5 got a high
    one of 0.45. A high one alone failed so under plain python too (torch's default low one is
    1.4). Whatever the user sets, the pair torch reads passes its check, the user's values are
    kept, and with none the cap is each rank's share. The cap the rank then sets at init is its
    share, or the user's own high watermark where that is lower (a Mac capped at 0.3 a process so
    that it never pages stays so), never a higher one, nor the high watermark the agent raised to
    meet a user's low one."""
    from macfleet.env import mps_cap
    from macfleet.protocol import AgentSpec
    from macfleet.workers.agent import worker_env

    for name in ("PYTORCH_MPS_HIGH_WATERMARK_RATIO", "PYTORCH_MPS_LOW_WATERMARK_RATIO"):
        monkeypatch.delenv(name, raising=False)  # the agent starts from its own environment
    spec = AgentSpec(job_id="j", coordinator="tcp://127.0.0.1:1", secret_hex="00", host_index=0, host="mac1",
                     data_addrs=["127.0.0.1"], rank_base=0, slots=slots, world_size=slots, script="train.py",
                     args=[], env=given, memory_fraction=fraction)
    env = worker_env(spec, 0, ["127.0.0.1"], "lo", "127.0.0.1", 29500, "/tmp/job/rank-0.json", 9)
    assert _mps_allocator_accepts(env), {k: v for k, v in env.items() if "WATERMARK" in k}
    assert all(env[name] == value for name, value in given.items())
    share = fraction or (0.9 / slots if slots > 1 else None)
    if not given and share:
        assert float(env["PYTORCH_MPS_HIGH_WATERMARK_RATIO"]) == pytest.approx(share, abs=1e-4)
    if not given and not share:  # a rank alone on its Mac: torch's own defaults
        assert "PYTORCH_MPS_HIGH_WATERMARK_RATIO" not in env and "PYTORCH_MPS_LOW_WATERMARK_RATIO" not in env
    own = float(given.get("PYTORCH_MPS_HIGH_WATERMARK_RATIO", 0))
    assert mps_cap(share, env) == (min(share, own) if share and own else share)


@pytest.mark.parametrize("agent", [True, False])
@pytest.mark.parametrize("high", [None, "0.0", "0.3", "0.45", "1.2", "2.0", "2.5", "-0.1"])
@pytest.mark.parametrize("low", [None, "0.0", "0.2", "0.5", "1.9", "2.5", "-0.1"])
def test_watermarks_torch_would_refuse_are_said_at_init_in_our_words(monkeypatch, agent: bool, high: str | None,
                                                                     low: str | None) -> None:
    """Two watermarks of the user's own that torch refuses together (a low one above the high
    one) reached the ranks as they were, and each died at its first MPS allocation with "invalid
    low watermark ratio 0.5", naming neither variable; under plain ``python`` a high one alone
    under 1.4 (torch's default low one) died so too. At init on a Mac the rank's environment
    (from the agent, or the user's own under plain python) is fitted as the agent fits it, and
    what is still refused is a ConfigError naming what the user set: exactly where torch's rule
    refuses the fitted pair. The user's values are never changed."""
    from macfleet.env import fit_mps_watermarks
    from macfleet.errors import ConfigError
    from macfleet.protocol import AgentSpec
    from macfleet.workers.agent import worker_env

    given = {name: value for name, value in (("PYTORCH_MPS_HIGH_WATERMARK_RATIO", high),
                                              ("PYTORCH_MPS_LOW_WATERMARK_RATIO", low)) if value is not None}
    for name in ("PYTORCH_MPS_HIGH_WATERMARK_RATIO", "PYTORCH_MPS_LOW_WATERMARK_RATIO"):
        monkeypatch.delenv(name, raising=False)
    if agent:  # two ranks on one Mac under macfleet launch: a share of 0.45 each
        spec = AgentSpec(job_id="j", coordinator="tcp://127.0.0.1:1", secret_hex="00", host_index=0, host="mac1",
                         data_addrs=["127.0.0.1"], rank_base=0, slots=2, world_size=2, script="train.py", args=[],
                         env=given)
        env, fraction = worker_env(spec, 0, ["127.0.0.1"], "lo", "127.0.0.1", 29500, "/tmp/r0.json", 9), 0.45
    else:  # plain `python train.py`: the user's environment as it is, one process uncapped
        env, fraction = dict(given), None
    try:
        fit_mps_watermarks(fraction, env)
        refused = None
    except ConfigError as e:
        refused = str(e)
    assert all(env[name] == value for name, value in given.items())
    assert (refused is None) == _mps_allocator_accepts(env), (env, refused)
    if refused:
        named = "LOW" if "invalid low" in refused else "HIGH"
        assert f"PYTORCH_MPS_{named}_WATERMARK_RATIO={given[f'PYTORCH_MPS_{named}_WATERMARK_RATIO']}" in refused


def test_a_world_size_from_another_launcher_is_refused_not_trained_alone() -> None:
    """Under torchrun (WORLD_SIZE set, no coordinator) each rank used to train on its shard
    alone, all_reduce returning its input unchanged."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MACFLEET_")}
    env.update(RANK="1", WORLD_SIZE="2", LOCAL_RANK="1")
    script = "import macfleet, torch; macfleet.init(); print(macfleet.all_reduce(torch.ones(1)).item())"
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and proc.stdout == "", proc.stdout
    assert "ConfigError" in proc.stderr and "macfleet launch --nproc 2" in proc.stderr, proc.stderr


def test_a_second_init_that_asks_for_another_device_is_refused() -> None:
    """It returned the first call's runtime, on the CPU, to a script that went on believing
    itself on the GPU it had asked for."""
    import macfleet

    first = macfleet.init()  # a job of one, here: no launcher
    assert macfleet.init(device="auto") is first and macfleet.init(device=first.device.kind) is first
    other = "mps" if first.device.kind != "mps" else "cpu"
    with pytest.raises(ConfigError, match=rf"^macfleet.init\(device='{other}'\): this process joined the job on "
                                          rf"{first.device.kind} at its first macfleet.init\(\)"):
        macfleet.init(device=other)


def test_a_model_on_the_meta_device_is_named_when_wrapped() -> None:
    """Built under ``torch.device("meta")`` (fast, for big models) and wrapped before it got
    memory: a job of one failed at the first forward with torch's error, a job of several in
    our broadcast, with the name "parameters". The wrapping names the tensor and what to do."""
    import macfleet

    macfleet.init()  # a job of one, here: no launcher
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
    with pytest.raises(ConfigError, match=r"^parameter '0.weight' is on the meta device.*model.to_empty\(device="):
        macfleet.DataParallel(model)
    model.to_empty(device="cpu")
    model[1].register_buffer("scale", torch.ones(1, device="meta"))
    with pytest.raises(ConfigError, match=r"^buffer '1.scale' is on the meta device"):
        macfleet.DataParallel(model)
    del model[1].scale
    assert macfleet.DataParallel(model)(torch.ones(2, 3)).shape == (2, 3)


def test_a_data_parallel_of_a_data_parallel_is_refused_when_wrapped() -> None:
    """Nor one holding a DataParallel: the outer one's forward called the inner one's, which
    refused it as wrapped again by a newer DataParallel and said to train through the newer
    one, as the script did."""
    import macfleet

    macfleet.init()  # a job of one, here: no launcher
    inner = macfleet.DataParallel(torch.nn.Linear(2, 2))
    with pytest.raises(ConfigError, match=r"is a DataParallel already.*DataParallel\(model.module\)"):
        macfleet.DataParallel(inner)
    with pytest.raises(ConfigError, match=r"holds a DataParallel \('0'\)"):
        macfleet.DataParallel(torch.nn.Sequential(inner, torch.nn.ReLU()))
    assert inner(torch.ones(1, 2)).shape == (1, 2)  # still the one that trains
    assert macfleet.DataParallel(inner.module)(torch.ones(1, 2)).shape == (1, 2)


def test_every_exported_name_resolves_and_every_lazy_name_is_exported() -> None:
    import macfleet

    assert set(macfleet._LAZY) <= set(macfleet.__all__)
    missing = [name for name in macfleet.__all__ if not hasattr(macfleet, name)]
    assert missing == []


@pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("ip") is None, reason="Linux with iproute2")
def test_interfaces_are_found_without_iproute2(monkeypatch) -> None:
    """What `ip` reports, the kernel fallback finds with no tool on PATH (a minimal container):
    the agents set GLOO_SOCKET_IFNAME from it, and gloo picks 127.0.0.1 without it."""
    out = subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True, check=True).stdout
    first: dict[tuple[str, str], str] = {}
    for fields in (line.split() for line in out.splitlines()):
        first.setdefault((fields[1], fields[2]), fields[3].split("/")[0])  # an interface's primary address
    assert first
    monkeypatch.setenv("PATH", "")
    for (iface, family), addr in first.items():
        assert netaddr.interface_of(addr) == iface
        if family == "inet":
            assert netaddr.interface_address(iface) == addr
    assert netaddr.interface_of("203.0.113.254") is None  # TEST-NET-3: held by no interface here


def test_the_launcher_knows_a_mac_s_wifi_from_its_other_links() -> None:
    """``networksetup -listallhardwareports`` as macOS prints it (and pre-10.7's AirPort): the
    launcher's table names each host's link, and warns of training over Wi-Fi, from it."""
    text = ("\nHardware Port: Ethernet\nDevice: en0\nEthernet Address: 3c:22:fb:00:00:01\n\n"
            "Hardware Port: Wi-Fi\nDevice: en1\nEthernet Address: 3c:22:fb:00:00:02\n\n"
            "Hardware Port: Thunderbolt Bridge\nDevice: bridge0\nEthernet Address: 82:0a:1b:00:00:03\n\n"
            "Hardware Port: AirPort\nDevice: en9\nEthernet Address: 00:00:00:00:00:04\n\n"
            "VLAN Configurations\n===================\n")
    ports = netaddr.hardware_ports(text)
    assert ports == {"en0": "Ethernet", "en1": "Wi-Fi", "bridge0": "Thunderbolt Bridge", "en9": "Wi-Fi"}
    assert [netaddr.over_wifi(f"{dev} ({kind})") for dev, kind in ports.items()] == [False, True, False, True]
    assert not netaddr.over_wifi(None) and not netaddr.over_wifi("eth0")
    assert netaddr.link_of("127.0.0.1") in ("lo", "lo0")  # no kind: loopback is no Wi-Fi
    assert netaddr.link_of("203.0.113.254") is None
    # a Mac with a cable to each neighbour: Wi-Fi on any of its links is flagged
    assert netaddr.over_wifi("en5 (Thunderbolt 1),en1 (Wi-Fi)") and not netaddr.over_wifi("en5,en6")


def test_no_route_on_macos_15_points_at_the_local_network_permission() -> None:
    said, mac15, iterm = "connecting fails (No route to host)", ("Darwin", "24.6.0"), {"TERM_PROGRAM": "iTerm.app"}
    advice = netaddr.local_network_advice(said, mac15, iterm, root=False)
    assert "allow iTerm in System Settings > Privacy & Security > Local Network" in advice
    assert "your editor" in netaddr.local_network_advice(said, mac15, {"TERM_PROGRAM": "vscode"}, False)
    assert "the app you launched from" in netaddr.local_network_advice(said, ("Darwin", "25.1.0"), {}, False)
    exempt = [(said, ("Darwin", "23.6.0"), iterm, False), (said, ("Linux", "6.8.0"), iterm, False),
              (said, mac15, {"TERM_PROGRAM": "Apple_Terminal"}, False), (said, mac15, {"SSH_CONNECTION": "x"}, False),
              (said, mac15, iterm, True), ("connecting fails (Connection refused)", mac15, iterm, False)]
    assert [netaddr.local_network_advice(*case) for case in exempt] == [""] * len(exempt)


def test_a_mac_finds_its_own_end_of_the_cable_to_a_neighbour() -> None:
    """macOS's ifconfig (netmasks in hex), and the subnet that holds a neighbour's address."""
    text = ("lo0: flags=8049<UP,LOOPBACK,RUNNING,MULTICAST> mtu 16384\n\tinet 127.0.0.1 netmask 0xff000000\n"
            "\tinet6 ::1 prefixlen 128\n\tinet6 fe80::1%lo0 prefixlen 64 scopeid 0x1\n"
            "en0: flags=8863<UP,BROADCAST,SMART,RUNNING,SIMPLEX,MULTICAST> mtu 1500\n"
            "\tinet 192.168.1.20 netmask 0xffffff00 broadcast 192.168.1.255\n"
            "en2: flags=8863<UP,BROADCAST,SMART,RUNNING,SIMPLEX,MULTICAST> mtu 9000\n"
            "\tinet 192.168.0.1 netmask 0xfffffffc broadcast 192.168.0.3\n"
            "en3: flags=8863<UP,BROADCAST,SMART,RUNNING,SIMPLEX,MULTICAST> mtu 9000\n"
            "\tinet6 fd00:7::1 prefixlen 64\n")
    held = netaddr.ifconfig_addresses(text)
    assert [(iface, str(net)) for iface, net in held] == [
        ("lo0", "127.0.0.1/8"), ("lo0", "::1/128"), ("lo0", "fe80::1/64"), ("en0", "192.168.1.20/24"),
        ("en2", "192.168.0.1/30"), ("en3", "fd00:7::1/64")]
    networks = [net for _, net in held]
    assert netaddr.facing("192.168.0.2", networks) == "192.168.0.1"  # the cable on en2
    assert netaddr.facing("192.168.1.7", networks) == "192.168.1.20"
    assert netaddr.facing("fd00:7::2", networks) == "fd00:7::1"
    assert netaddr.facing("192.168.0.6", networks) is None  # another cable's subnet
    assert netaddr.facing("192.168.0.1", networks) is None  # its own
    assert netaddr.facing("127.0.0.2", networks) is None  # loopback is no cable


def test_the_order_of_a_ring_of_cables_is_found_from_the_subnets() -> None:
    from macfleet.launcher import cabling

    a, b, c, d = (["10.78.4.2/30", "10.78.1.1/30"], ["10.78.1.2/30", "10.78.2.1/30"],
                  ["10.78.2.2/30", "10.78.3.1/30"], ["10.78.3.2/30", "10.78.4.1/30"])  # A-B-C-D-A
    assert cabling.gaps([a, b, c, d]) == [] and cabling.ring_order([a, b, c, d]) == [0, 1, 2, 3]
    assert cabling.gaps([a, c, b, d]) == [(0, 1), (2, 3)]
    assert cabling.ring_order([a, c, b, d]) == [0, 2, 1, 3]  # A, B, C, D; A stays first
    assert cabling.ring_order([a, b, c]) is None  # a chain: C has no cable back to A
    assert cabling.gaps([a, b]) == [] and cabling.gaps([a, c]) == [(0, 1)]  # two Macs: one cable, both ways
    assert cabling.gaps([["10.0.0.2/24"], ["10.0.0.3"]]) == []  # an address without its subnet: held by the other's
    assert cabling.out_of_order([a, c, b, d]) == cabling.OutOfOrder([(0, 1), (2, 3)], [0, 2, 1, 3])
    assert cabling.out_of_order([a, b, c, d]) is None
    assert cabling.out_of_order([["10.0.1.2/24"], ["10.0.2.2/24"]]) is None  # one address each: maybe routed


def test_a_lost_peer_is_named_once() -> None:
    """The launcher's reason for a failure mostly names the rank already: the others' PeerLost
    read "rank 0 failed: rank 0 (localhost) failed with exit code 2"."""
    from macfleet.errors import PeerLost

    for reason, said in (("rank 2 (mini) failed with exit code 1", "rank 2 (mini) failed with exit code 1"),
                         ("stalled: rank 2 made no progress", "rank 2 failed: stalled: rank 2 made no progress"),
                         ("rank 23 (mini) failed with exit code 1", "rank 2 failed: rank 23 (mini) failed with exit code 1")):
        liveness = Liveness()
        liveness.abort(reason, 2)
        with pytest.raises(PeerLost) as lost:
            liveness.check()
        assert str(lost.value) == said and lost.value.rank == 2


def test_a_peer_with_several_addresses_is_reached_at_the_one_on_a_shared_subnet() -> None:
    """One subnet per cable: of a neighbour's data addresses, the ring connects to the one this
    Mac routes to from one of its own. Here: 127.0.0.1 routes from itself, and TEST-NET-1's and
    -2's addresses from anything but 127.0.0.1 (or not at all)."""
    there, far, farther = "tcp://127.0.0.1:6", "tcp://192.0.2.1:5", "tcp://198.51.100.1:7"
    assert netaddr.nearest([far, there], ["10.9.9.9", "127.0.0.1"]) == there
    assert netaddr.nearest([there, far], ["127.0.0.1"]) == there
    assert netaddr.nearest([far], ["127.0.0.1"]) == far  # one address: the only choice, whatever routes
    assert netaddr.nearest([far, farther], ["127.0.0.1"]) is None
    # none of them shared: the rank that cannot connect says so, and how the cabling must go
    ctx = zmq.Context()
    try:
        ch = Channel(ctx, ChannelId(True, 0), 1, ["127.0.0.1", "127.0.0.2"], 1 << 20, b"k" * 32, "job", Liveness(), 5.0)
        ch.place([0, 1, 2])
        ch.connect(f"{far} {farther}")
        assert ch.peer_endpoint == far
        assert ("None of rank 2's data addresses (192.0.2.1, 198.51.100.1) is on a subnet of this Mac's "
                "(127.0.0.1, 127.0.0.2): ") in ch.unreachable(5.0)
        assert len(ch.endpoint.split()) == 2  # bound on both of its own
        ch.close()
    finally:
        ctx.destroy(linger=0)


def test_a_probe_tells_a_refused_port_from_an_open_one() -> None:
    """What the messages about unreachable peers say the connection met (a silent drop, "no
    answer", takes a firewall: test_multihost)."""
    import socket

    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        address, port = netaddr.split_endpoint(f"tcp://127.0.0.1:{listening.getsockname()[1]}")
        assert "accepts a plain TCP connection" in netaddr.probe(address, port)
    assert netaddr.probe(address, port) == "connections are refused"  # closed now
    assert netaddr.split_endpoint("tcp://[fe80::1]:5555") == ("fe80::1", 5555)


def test_environment_is_parsed_and_checked() -> None:
    env = WorkerEnv.from_environ({"RANK": "2", "WORLD_SIZE": "4", "MACFLEET_COORDINATOR": "tcp://h:1",
                                  "MACFLEET_MEMORY_FRACTION": "0.25", "MACFLEET_JOB_SECRET": "ab01"})
    assert env.distributed and env.rank == 2 and env.memory_fraction == 0.25 and env.secret == b"\xab\x01"
    for bad in ({"RANK": "x"}, {"RANK": "4", "WORLD_SIZE": "4"}, {"MACFLEET_DEVICE": "tpu"},
                {"MACFLEET_MEMORY_FRACTION": "2"}):
        with pytest.raises(ConfigError):
            WorkerEnv.from_environ(bad)


# -- wire format ------------------------------------------------------------------------------
def test_signed_headers_round_trip() -> None:
    mac, header = wire.pack(SECRET, {"op": 3, "seq": 1})
    assert wire.unpack(SECRET, mac, header) == {"v": wire.VERSION, "op": 3, "seq": 1}


def test_forged_and_tampered_headers_are_refused() -> None:
    mac, header = wire.pack(SECRET, {"op": 3})
    with pytest.raises(wire.BadMessage):
        wire.unpack(b"other" * 8, mac, header)
    with pytest.raises(wire.BadMessage):
        wire.unpack(SECRET, mac, header[:-1] + b"\x04")


@given(st.binary(max_size=64), st.binary(max_size=wire.MAX_HEADER_BYTES + 10))
def test_garbage_is_a_bad_message_never_a_crash(mac: bytes, header: bytes) -> None:
    with pytest.raises(wire.BadMessage):
        wire.unpack(SECRET, mac, header)


def test_a_validly_signed_non_map_or_wrong_version_is_refused() -> None:
    for body in (msgpack.packb([1, 2]), msgpack.packb({"v": 99})):
        with pytest.raises(wire.BadMessage):
            wire.unpack(SECRET, wire.sign(SECRET, body), body)


# -- host lists -------------------------------------------------------------------------------
def test_host_lists() -> None:
    hosts = parse_hosts("a:2,bob@b:1,c", default_slots=3)
    assert [(h.name, h.slots, h.user) for h in hosts] == [("a", 2, None), ("b", 1, "bob"), ("c", 3, None)]
    for bad in ("a:x", "a,,b", "a:0", "a b"):
        with pytest.raises(ValueError):
            parse_hosts(bad)
    for twice in ("a,a", "mini.local:2,Mini.local:2", "localhost,LocalHost", "ann@mini,ann@MINI"):
        with pytest.raises(ValueError, match="is listed twice; give it more slots instead"):
            parse_hosts(twice)
    # host names have no case, user names do; LOCALHOST went to ssh, which needs Remote Login on
    assert [h.is_local for h in parse_hosts("LocalHost:1,ann@mini:1,Ann@mini:1")] == [True, False, False]
    # --hosts "$HOSTS" with HOSTS unset ran on this Mac alone, one rank, as if no list were given
    for empty in ("", " "):
        with pytest.raises(ValueError, match="--hosts is empty"):
            parse_hosts(empty)
    assert parse_hosts("[fd00::2]:2")[0].name == "fd00::2"
    with pytest.raises(ValueError, match="link-local IPv6 address, which names an interface of this Mac only"):
        parse_hosts("[fe80::1%en0]:2")
    # without brackets, "::1" was read as the host ':' with 1 slot ("':' is not a host name")
    with pytest.raises(ValueError, match=r"entry 2: 'bob@fd00::2' looks like an IPv6 address: write it in "
                                         r"brackets, bob@\[fd00::2\], with its slots after them \(bob@\[fd00::2\]:2\)"):
        parse_hosts("a:2,bob@fd00::2")


def test_hostfile_names_the_bad_line(tmp_path) -> None:
    path = tmp_path / "hosts"

    def refused(text: str, said: str) -> None:
        path.write_text(text)
        with pytest.raises(ValueError, match=said):
            parse_hostfile(str(path))

    path.write_text("# macs\nmini1 slots=2 addr=169.254.0.2\n\nalice@mini2  # one slot\n")
    hosts = parse_hostfile(str(path))
    assert [(h.name, h.slots, h.addr, h.user) for h in hosts] == [
        ("mini1", 2, "169.254.0.2", None), ("mini2", 1, None, "alice")]
    refused("mini1 slots=2\nmini2 slots=two\n", r":2: ")
    # saved by a Windows editor: a byte-order mark first and \r\n line ends
    path.write_bytes("\ufeffmini1 slots=2\r\n# macs\r\nmini2\r\n".encode())
    assert [(h.name, h.slots) for h in parse_hostfile(str(path))] == [("mini1", 2), ("mini2", 1)]
    path.write_bytes("\ufeff".encode() + json.dumps([{"ssh": "a"}]).encode())
    assert [h.name for h in parse_hostfile(str(path))] == ["a"]
    path.write_bytes(b"mini1 slots=2\n\xff\xfe")  # a binary file given by mistake: no UnicodeDecodeError
    with pytest.raises(ValueError, match=r"hosts is not a text file \(byte 14 is not UTF-8\)"):
        parse_hostfile(str(path))
    # the data-plane address is an address: a name (or a typo) is named with its line
    refused("mini1 addr=[fd00::2]\nmini2 addr=mini2-tb.local\n", r":2: addr=mini2-tb.local is not an IP address")
    path.write_text("mini1 addr=[fd00::2]\n")
    assert parse_hostfile(str(path))[0].addr == "fd00::2"
    # each Mac would read the %interface as one of its own
    refused("mini1 addr=fe80::1%en5\n", r":1: addr=fe80::1%en5 is a link-local IPv6 address")
    # a first host in brackets was taken for MLX's JSON ("not JSON"); one without, for a bad name
    path.write_text("[fd00::2] slots=2\nbob@[fd00::3]\n")
    assert [(h.name, h.slots, h.user) for h in parse_hostfile(str(path))] == [("fd00::2", 2, None), ("fd00::3", 1, "bob")]
    refused("fd00::2 slots=2\n", r":1: 'fd00::2' looks like an IPv6 address: write it in brackets, \[fd00::2\]$")
    # one address per cable (MLX's Thunderbolt rings): the first is the host's main one
    path.write_text("studio1 addr=192.168.1.1,[fd00::3]\n")
    assert [(h.addr, h.addrs) for h in parse_hostfile(str(path))] == [("192.168.1.1", ("192.168.1.1", "fd00::3"))]
    refused("studio1 addr=192.168.1.1,studio2\n", r":1: addr=studio2 is not an IP address")
    path.write_text("studio1 slots=2 share=3\nair\n")  # a faster Mac's ranks take more of each step
    assert [(h.slots, h.share) for h in parse_hostfile(str(path))] == [(2, 3), (1, 1)]
    refused("studio1 share=0\n", r":1: cannot read 'share=0'")
    refused("studio1 addr=192.168.1.1,192.168.2.1,192.168.1.1\n",
            r":1: addr=192.168.1.1,192.168.2.1,192.168.1.1 lists 192.168.1.1 more ")
    # OpenMPI's hostfiles cap oversubscription with max_slots; it was refused as unreadable
    refused("mini1 slots=2 max_slots=4\nmini2 max_slots=x\n", r":2: cannot read 'max_slots=x'")
    path.write_text("mini1 slots=2 max_slots=4\n")
    assert [(h.name, h.slots) for h in parse_hostfile(str(path))] == [("mini1", 2)]
    # and it caps: more ranks than max_slots, from slots= or from --nproc, is refused by name
    path.write_text("mini1 slots=2 max_slots=4\nair max_slots=1\n")
    assert [(h.name, h.slots) for h in parse_hostfile(str(path))] == [("mini1", 2), ("air", 1)]
    with pytest.raises(ValueError, match=r":2: 2 ranks asked of air, over its max_slots=1"):
        parse_hostfile(str(path), default_slots=2)
    refused("mini1 slots=5 max_slots=4\n", r":1: 5 ranks asked of mini1, over its max_slots=4")
    # a Python of its own (a conda environment on one Mac, a venv on another); the rest: --python's
    path.write_text("mini1 slots=2 python=~/miniconda3/envs/ml/bin/python\nmini2\n")
    assert [h.python for h in parse_hostfile(str(path))] == ["~/miniconda3/envs/ml/bin/python", None]
    # a path with spaces (an external volume), quoted as for a shell; # still starts a comment
    path.write_text('mini1 python="/Volumes/Data 2/envs/ml/bin/python"  # the external disk\n'
                    "mini2 python='/opt/a#b/python'\n")
    assert [h.python for h in parse_hostfile(str(path))] == ["/Volumes/Data 2/envs/ml/bin/python",
                                                             "/opt/a#b/python"]
    refused("mini1 slots=2\nmini2 python=\"/Volumes/Data 2/bin/python\n",
            r":2: no closing quotation in 'mini2 python=\"/Volumes/Data 2/bin/python'")
    refused("mini1 python=\n", r":1: cannot read 'python=' \(expected slots=N, share=N, addr=IP\[,IP...\] or python=PATH\)")


def test_mlx_hostfiles_are_read_as_they_are(tmp_path) -> None:
    """What mlx.distributed_config writes (a JSON list of {"ssh", "ips"}), and the object form
    with "hosts": one rank per entry, so entries repeated in a row are one host's slots."""
    path = tmp_path / "hosts.json"
    path.write_text(json.dumps([{"ssh": "studio1", "ips": ["192.168.0.2"]},
                                {"ssh": "alice@studio2", "ips": ["192.168.0.6"], "rdma": [None, "rdma_en3"]},
                                {"ssh": "alice@studio2", "ips": ["192.168.0.6"]}, {"ssh": "air"}]))
    hosts = parse_hostfile(str(path), default_slots=2)
    assert [(h.name, h.user, h.slots, h.addrs) for h in hosts] == [
        ("studio1", None, 2, ("192.168.0.2",)), ("studio2", "alice", 4, ("192.168.0.6",)), ("air", None, 2, ())]
    path.write_text(json.dumps({"backend": "ring", "hosts": [{"ssh": "a", "ips": []}, {"ssh": "b"}]}))
    assert [h.name for h in parse_hostfile(str(path))] == ["a", "b"]
    for bad, said in (({"envs": ["X=1"], "hosts": [{"ssh": "a"}]}, r"its \"envs\" are for MLX's launcher; give them "
                                                                   r"to macfleet's with --env K=V"),
                      ([{"ips": ["10.0.0.1"]}], r"host 1: expected \{\"ssh\""),
                      ([{"ssh": "a", "ips": ["a.local"]}], r"host 1: a.local is not an IP address"),
                      ([{"ssh": "a"}, {"ssh": "b"}, {"ssh": "a"}], r"host a is listed twice"),
                      ({"hosts": "a,b"}, r"expected a list of hosts")):
        path.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=said):
            parse_hostfile(str(path))
    path.write_text('[{"ssh": "a",\n "ips": [}]')
    with pytest.raises(ValueError, match=r"hosts.json:2: not JSON"):
        parse_hostfile(str(path))


# -- sampler ----------------------------------------------------------------------------------
@given(st.integers(1, 200), st.integers(1, 8), st.integers(0, 5), st.booleans(), st.lists(st.integers(1, 4), max_size=8))
def test_shards_cover_the_dataset_and_agree_on_the_shuffle(n: int, world: int, epoch: int, drop_last: bool,
                                                          drawn: list[int]) -> None:
    shares = (drawn * world)[:world] if drawn else None  # None: a share of 1 each
    parts = sum(shares) if shares else world
    shards = []
    for rank in range(world):
        s = DistributedSampler(n, num_replicas=world, rank=rank, seed=3, drop_last=drop_last, shares=shares)
        s.set_epoch(epoch)
        shards.append(list(s))
        assert len(s) == len(shards[-1])
    # every rank runs the same number of steps, with a batch size in proportion to its share
    assert len({len(sh) / (shares[r] if shares else 1) for r, sh in enumerate(shards)}) == 1
    seen = [i for sh in shards for i in sh]
    if drop_last:
        assert len(set(seen)) == len(seen) == (n // parts) * parts
    else:
        assert set(seen) == set(range(n)) and len(seen) - n < parts  # padded by less than a round


@given(st.integers(1, 100), st.integers(1, 8), st.data(), st.integers(0, 2**31), st.integers(0, 5), st.booleans(),
       st.booleans())
def test_without_shares_each_rank_gets_the_shard_torch_s_sampler_gives_it(n: int, world: int, data: Any, seed: int,
                                                                         epoch: int, shuffle: bool,
                                                                         drop_last: bool) -> None:
    """The README's port of a DDP script swaps torch's DistributedSampler for macfleet's, "the
    same options": a job then reads the same samples in the same order on every rank, and a
    result can be compared with the DDP run's."""
    from torch.utils.data.distributed import DistributedSampler as TorchSampler

    rank = data.draw(st.integers(0, world - 1))
    theirs = TorchSampler(range(n), num_replicas=world, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
    ours = DistributedSampler(n, num_replicas=world, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
    theirs.set_epoch(epoch)
    ours.set_epoch(epoch)
    assert list(ours) == list(theirs) and len(ours) == len(theirs)


def test_a_ranks_shares_are_consecutive_places_of_each_round() -> None:
    s = DistributedSampler(10, num_replicas=3, rank=1, shuffle=False, shares=[2, 2, 2])
    assert list(s) == [2, 3, 8, 9]  # places 2-3 of each round of 6, the round padded from the start
    plain = DistributedSampler(10, num_replicas=3, rank=1, shuffle=False)
    assert list(plain) == [1, 4, 7, 0]  # torch.utils.data.DistributedSampler's shard
    with pytest.raises(ValueError, match="whole numbers"):
        DistributedSampler(10, num_replicas=2, rank=0, shares=[1.5, 1])


def test_epochs_reshuffle_and_resume_mid_epoch() -> None:
    s = DistributedSampler(100, num_replicas=2, rank=1, seed=0)
    s.set_epoch(0)
    first = list(s)
    s.set_epoch(1)
    assert list(s) != first
    s.set_epoch(0)
    state = s.state_dict(consumed=10)
    resumed = DistributedSampler(100, num_replicas=2, rank=1, seed=0)
    resumed.load_state_dict(state)
    assert list(resumed) == first[10:] and len(resumed) == 40
    resumed.load_state_dict(state)  # the training loop's own set_epoch keeps the resume point
    resumed.set_epoch(0)
    assert list(resumed) == first[10:]
    resumed.set_epoch(0)  # once: the next time round the epoch is whole
    assert list(resumed) == first
    resumed.load_state_dict(state)
    resumed.set_epoch(1)  # the checkpoint's epoch is not this one
    s.set_epoch(1)
    assert list(resumed) == list(s)


def test_an_epoch_s_order_taken_again_without_set_epoch_is_warned_of_once() -> None:
    """A loop that never calls set_epoch shuffles every epoch alike, with torch's sampler too;
    rank 0's sampler says so, once. A sampler without shuffling, and one whose epochs are set,
    say nothing."""
    s = DistributedSampler(20, num_replicas=2, rank=0, seed=1)
    first = list(s)
    with pytest.warns(UserWarning, match=r"order of epoch 0 was taken again without set_epoch\(\)") as said:
        assert list(s) == first  # the same order: what the warning is about
        list(s)
    assert len(said) == 1
    assert said[0].filename == __file__  # the script's line that took the order, not macfleet's
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plain, stepped = DistributedSampler(20, num_replicas=2, rank=0, shuffle=False), DistributedSampler(20, 2, 0)
        other = DistributedSampler(20, num_replicas=2, rank=1)  # rank 0's says it for the job
        for epoch in range(3):
            stepped.set_epoch(epoch)
            list(plain), list(stepped), list(other)


def test_a_subset_is_known_by_the_samples_it_holds_however_its_indices_are_given() -> None:
    """What a job's sampler tells the launcher of a Subset (a random_split's part): the same
    samples give the same digest, as a list, a range or a tensor; other samples, or the same
    ones of another base's part, another; indices of a kind of their own give none (not
    compared) rather than an error out of the sampler's constructor."""
    from torch.utils.data import Subset, TensorDataset

    from macfleet.sampler import subset_digest

    data = TensorDataset(torch.arange(10.0))
    same = {subset_digest(Subset(data, [1, 2, 3])), subset_digest(Subset(data, range(1, 4))),
            subset_digest(Subset(data, torch.tensor([1, 2, 3])))}
    assert len(same) == 1 and None not in same
    assert subset_digest(Subset(data, [1, 2, 4])) not in same
    assert subset_digest(Subset(Subset(data, [5, 1, 2, 3]), [1, 2, 3])) not in same  # samples 1-3 of another base
    assert subset_digest(data) is None and subset_digest(Subset(data, ["a"])) is None


def test_a_data_loader_that_every_rank_reads_whole_is_told_from_one_that_shards() -> None:
    """What rank 0's DataParallel looks for at its first training steps: the loaders being
    iterated, and whether one reads a whole dataset while none shards one (at 2 ranks)."""
    from torch.utils.data import DataLoader, IterableDataset, Subset, TensorDataset, random_split

    from macfleet.loaders import LOOKS, Look, WholeDatasetCheck, look_at_loaders

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(10))

    gc.collect()  # loaders of earlier tests
    data = TensorDataset(torch.arange(40.0))
    assert look_at_loaders(2) == Look(False, False, None)
    loader = DataLoader(data, batch_size=4, shuffle=True)
    assert look_at_loaders(2) == Look(False, True, None)  # made, not yet iterated
    shuffled = iter(loader)
    look = look_at_loaders(2)
    assert look.iterated and type(look.whole).__name__ == "RandomSampler" and look.whole.data_source is data
    sharded = iter(DataLoader(data, batch_size=4, sampler=DistributedSampler(data, num_replicas=2, rank=0)))
    assert look_at_loaders(2) == Look(True, True, None)  # the training loader shards; the other is, say, validation's
    del shuffled, sharded
    in_order = iter(DataLoader(data, batch_size=4))  # shuffle=False: every rank the same batches
    assert type(look_at_loaders(2).whole).__name__ == "SequentialSampler"
    del in_order
    train, _ = random_split(data, [36, 4])
    split = iter(DataLoader(train, shuffle=True))  # most of the base: read whole on every rank
    assert look_at_loaders(2).whole is not None
    del split
    features = torch.randn(40, 3)
    cut = [Subset(data, range(0, 40, 2)), TensorDataset(features[1::2], torch.arange(20)),
           TensorDataset(features[:20])]  # a rank's half, cut by hand: a Subset, every other row, a slice
    for whole in (TensorDataset(features[:21].clone()), TensorDataset(features[:30])):  # copied out; 3/4 of it
        kept = iter(DataLoader(whole, shuffle=True))
        assert look_at_loaders(2).whole is not None, whole
        del kept
    for let_be in (*cut, Stream()):  # a stream
        kept = iter(DataLoader(let_be, batch_size=4))
        assert look_at_loaders(2) == Look(True, True, None), let_be
        del kept
    check = WholeDatasetCheck()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(LOOKS):
            check(2)  # a loader made, none iterated yet (a warm-up step before the loop)
        late = iter(loader)
        check(2)  # it has given up by now, and costs nothing more
    with pytest.warns(UserWarning, match=r"RandomSampler reads the whole dataset \(40 samples\).* all 3 ranks .*"
                                         r"sampler=macfleet.DistributedSampler\(dataset\) in place of shuffle=True"):
        WholeDatasetCheck()(3)
    del late, loader
    gc.collect()
    check = WholeDatasetCheck()
    check(2)
    assert check.looks_left == 0  # no loader at all: one look is enough


def test_a_forward_s_inputs_are_known_by_their_first_rows_in_whatever_they_come() -> None:
    """What each rank's DataParallel tells the launcher of its first training forwards' inputs:
    equal batches, however they are held (a copy, a transposed view, a dict, a dataclass), give
    equal digests; another first sample, shape or dtype another. Rows past the first 64 KiB
    are not read; a tensor that cannot be read so is left out."""
    from macfleet.batches import HEAD_BYTES, inputs_digest

    @dataclasses.dataclass
    class Batch:
        pixels: torch.Tensor
        labels: torch.Tensor

    x, y = torch.randn(32, 3, 8, 8), torch.arange(32)
    same = inputs_digest((x, y), {})
    assert inputs_digest((x.clone(), y.clone()), {}) == same
    for held in [((x, y),), ([x, [y]],), (Batch(x, y),), ({"pixels": x, "labels": y},)]:
        assert inputs_digest(held, {}) == same, held
    assert inputs_digest((x,), {"labels": y}) == same  # keyword arguments count after the others
    other = x.clone()
    other[0, 0, 0, 0] += 1  # another first sample
    assert inputs_digest((other, y), {}) != same
    assert inputs_digest((x.double(), y), {}) != same and inputs_digest((x[:31], y[:31]), {}) != same
    t = x.reshape(32, -1).t()  # not contiguous: its first rows read through a copy
    assert inputs_digest((t,), {}) == inputs_digest((t.contiguous(),), {})
    rows = HEAD_BYTES // (3 * 8 * 8 * 4)  # of a larger batch, the rows read
    big = torch.randn(rows + 2, 3, 8, 8)
    early, late = big.clone(), big.clone()
    early[rows - 1] += 1
    late[rows] += 1  # past what is read: the same digest, the cost of reading only the first rows
    assert inputs_digest((early,), {}) != inputs_digest((big,), {}) == inputs_digest((late,), {})
    assert inputs_digest((x.to_sparse(),), {}) is None and inputs_digest(("text", 3), {}) is None
    assert inputs_digest((x.to_sparse(), x), {}) == inputs_digest((x,), {})
    assert inputs_digest((torch.tensor(2.0),), {}) != inputs_digest((torch.tensor(3.0),), {})
    assert inputs_digest((torch.empty(0, 3),), {}) is not None
    clips = torch.randn(2, HEAD_BYTES)  # rows larger than what is read: the first row's start alone
    start, end = clips.clone(), clips.clone()
    start[0, 0] += 1
    end[0, -1] += 1
    assert inputs_digest((start,), {}) != inputs_digest((clips,), {}) == inputs_digest((end,), {})


def test_ranks_whose_first_batches_were_alike_are_named_but_a_fixed_batch_is_not() -> None:
    """The launcher's reading of the ranks' digests (by rank, in forward order)."""
    moving = ("a", "b", "c")
    said = same_batches({0: moving, 1: moving, 2: moving})
    assert said and said.startswith("the ranks train on the same batches") and "the 3 ranks together" in said
    assert "macfleet.DistributedSampler(dataset)" in said and "macfleet.rank() and macfleet.world_size()" in said
    # split by the rank on its Mac, two Macs of two ranks: ranks 0 and 2 alike, and 1 and 3
    said = same_batches({0: moving, 1: ("d", "e", "f"), 2: moving, 3: ("d", "e", "f")})
    assert said and said.startswith("some ranks train on the same batches") and "ranks 0, 2 and of ranks 1, 3" in said
    said = same_batches({0: moving, 1: ("d", "e", "f"), 2: moving})
    assert said and "of ranks 0, 2 got the same inputs, so" in said
    assert same_batches({0: moving, 1: ("a", "b", "d"), 2: ("x", "b", "c")}) is None  # alike in some forwards only
    assert same_batches({0: ("w", "a", "a"), 1: ("w", "b", "b")}) is None  # a warm-up alike, then their own data
    assert same_batches({0: ("f", "f", "f"), 1: ("f", "f", "f")}) is None  # one fixed batch: a benchmark's
    assert same_batches({0: ("a", None, "c"), 1: ("a", None, "c")}) is None  # a forward without a tensor to read


@given(st.integers(1, 300), st.lists(st.integers(1, 3), min_size=1, max_size=6),
       st.lists(st.integers(1, 3), min_size=1, max_size=6), st.integers(0, 40))
def test_a_place_in_the_epoch_carries_over_to_a_job_of_another_size(n: int, before: list[int], after: list[int],
                                                                      rounds: int) -> None:
    """The ranks of a job with ``before`` shares consume ``rounds`` rounds and save; a job with
    ``after`` shares resumes: together they see every sample, and repeat less than a round."""
    def samplers(shares: list[int]) -> list[DistributedSampler]:
        made = [DistributedSampler(n, num_replicas=len(shares), rank=r, seed=9, shares=shares) for r in range(len(shares))]
        for s in made:
            s.set_epoch(4)
        return made

    old = samplers(before)
    rounds = min(rounds, old[0].rounds)
    seen = [i for s in old for i in list(s)[:rounds * len(s.mine)]]
    state = old[0].state_dict(consumed=rounds * before[0])  # rank 0's, as checkpoint.save keeps
    rest = []
    for s in samplers(after):
        s.load_state_dict(state)
        s.set_epoch(4)
        rest += list(s)
    padding = old[0].rounds * sum(before) - n  # the old job's repeats, to fill its last round
    assert set(seen) | set(rest) == set(range(n))
    assert len(seen) + len(rest) - n < padding + 2 * sum(after)  # the new one's, and one round at most


# -- device rules -----------------------------------------------------------------------------
# -- rank output, cut as it arrives ---------------------------------------------------------------
@given(data=st.lists(st.sampled_from([b"a", b"bc", b"\n", b"\r", b"\r\n", b"50%|##"]), max_size=30).map(b"".join),
       cuts=st.lists(st.integers(1, 8), max_size=30))
def test_output_is_forwarded_in_whole_lines(data: bytes, cuts: list[int]) -> None:
    """Written in one go (however the writes fall), output comes out as whole lines, each with
    its ending, and the unfinished rest last: never a line in two pieces."""
    read, write = os.pipe()
    with os.fdopen(write, "wb", buffering=0) as sink:
        rest = data
        for n in cuts:  # a pipe holds 64 KiB: this never blocks
            sink.write(rest[:n])
            rest = rest[n:]
        sink.write(rest)
    got = list(pieces(read))
    os.close(read)
    assert b"".join(got) == data
    for piece in got[:-1]:
        assert piece.endswith((b"\n", b"\r")), got
    for piece in got:
        inner = piece[:-2] if piece.endswith(b"\r\n") else piece[:-1]
        assert b"\n" not in inner and b"\r" not in inner, piece  # an ending only at the end


def test_an_unfinished_line_is_forwarded_once_the_writer_goes_quiet() -> None:
    """A progress bar's state, with no line ending, must not wait for the end of the stream."""
    read, write = os.pipe()
    os.write(write, b"done\n50%|##")
    got = pieces(read, settle_s=0.05)
    assert next(got) == b"done\n"
    assert next(got) == b"50%|##"  # the write end is still open: forwarded for the quiet alone
    os.write(write, b"\r60%|###\n")
    os.close(write)
    assert list(got) == [b"\r", b"60%|###\n"]
    os.close(read)


def test_once_the_writer_has_ended_its_output_is_known_to_be_all_forwarded() -> None:
    """A child of the writer holds the stream open, so its end is far off: the writer's end
    (``ended`` readable) flushes its unfinished line at once and says so with an empty piece,
    and what the child writes afterwards is still forwarded."""
    read, write = os.pipe()
    ended_r, ended_w = os.pipe()
    os.write(write, b"Traceback\nValueError: x")
    got = pieces(read, settle_s=60, ended=ended_r)  # no quiet can flush the last line in time
    assert next(got) == b"Traceback\n"
    os.write(ended_w, b"x")
    assert next(got) == b"ValueError: x"
    assert next(got) == b""
    os.write(write, b"the child's line\n")
    os.close(write)
    assert list(got) == [b"the child's line\n"]
    for fd in (read, ended_r, ended_w):
        os.close(fd)


def test_a_line_with_no_end_is_forwarded_in_bounded_pieces() -> None:
    """Binary output, or a line with no end: every read copied all that was pending, so 100 MB
    took the agent's pump half a minute while the rank sat blocked on a full pipe."""
    read, write = os.pipe()
    data = b"x" * (3 * LONGEST) + b"\n"

    def writer() -> None:
        os.write(write, data)
        os.close(write)

    thread = threading.Thread(target=writer)
    thread.start()
    got = list(pieces(read))
    thread.join()
    os.close(read)
    assert b"".join(got) == data
    assert max(len(piece) for piece in got) < LONGEST + 65536  # one read past the bound at most

class Capture:
    """An output a test can wait on: what has been written to it so far."""

    def __init__(self) -> None:
        self.data = b""
        self._written = threading.Condition()

    def write(self, data: bytes) -> None:
        with self._written:
            self.data += data
            self._written.notify_all()

    def flush(self) -> None:
        pass

    def wait_for(self, text: bytes) -> None:
        with self._written:
            assert self._written.wait_for(lambda: text in self.data, timeout=30), self.data


def relayed(settle_s: float, *hosts: str) -> tuple[Capture, dict[str, int], list[Relay]]:
    """One launcher output, and for each host a pipe its agent's output is relayed from."""
    sink, writes, relays = Capture(), {}, []
    output = Output(lambda: sink)
    for host in hosts:
        read, writes[host] = os.pipe()
        relays.append(Relay(os.fdopen(read, "rb"), output, host, settle_s=settle_s))
        relays[-1].start()
    return sink, writes, relays


def test_two_hosts_lines_never_share_a_line_of_the_launchers_output() -> None:
    """ssh delivers an agent's output in packets that need not end at a line's end. Written
    straight to the launcher's stdout, another host's line landed inside one (CI: '[rank 1
    127.0.0.2] chatter 1 [rank 3 127.0.0.3] chatter 3 8...'). The rest of a line that comes
    while another host's line goes out still joins its start."""
    sink, write, threads = relayed(60, "mac1", "mac2")  # no quiet forwards the start alone
    os.write(write["mac1"], b"[rank 1 mac1] chatter 1 ")  # a packet that ends mid-line
    os.write(write["mac2"], b"[rank 3 mac2] chatter 3 8\n")
    sink.wait_for(b"chatter 3 8\n")
    os.write(write["mac1"], b"875\n")
    for fd in write.values():
        os.close(fd)
    for thread in threads:
        thread.join(timeout=30)
    assert sink.data == b"[rank 3 mac2] chatter 3 8\n[rank 1 mac1] chatter 1 875\n"


def test_a_line_one_host_leaves_unfinished_is_ended_before_another_hosts_line() -> None:
    """A progress bar shown unfinished, then another host's line: the line goes below the bar,
    not on after it; an agent that ends mid-line has its line ended too."""
    sink, write, threads = relayed(0.05, "mac1", "mac2")
    os.write(write["mac1"], b"[rank 0 mac1] 50%|##")
    sink.wait_for(b"50%|##")  # forwarded for the quiet alone
    os.write(write["mac2"], b"[rank 2 mac2] loss 0.1\n")
    sink.wait_for(b"loss 0.1\n")
    os.write(write["mac1"], b"[rank 0 mac1] 60%|###")
    sink.wait_for(b"60%|###")
    os.close(write["mac1"])
    threads[0].join(timeout=30)
    os.write(write["mac2"], b"[rank 2 mac2] loss 0.05\n")
    os.close(write["mac2"])
    threads[1].join(timeout=30)
    assert sink.data == (b"[rank 0 mac1] 50%|##\n[rank 2 mac2] loss 0.1\n"
                         b"[rank 0 mac1] 60%|###\n[rank 2 mac2] loss 0.05\n")


def test_a_hosts_redraws_wait_while_another_hosts_bar_is_drawn() -> None:
    """A bar on every host: each redraw started a line of its own, and the terminal scrolled a
    line per redraw. Redraws (pieces ending in \\r) from another host are not shown while one
    host's line is open; its whole lines are, and so are its redraws once the line is free."""
    sink = Capture()
    output = Output(lambda: sink)
    output.write("mac1", b"[rank 0 mac1] 10%\r")
    output.write("mac2", b"[rank 2 mac2] 20%\r")  # a state the next redraw replaces
    output.write("mac2", b"[rank 2 mac2] done\n")
    output.write("mac1", b"[rank 0 mac1] 11%\r")  # the line is free again
    output.write("mac1", b"[rank 0 mac1] done\n")
    assert sink.data == b"[rank 0 mac1] 10%\r\n[rank 2 mac2] done\n[rank 0 mac1] 11%\r[rank 0 mac1] done\n"


def test_a_line_left_open_on_one_output_is_ended_before_the_other_writes_where_both_are_one_terminal() -> None:
    """A rank's prompt stays unfinished on stdout, and the launcher's note that the rank waits
    for its user (on stderr) went on after it, on its line. Where the two outputs are one
    terminal they share a screen: the note starts a line of its own, and the newline with which
    the agent then ends the prompt's line (before another rank's line) makes no blank line.
    One host's lines on the two streams are kept apart alike."""
    sink, screen = Capture(), Screen()
    out, err = Output(lambda: sink, screen), Output(lambda: sink, screen)
    out.write("mac1", b"[rank 0] overwrite? [y/N] ")
    err.write("launcher", b"macfleet: rank 0 (localhost) is waiting for what you type\n")
    out.write("mac1", b"\n")  # the agent ends rank 0's line, before rank 1's
    out.write("mac1", b"[rank 1] past the barrier\n")
    out.write("mac1", b"[rank 0] 50%\r")
    err.write("mac1", b"[rank 1] warning\n")  # the same agent, on the other stream
    out.write("mac1", b"[rank 0] 60%\r")
    assert sink.data == (b"[rank 0] overwrite? [y/N] \nmacfleet: rank 0 (localhost) is waiting for what you type\n"
                         b"[rank 1] past the barrier\n[rank 0] 50%\r\n[rank 1] warning\n[rank 0] 60%\r")


def test_output_on_a_descriptor_above_1024_is_forwarded() -> None:
    """An agent of 150-odd ranks holds descriptors from 1024 on, which select() refuses: its
    pump threads died with ValueError and the ranks' output was lost."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2048 and (hard == resource.RLIM_INFINITY or hard >= 2048):
        resource.setrlimit(resource.RLIMIT_NOFILE, (2048, hard))
    elif soft < 2048:
        pytest.skip(f"this user may not open 2048 files (hard limit {hard})")
    read, write = os.pipe()
    high = os.dup2(read, 1500)
    os.close(read)
    os.write(write, b"loss 0.1\nloss 0.05\n")
    os.close(write)
    try:
        assert list(pieces(high)) == [b"loss 0.1\n", b"loss 0.05\n"]
    finally:
        os.close(high)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_stdin_relay_passes_on_what_is_read_then_the_end() -> None:
    read, write = os.pipe()
    relay = StdinRelay(read)
    os.write(write, b"p x\n")
    os.close(write)
    got, ended, deadline = b"", False, time.monotonic() + 10
    while not ended and time.monotonic() < deadline:  # the relay's thread reads as the bytes come
        data, ended = relay.take()
        got += data
        time.sleep(0.01)
    assert (got, ended) == (b"p x\n", True)
    assert relay.take() == (b"", True)  # a restarted attempt's ranks get the end at once
    os.close(read)


def test_the_stdin_relay_reads_no_terminal_it_is_not_in_the_foreground_of() -> None:
    """A terminal that is not this process's (its foreground process group cannot be ours):
    reading it would stop the launcher (SIGTTIN), so the ranks get the end of input at once."""
    leader, follower = pty.openpty()
    relay = StdinRelay(follower)
    assert relay.take() == (b"", True)
    os.close(leader)
    os.close(follower)


# -- the end-of-job pace line ------------------------------------------------------------------
def test_ranks_that_stood_by_inside_join_are_named_with_their_share_of_the_job() -> None:
    waits = {0: (1.0, 30.0), 1: (2.0, 100.0), 2: (1.0, 97.0), 3: (1.0, 50.0)}
    # rank 0 stood by 70 s of its 100, rank 2 3 s (3%: one batch more or less), rank 3 50 of 100
    line, = stood_by_report({0: 70.0, 2: 3.0, 3: 50.0}, waits)
    assert line.startswith("ranks out of batches stood by inside join() while the others trained: "
                           "rank 0 70%, rank 3 50% of their time;"), line
    line, = stood_by_report({0: 70.0}, waits)
    assert line.startswith("a rank out of batches stood by inside join() while the others trained: rank 0 70% of its time")
    assert stood_by_report({2: 3.0}, waits) == []  # 3%: not worth a line
    assert stood_by_report({0: 70.0}, {1: (2.0, 100.0)}) == []  # rank 0 never said how long it ran


def test_the_odd_copies_of_a_script_s_modules_are_those_most_hosts_do_not_have() -> None:
    same, new, old = {"model.py": "aa"}, {"model.py": "aa", "data.py": "dd"}, {"model.py": "bb", "data.py": "dd"}
    assert odd_copies({"studio": new, "mini": new, "air": new}) == []
    assert odd_copies({"studio": new, "mini": old, "air": new}) == [("model.py", ["mini"])]
    assert odd_copies({"studio": new, "mini": old}) == [("model.py", ["studio", "mini"])]  # two: neither leads
    assert odd_copies({"studio": new, "mini": new, "air": same}) == [("data.py", ["air"])]  # one it never imported
    # imported after init: a module that one host has not imported (rank 0's alone) is no difference
    assert odd_copies({"studio": new, "mini": new, "air": same}, imported_by_all=True) == []
    assert odd_copies({"studio": new, "mini": old, "air": same}, imported_by_all=True) == [("model.py", ["mini"])]


def test_ranks_that_stood_by_inside_join_are_listed_but_not_named_as_setting_the_pace() -> None:
    """Rank 0 ran out of batches after two quick steps (little waiting in them) and stood by;
    rank 2 waited for rank 1's slow steps. Judged on its two steps, rank 0 read as a pace setter."""
    waits, hosts = {0: (0.1, 2.0), 1: (0.2, 8.0), 2: (3.0, 8.0)}, dict.fromkeys(range(3), "m")
    assert pace_report(waits, hosts, 3)[1].startswith("ranks 0, 1 set the pace")
    listed, pace = pace_report(waits, hosts, 3, stood_by={0: 6.0, 2: 0.1})  # rank 2's 1%: not worth judging apart
    assert "rank 0 5%" in listed
    assert pace == "rank 1 sets the pace: rank 2 spent up to 35% more of its time waiting for it"
    assert pace_report(waits, hosts, 3, stood_by={0: 6.0, 1: 6.0}) == [listed]  # one rank left: nothing to compare


def test_the_pace_line_names_the_ranks_the_others_wait_for() -> None:
    hosts = {0: "studio", 1: "studio", 2: "air", 3: "air"}
    waits = {0: (41.0, 100.0), 1: (40.0, 100.0), 2: (6.0, 100.0), 3: (5.0, 100.0)}
    listed, pace = pace_report(waits, hosts, 4)
    assert "rank 0 (studio) 41%" in listed and "rank 3 (air) 5%" in listed
    assert pace.startswith("ranks 2, 3 (on air) set the pace: ranks 0, 1 (on studio) spent up to 36% more")
    assert pace.endswith("; DataParallel's shares give faster Macs larger batches")  # the remedy, on mixed Macs
    # one Mac: no host names; one slow rank among equals, or one fast rank that waits for the rest
    listed, pace = pace_report({0: (50.0, 100.0), 1: (48.0, 100.0), 2: (1.0, 100.0)}, dict.fromkeys(range(3), "m"), 3)
    assert "(m)" not in listed and pace.startswith("rank 2 sets the pace: ranks 0, 1 spent") and "shares" not in pace
    _, pace = pace_report({0: (3.0, 100.0), 1: (60.0, 100.0), 2: (1.0, 100.0)}, dict.fromkeys(range(3), "m"), 3)
    assert pace.startswith("ranks 0, 2 set the pace: rank 1 spent up to 59% more of its time waiting for them")
    # a spread like that of a short run of ranks sharing one GPU says nothing about their speed
    assert len(pace_report({0: (8.0, 100.0), 1: (16.0, 100.0), 2: (1.0, 100.0)}, dict.fromkeys(range(3), "m"), 3)) == 1


def test_shares_are_suggested_from_each_macs_measured_speed() -> None:
    from macfleet.launcher.report import suggest_shares

    assert suggest_shares([3.1, 1.0]) == [3, 1]
    assert suggest_shares([1.6, 1.6, 1.0, 1.0]) == [3, 3, 2, 2]  # [2, 2, 1, 1] would be 25% off
    assert suggest_shares([1.05, 1.0, 0.97]) == [1, 1, 1]  # within 10%: equal
    assert suggest_shares([0.5, 0.25]) == [2, 1]
    hosts = {0: "studio", 1: "studio", 2: "air", 3: "air"}
    waits = {0: (41.0, 100.0), 1: (40.0, 100.0), 2: (6.0, 100.0), 3: (5.0, 100.0)}
    speeds = {0: 0.25 / 0.1, 1: 0.25 / 0.1, 2: 0.25 / 0.3, 3: 0.25 / 0.31}  # equal shares, the airs 3x slower
    lines = pace_report(waits, hosts, 4, speeds)
    assert lines[2].startswith("shares=[3, 3, 1, 1] would give each rank work in proportion to its speed")
    assert "in the hostfile, studio share=3, air share=1 (macfleet.shares() hands them" in lines[2]  # per Mac
    # the studio's ranks already take 3 parts each, and each part costs them as much as an air's
    speeds = {0: 0.375 / 0.3, 1: 0.375 / 0.3, 2: 0.125 / 0.1, 3: 0.125 / 0.3}
    assert "shares=[3, 3, 3, 1] would give each rank work in proportion to its speed in this job: pass them to " \
        "DistributedSampler" in pace_report(waits, hosts, 4, speeds)[2]  # one Mac's ranks differ: per rank
    assert len(pace_report(waits, hosts, 4, {0: 1.0})) == 2  # not every rank measured: no suggestion
    assert len(pace_report(waits, dict.fromkeys(range(4), "m"), 4, speeds)) == 2  # one Mac: ranks alike


def test_the_pace_line_says_when_communication_itself_is_the_bottleneck_and_keeps_quiet_otherwise() -> None:
    equal = dict.fromkeys(range(4), (45.0, 100.0))
    assert "communication sets the pace" in pace_report(equal, {0: "a", 1: "a", 2: "b", 3: "b"}, 4)[1]
    assert len(pace_report(dict.fromkeys(range(4), (5.0, 100.0)), dict.fromkeys(range(4), "a"), 4)) == 1
    assert pace_report({0: (1.0, 2.0)}, {0: "a", 1: "a"}, 2) == []  # rank 1 never said goodbye
    assert pace_report({0: (1.0, 2.0)}, {0: "a"}, 1) == []
    # a job of a few milliseconds (one barrier): 3 ms of waiting in 5 ms is noise, not a pace
    assert pace_report({0: (0.003, 0.005), 1: (0.0001, 0.005)}, {0: "a", 1: "a"}, 2) == []
    assert len(pace_report({0: (0.6, 1.0), 1: (0.01, 1.0)}, {0: "a", 1: "a"}, 2)) == 2  # a second: said


def test_the_pace_line_sums_up_a_large_job() -> None:
    waits = {r: (30.0 + r, 100.0) for r in range(16)}
    waits[7] = (2.0, 100.0)
    listed, pace = pace_report(waits, dict.fromkeys(range(16), "a"), 16)
    assert "least 2% (rank 7)" in listed and "most 45% (rank 15)" in listed and "rank 9 " not in listed
    assert pace.startswith("rank 7 sets the pace")


def test_waiting_for_a_device_event_leaves_other_threads_running() -> None:
    """torch's MPS event ``synchronize`` blocks in C holding the GIL, so DataParallel's bucket
    thread waiting for a gradient stopped the thread that runs backward. Metal cannot run here:
    the stand-in keeps MPS's contract (``query`` True once the work before the event is done;
    ``synchronize`` blocks holding the GIL, as ctypes.PyDLL calls do) and the thread running
    backward is a Python loop, which must never wait long for the GIL."""
    libc = ctypes.PyDLL(None)

    class Event:  # signals 0.3 s after it is recorded
        def __init__(self) -> None:
            self.done_at = time.monotonic() + 0.3

        def query(self) -> bool:
            return time.monotonic() >= self.done_at

        def synchronize(self) -> None:
            libc.usleep(int(max(0.0, self.done_at - time.monotonic()) * 1e6))

    event = Event()
    waiter = threading.Thread(target=PolledEvent(event).synchronize)
    longest, last = 0.0, time.monotonic()
    waiter.start()
    while waiter.is_alive():
        now = time.monotonic()  # needs the GIL, as an autograd hook does
        longest, last = max(longest, now - last), now
    waiter.join()
    assert time.monotonic() >= event.done_at  # not back before the work was done
    assert longest < 0.1, f"the loop waited {longest:.3f} s for the GIL"


def test_float64_is_refused_for_mps_by_name() -> None:
    with pytest.raises(ConfigError, match="weights"):
        MpsDevice().check_dtype(torch.zeros(2, dtype=torch.float64), "weights")
    MpsDevice().check_dtype(torch.zeros(2, dtype=torch.float32), "weights")
    check_tensor(torch.zeros(2, dtype=torch.float64), "cpu tensors may be float64")


# -- DDP's options -------------------------------------------------------------------------
def test_ddp_s_device_ids_move_the_inputs_to_the_model_and_nonsense_is_named() -> None:
    """``DataParallel(model, device_ids=[local_rank])`` ports a DDP line: as DDP's, the forward
    moves the inputs, however nested, to the model's device ("meta" stands in for a GPU here)."""
    model = torch.nn.Linear(2, 2, device="meta")
    assert input_device(model, [3], None) == torch.device("meta")  # a CUDA script's index: the model's device
    assert input_device(model, None, None) is None  # without device_ids nothing moves

    Pair = collections.namedtuple("Pair", "x y")

    @dataclasses.dataclass
    class Batch:
        pixels: torch.Tensor
        note: str

    inputs = ([torch.ones(2), Pair(torch.ones(1), 5)], {"mask": torch.zeros(3), "batch": Batch(torch.ones(4), "n")})
    moved = to_device(inputs, torch.device("meta"))
    assert moved[0][0].device.type == "meta" and moved[0][0].shape == (2,)
    assert isinstance(moved[0][1], Pair) and moved[0][1].x.device.type == "meta" and moved[0][1].y == 5
    assert moved[1]["mask"].device.type == "meta"
    assert isinstance(moved[1]["batch"], Batch) and moved[1]["batch"].pixels.device.type == "meta"
    assert moved[1]["batch"].note == "n" and inputs[1]["mask"].device.type == "cpu"  # the caller's left as they were
    with pytest.raises(ConfigError, match="process_group"):
        input_device(model, None, object())
    for wrong in (0, [0, 1], []):
        with pytest.raises(ConfigError, match="device_ids=.*in a list"):
            input_device(model, wrong, None)
    split = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2, device="meta"))
    with pytest.raises(ConfigError, match=r"several \(cpu, meta\)"):
        input_device(split, [0], None)


def test_ddp_s_other_options_say_what_to_do_instead_unless_given_ddp_s_defaults() -> None:
    """The rest of DDP's signature (torch 2.15): a ported line that passed one of them got
    Python's "unexpected keyword argument", which says nothing of what to do on a Mac."""
    import inspect

    from torch.nn.parallel import DistributedDataParallel

    from macfleet.ddp_options import refuse_ddp_only
    from macfleet.parallel import DataParallel

    ours = inspect.signature(DataParallel.__init__).parameters
    ddp = inspect.signature(DistributedDataParallel.__init__).parameters
    rest = {name: p.default for name, p in ddp.items() if name not in ours}
    refuse_ddp_only(rest)  # DDP's defaults, spelled out: taken (a name a newer torch adds fails here first)
    refuse_ddp_only({"batched_grad_copy": True})  # a speed-up of DDP's copies, which DataParallel does not make
    refuse_ddp_only({"lazy_bucket_allocation": True})  # frees DDP's copies of the gradients: there are none here
    for name, value, advice in [("mixed_precision", object(), "torch.autocast"), ("device_mesh", object(), "whole"),
                                ("bucket_cap_mb_list", [1, 25], "first_bucket_mb"),
                                ("delay_all_reduce_named_params", [], "holds no parameter back"),
                                ("param_to_hook_all_reduce", object(), "holds no parameter back"),
                                ("skip_all_reduce_unused_params", True, "as zeros")]:
        with pytest.raises(ConfigError, match=f"^{name}=.*{advice}"):
            refuse_ddp_only({name: value})
    with pytest.raises(TypeError, match="unexpected keyword argument 'bucket_cap'"):
        refuse_ddp_only({"bucket_cap": 25})  # a typo is Python's error still


# -- DataParallel's bucket layout ------------------------------------------------------------
@given(widths=st.lists(st.integers(1, 64), min_size=2, max_size=9), biases=st.lists(st.booleans(), min_size=8, max_size=8),
       doubles=st.lists(st.booleans(), min_size=8, max_size=8), first_cap=st.integers(4, 20000),
       cap=st.integers(4, 40000))
def test_buckets_take_whole_modules_in_reverse_order_and_fill_up(widths, biases, doubles, first_cap, cap) -> None:
    layers = [torch.nn.Linear(a, b, bias=biases[i]) for i, (a, b) in enumerate(zip(widths[:-1], widths[1:], strict=True))]
    for layer, double in zip(layers, doubles[:len(layers)], strict=True):
        layer.to(torch.float64 if double else torch.float32)
    named = list(torch.nn.Sequential(*layers).named_parameters())
    groups = bucket_layout(named, first_cap, cap)

    def owner(name: str) -> str:
        return name.rpartition(".")[0]

    def nbytes(params) -> int:
        return sum(p.numel() * p.element_size() for _, p in params)

    assert [n for g in groups for n, _ in g] == [n for n, _ in reversed(named)]  # every one, last registered first
    buckets_of: dict[str, set[int]] = {}
    for i, group in enumerate(groups):
        for n, _ in group:
            buckets_of.setdefault(owner(n), set()).add(i)
    assert all(len(b) == 1 for b in buckets_of.values()), "a module's parameters split over two buckets"
    for i, group in enumerate(groups):
        limit = first_cap if i == 0 else cap
        assert len({p.dtype for _, p in group}) == 1
        assert nbytes(group) <= limit or len({owner(n) for n, _ in group}) == 1  # only a lone module may be over
        if i + 1 < len(groups):  # a new bucket starts only when the next module does not fit or differs in kind
            after = [(n, p) for n, p in groups[i + 1] if owner(n) == owner(groups[i + 1][0][0])]
            assert nbytes(group) + nbytes(after) > limit or after[0][1].dtype != group[0][1].dtype


def test_a_bucket_of_many_small_gradients_lends_its_views_and_one_of_few_large_gradients_does_not() -> None:
    """Lending a bucket's views to backward costs two passes over the bucket (zeroing it, and
    reading the zeros back) and saves a copy from Python per parameter: on the CPU a bucket of
    many small gradients lends them whatever its size, and autograd then adds into it; one as
    large of a few large gradients copies them in. On CUDA every bucket lends."""
    def bucket(sizes: list[int]) -> Bucket:
        params = [torch.nn.Parameter(torch.ones(n)) for n in sizes]
        offsets = [sum(sizes[:k]) for k in range(len(sizes))]
        made = Bucket(0, params, [f"p{k}" for k in range(len(sizes))], offsets, torch.full((sum(sizes),), 7.0))
        made.dense = True  # a step has shown every gradient of it dense
        return made

    cpu = Device().lend_grad_bytes
    small, large = bucket([4096] * 128), bucket([1 << 18] * 2)  # 2 MiB each: of 16 KiB gradients, of 1 MiB
    assert small.lend_views(cpu) and all(p.grad is v for p, v in zip(small.params, small.views, strict=True))
    sum((k + 1) * p.sum() for k, p in enumerate(small.params)).backward()
    assert all(p.grad is v for p, v in zip(small.params, small.views, strict=True))  # added into, not replaced
    expected = torch.cat([torch.full((4096,), float(k + 1)) for k in range(128)])
    assert torch.equal(small.flat, expected)  # zeroed first: nothing of what the bucket held before
    assert not large.lend_views(cpu) and all(p.grad is None for p in large.params)
    assert large.lend_views(CudaDevice.lend_grad_bytes) and large.params[1].grad is large.views[1]
    small.params[0].grad = torch.ones(4096)  # a gradient accumulated already (no_sync) is adopted, never zeroed
    assert not small.lend_views(CudaDevice.lend_grad_bytes)


@pytest.mark.parametrize("strided", [True, False], ids=["cpu-cuda", "mps"])
def test_a_bucket_s_views_follow_their_parameters_into_channels_last_and_keep_what_they_hold(strided) -> None:
    """A module converted after wrapping (``.to(memory_format=torch.channels_last)``) gives its
    parameters new memory and sets each gradient's ``.data``, our view, to a converted copy.
    The bucket finds both moved and makes the view again in the bucket, in the parameter's
    layout where the device takes such views (plain on MPS), with what the gradient held."""
    conv = torch.nn.Conv2d(3, 4, 2)
    params = list(conv.parameters())
    sizes = [p.numel() for p in params]
    bucket = Bucket(0, params, ["weight", "bias"], [0, sizes[0]], torch.zeros(sum(sizes)), strided=strided)
    for p, view in zip(params, bucket.views, strict=True):
        p.grad = view
    conv.weight.grad.copy_(torch.arange(sizes[0], dtype=torch.float32).view_as(conv.weight))
    held = conv.weight.grad.clone()
    assert bucket.moved() == []
    conv.to(memory_format=torch.channels_last)
    assert bucket.moved() == [0] and conv.weight.grad.data_ptr() != bucket.flat.data_ptr()  # out of the bucket
    bucket.mend_view(0)
    assert bucket.moved() == [] and conv.weight.grad is bucket.views[0]
    assert conv.weight.grad.data_ptr() == bucket.flat.data_ptr()  # back at its place, the bucket's start
    assert torch.equal(conv.weight.grad, held)  # the same values, wherever they lie
    assert conv.weight.grad.is_contiguous(memory_format=torch.channels_last) == strided
    assert torch.equal(bucket.flat[:sizes[0]], (held.permute(0, 2, 3, 1) if strided else held).flatten())


# -- host arithmetic threads ------------------------------------------------------------------
@pytest.mark.skipif(not torch.backends.openmp.is_available(), reason="torch built without OpenMP")
def test_a_small_collective_runs_its_arithmetic_on_its_own_thread_only() -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    inside, release = threading.Event(), threading.Event()
    seen: dict[str, int] = {}

    def collective_thread() -> None:
        with hostops.threads_for(1024, inline_bytes=4096):
            seen["small"] = torch.get_num_threads()
            inside.set()
            release.wait(10)
        seen["after"] = torch.get_num_threads()
        with hostops.threads_for(8192, inline_bytes=4096):
            seen["large"] = torch.get_num_threads()
        with pytest.raises(KeyError), hostops.threads_for(1024, inline_bytes=4096):
            raise KeyError("a failed collective")
        seen["after error"] = torch.get_num_threads()

    try:
        worker = threading.Thread(target=collective_thread)
        worker.start()
        assert inside.wait(10)
        seen["training thread meanwhile"] = torch.get_num_threads()
        release.set()
        worker.join(10)
    finally:
        torch.set_num_threads(before)
    assert seen == {"small": 1, "training thread meanwhile": 2, "after": 2, "large": 2, "after error": 2}


# -- the example's data -----------------------------------------------------------------------
def test_mnist_example_reads_idx_files_raw_or_gzipped_with_plain_python(tmp_path) -> None:
    g = torch.Generator().manual_seed(0)
    for name, shape, gz in (("train-images-idx3-ubyte", (600, 28, 28), True), ("train-labels-idx1-ubyte", (600,), False),
                            ("t10k-images-idx3-ubyte", (100, 28, 28), True), ("t10k-labels-idx1-ubyte", (100,), False)):
        high = 10 if "labels" in name else 256
        write_idx(tmp_path / (name + (".gz" if gz else "")), torch.randint(0, high, shape, generator=g))
    sys.path.insert(0, str(MNIST.parent))
    import data  # the example's own module

    (x, y), (xt, yt) = data.load_idx_dir(str(tmp_path))
    assert x.shape == (600, 1, 28, 28) and x.dtype == torch.float32 and y.shape == (600,) and xt.shape[0] == 100
    raw = torch.tensor(list(gzip.open(tmp_path / "train-images-idx3-ubyte.gz").read()[16:16 + 784]))
    assert torch.allclose(x[0].flatten(), (raw.float() / 255 - data.MEAN) / data.STD)
    out = subprocess.run([sys.executable, str(MNIST), "--epochs", "1", "--data-url", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"MNIST from {tmp_path}" in out.stdout and "test accuracy" in out.stdout


def test_a_mac_is_kept_awake_while_the_agent_lives(tmp_path, monkeypatch) -> None:
    """On macOS the agent holds caffeinate's assertion, tied to its own pid; elsewhere nothing
    starts. caffeinate cannot run here: a stand-in at its path records how it was called."""
    from macfleet.workers import awake

    assert awake.keep_awake(os.getpid()) is None  # this is Linux: nothing to hold
    called = tmp_path / "argv"
    stand_in = tmp_path / "caffeinate"
    stand_in.write_text(f"#!/bin/sh\necho \"$@\" > {called}\nexec sleep 60\n")
    stand_in.chmod(0o755)
    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setattr(awake, "CAFFEINATE", str(stand_in))
    guard = awake.keep_awake(4242)
    assert guard is not None
    try:
        deadline = time.monotonic() + 10
        while not (called.exists() and called.read_text()) and time.monotonic() < deadline:
            time.sleep(0.02)  # polling for the stand-in to have started
        assert called.read_text().split() == ["-i", "-s", "-w", "4242"]
        awake.let_sleep(guard)
        assert guard.poll() is not None  # given back when the agent finishes
    finally:
        guard.kill()
        guard.wait()
    monkeypatch.setattr(awake, "CAFFEINATE", str(tmp_path / "missing"))
    assert awake.keep_awake(4242) is None  # a Mac without it: the job runs all the same


def test_a_checkpoint_that_cannot_be_written_is_named_and_leaves_nothing(tmp_path) -> None:
    """A full disk, a path through a file: the error named rank 0's temporary file, not the
    checkpoint."""
    from macfleet.checkpoint import atomic_save

    (tmp_path / "a-file").write_text("")
    path = tmp_path / "a-file" / "ck.pt"
    with pytest.raises(OSError, match=f"cannot write checkpoint {path}: "):
        atomic_save({"step": 1}, str(path))
    assert [p.name for p in tmp_path.iterdir()] == ["a-file"]


def test_the_root_cause_is_the_first_failure_to_arrive_whatever_the_hosts_clocks() -> None:
    """Rank 1 fails on a Mac whose clock runs ahead; rank 0, told of it, exits with PeerLost on
    a Mac whose clock is behind. Ordered by the agents' clocks, rank 0 was the root cause."""
    import zmq

    from macfleet.control import ControlClient
    from macfleet.launcher.coordinator import Coordinator
    from macfleet.protocol import EXIT, WorkerExit

    ctx = zmq.Context()
    secret = os.urandom(32)
    coord = Coordinator(ctx, ["127.0.0.1"], secret, "job", world_size=2, num_agents=2, log=lambda _: None)
    agents = [ControlClient(ctx, coord.endpoints["127.0.0.1"], secret, "job", f"agent-{i}") for i in range(2)]
    try:
        now = time.time()
        for agent, rank, clock, kind in ((agents[1], 1, now + 5, "ValueError"), (agents[0], 0, now - 5, "PeerLost")):
            agent.send(EXIT, **WorkerExit(rank, f"mac{rank}", 100 + rank, 1, None, clock, {"type": kind}).to_fields())
            deadline = time.monotonic() + 10
            while rank not in coord.exits and time.monotonic() < deadline:
                coord.poll(0.1)
        root = coord.root_cause()
        assert root is not None and root.rank == 1, root
    finally:
        for agent in agents:
            agent.close()
        coord.close()
        ctx.destroy(linger=0)


@contextlib.contextmanager
def _registered_ranks(world: int, stall_timeout_s: float = 1.0) -> Iterator[tuple[Any, list[Any], list[str]]]:
    """A coordinator (aborting stalls after ``stall_timeout_s``) on real control sockets, and a
    registered control client for each of ``world`` ranks on hosts ``mac{r}``: (coordinator,
    clients, the coordinator's log). Everything is closed after the block."""
    import zmq

    from macfleet.control import ControlClient
    from macfleet.launcher.coordinator import Coordinator
    from macfleet.protocol import REGISTER

    ctx = zmq.Context()
    secret, logged = os.urandom(32), []
    coord = Coordinator(ctx, ["127.0.0.1"], secret, "job", world_size=world, num_agents=1,
                        stall_timeout_s=stall_timeout_s, log=logged.append)
    ranks = [ControlClient(ctx, coord.endpoints["127.0.0.1"], secret, "job", f"rank-{r}") for r in range(world)]
    try:
        for r, client in enumerate(ranks):
            client.send(REGISTER, rank=r, endpoints={}, host=f"mac{r}", local_rank=0)
        yield coord, ranks, logged
    finally:
        for client in ranks:
            client.close()
        coord.close()
        ctx.destroy(linger=0)


def _stall_log(waits: list[tuple[int, float] | None], seconds: float, stall_timeout_s: float = 1.0,
               beats: list[dict] | None = None) -> tuple[list[str], object]:
    """A coordinator (stall timeout 1 s unless given, aborting) and ranks that beat every 0.2 s
    for ``seconds`` or until a stall is logged or the job aborted: rank r in all-reduce op
    ``waits[r][0]`` for ``waits[r][1]`` s at line 10 + r, or out of any collective (None), with
    ``beats[r]`` in its beats too. Returns the log and the abort."""
    from macfleet.protocol import BEAT

    with _registered_ranks(len(waits), stall_timeout_s) as (coord, ranks, logged):
        deadline = time.monotonic() + seconds
        while not any("stall:" in line for line in logged) and coord.aborted is None and time.monotonic() < deadline:
            for r, (client, wait) in enumerate(zip(ranks, waits)):  # nothing has arrived for 9 s
                site = {"op": "all_reduce", "id": wait[0], "for_s": wait[1], "at": f"train.py:{10 + r}"} if wait else None
                client.send(BEAT, progress=4, quiet_s=9.0, waiting=site, **(beats[r] if beats else {}))
            coord.poll(0.2)
        return logged, coord.aborted


def test_a_stall_names_only_the_rank_out_of_the_collective_not_one_that_just_joined_it() -> None:
    """Rank 1 works alone; ranks 0 and 2 wait for it in all-reduce 5, rank 0 for less than the
    stall timeout (it got there a second after rank 2, on a busy Mac). Only rank 1 is named: the
    report said "ranks 0, 1 made no progress"."""
    logged, _ = _stall_log([(5, 0.4), None, (5, 1.5)], seconds=10)
    stall = next((line for line in logged if "stall:" in line), "")
    assert "stall: rank 1 (mac1) made no progress" in stall, logged


def test_a_collective_the_last_rank_has_just_joined_is_no_stall() -> None:
    """Ranks 0 and 2 have waited past twice the stall timeout; rank 1, which they waited for,
    has just joined their all-reduce, which now runs. Its late arrival is neither named nor
    aborted (it was named, asked for its stacks, and aborted when it did not answer)."""
    logged, aborted = _stall_log([(5, 3.0), (5, 0.1), (5, 3.0)], seconds=3 * 1.0 + 0.5)
    assert not any("stall:" in line for line in logged) and aborted is None, (logged, aborted)
    logged, aborted = _stall_log([(5, 3.0), (6, 0.1), (5, 3.0)], seconds=10)  # in another collective: it is named
    assert any("stall: rank 1 (mac1) made no progress" in line for line in logged), logged


def _rank_0_beats_until(coord: Any, ranks: list[Any], logged: list[str], ends: float, every_s: float) -> None:
    """Rank 0 beats on time, out of any collective, every ``every_s`` until ``ends`` or until a
    stall is logged."""
    from macfleet.protocol import BEAT

    while not any("stall:" in line for line in logged) and time.monotonic() < ends:
        ranks[0].send(BEAT, progress=2, quiet_s=9.0, waiting=None)
        coord.poll(every_s)


def test_a_late_beat_from_a_rank_that_receives_data_does_not_make_its_source_a_stall() -> None:
    """Rank 1 waits in a broadcast whose data keeps arriving (its beat: the last bytes came 0.1 s
    ago), and its next beats are late, as on a loaded Mac; rank 0, the source, is in no
    collective. A beat over two beats old counted as no data at all, and rank 0 was named
    "made no progress" (a flake of the slow-link test in a loaded run). What the last beat said
    stands until the next one: once that says nothing has arrived for over the stall timeout,
    rank 0 is named."""
    from macfleet.protocol import BEAT, HEARTBEAT_S

    with _registered_ranks(2) as (coord, ranks, logged):
        def receiving(quiet_s: float, for_s: float) -> None:
            ranks[1].send(BEAT, progress=1, quiet_s=quiet_s, waiting={"op": "broadcast", "id": 2, "for_s": for_s})

        receiving(0.1, 1.5)
        _rank_0_beats_until(coord, ranks, logged, time.monotonic() + 3 * HEARTBEAT_S, 0.2)  # rank 1's: 3 beats old
        assert not any("stall:" in line for line in logged) and coord.aborted is None, logged
        receiving(2.0, 4.5)  # nothing has come for 2 s: the broadcast is stuck
        _rank_0_beats_until(coord, ranks, logged, time.monotonic() + 10, 0.2)
        assert any("stall: rank 0 (mac0) made no progress" in line for line in logged), logged


def test_a_wait_that_ended_right_after_a_rank_s_beat_does_not_name_the_rank_it_waited_for() -> None:
    """Rank 1's beat says it has waited 0.3 s in a barrier, which ends a moment later; its next
    beat is a second away. Rank 0, through the barrier, beats on time out of any collective. The
    time since rank 1's beat counted as waiting, and 0.7 s later, at the 1 s stall timeout, rank
    0 was named "made no progress" (the slow-link test's flake in a loaded run). Once a beat
    itself says the wait has lasted over the timeout, rank 0 is named."""
    from macfleet.protocol import BEAT, HEARTBEAT_S

    with _registered_ranks(2) as (coord, ranks, logged):
        ranks[1].send(BEAT, progress=0, quiet_s=9.0, waiting={"op": "all_reduce", "id": 1, "for_s": 0.3})
        _rank_0_beats_until(coord, ranks, logged, time.monotonic() + 1.5 * HEARTBEAT_S, 0.1)  # rank 1's next: late
        assert not any("stall:" in line for line in logged), logged
        ranks[1].send(BEAT, progress=0, quiet_s=9.0, waiting={"op": "all_reduce", "id": 1, "for_s": 1.9})
        _rank_0_beats_until(coord, ranks, logged, time.monotonic() + 5, 0.1)
        assert any("stall: rank 0 (mac0) made no progress" in line for line in logged), logged


def test_ranks_waiting_in_different_collectives_with_nothing_arriving_are_named_by_the_stall_report() -> None:
    """The backstop behind the messages' own checks (each names its collective and number, so
    ranks in different collectives find out from the first one that reaches them): ranks that
    wait in collectives of different numbers and hear nothing are named, with where each
    waits, once a stall timeout has passed."""
    logged, _ = _stall_log([(5, 2.0), (6, 2.0)], seconds=10)
    stall = next(line for line in logged if "stall:" in line)
    assert "different collectives" in stall, logged
    assert "rank 0 in all_reduce (op 5, at train.py:10); rank 1 in all_reduce (op 6, at train.py:11)" in stall


def test_a_rank_that_works_on_after_leaving_a_collective_is_named_with_the_stall_check_off() -> None:
    """--stall-timeout 0: rank 0 left all-reduce 5 by an exception its script caught, and works
    on without a collective; rank 1 waits in that all-reduce, which cannot finish. The job went
    on until the collective timeout (10 minutes) ended it as a timeout. Now a minute's grace
    (for the exception to end the script instead) is all the others wait."""
    from macfleet.launcher.coordinator import HALFWAY_GRACE_S

    left = {"broken": {"op": 5, "what": "all_reduce (op 5)", "error": "RuntimeError: MPS out of memory",
                       "went_on": False}}
    for waited, stopped in ((HALFWAY_GRACE_S - 5, False), (HALFWAY_GRACE_S + 1, True)):
        logged, aborted = _stall_log([None, (5, waited)], seconds=2, stall_timeout_s=0, beats=[left, {}])
        assert (aborted is not None) == stopped, (waited, aborted, logged)
    assert aborted.startswith("rank 0 (mac0) left all_reduce (op 5) by an exception (RuntimeError: MPS out of memory) "
                              "that the script caught, and works on without it"), aborted
    assert not any("stall:" in line for line in logged), logged  # the stall check stays off


def test_a_rank_whose_script_failed_and_whose_process_stays_ends_the_job_a_stall_timeout_later() -> None:
    """Rank 0's script raised, and its process waits for a thread of the script that never
    ends; rank 1 waits in no collective (it finished its steps). The job waited for rank 0's
    exit for good; the stall check sees no one waiting. A stall timeout (1 s) ends it, not less."""
    ended = [{"ended": "ValueError: boom"}, {}]
    _, aborted = _stall_log([None, None], seconds=0.6, beats=ended)
    assert aborted is None, aborted  # its atexit handlers may still be at work
    _, aborted = _stall_log([None, None], seconds=5, beats=ended)
    assert aborted is not None and aborted.startswith(
        "rank 0 (mac0) failed (ValueError: boom), and its process has not exited 1 s later"), aborted


def test_an_exit_of_any_size_fits_one_control_message() -> None:
    """Tracebacks and tails of any size and script (multi-byte UTF-8 too) must pack into one
    header the coordinator takes, with the ends of each text kept."""
    from macfleet.protocol import WorkerExit

    for char in ("x", "é", "漢", "🙂"):
        huge = "start " + char * 50_000 + " END"
        exit_ = WorkerExit(1, "mac", 7, 1, None, 0.0, {"type": "ValueError", "message": huge, "traceback": huge},
                           [huge] * 40)
        fitted = exit_.fitted()
        _, header = wire.pack(os.urandom(32), {"job": "j", "kind": "exit", "from": "agent-0", "seq": 1,
                                               **fitted.to_fields()})
        assert len(header) <= wire.MAX_HEADER_BYTES, (char, len(header))
        text = fitted.error["traceback"]
        assert text.startswith("start ") and text.endswith(" END") and "bytes cut" in text
        assert fitted.tail and fitted.tail[-1].endswith(" END")


def test_only_a_sigkill_that_macfleet_did_not_send_is_taken_for_memory() -> None:
    """The report's out-of-memory hint is for a SIGKILL from outside: not for one the rank's
    agent sent after the grace period, nor for another signal."""
    from macfleet.launcher.coordinator import Failure
    from macfleet.launcher.report import failure_report
    from macfleet.protocol import WorkerExit

    def report(signame: str, stopped: str | None, peak: int | None) -> str:
        exit_ = WorkerExit(0, "mini", 7, 137, signame, 0.0, stopped=stopped, peak_rss=peak, host_memory=16 << 30)
        return failure_report(Failure(0.0, "exit", 0, exit_), {0: exit_}, 1)

    assert "held 6.5 GiB of memory, of the 16.0 GiB that mini has" in report("SIGKILL", None, 13 << 29)
    assert "memory runs out" in report("SIGKILL", None, None) and "GiB" not in report("SIGKILL", None, None)
    assert "memory" not in report("SIGKILL", "stopped by its agent: the launcher went silent", 1 << 30)
    assert "memory" not in report("SIGTERM", None, 1 << 30)


def test_an_error_macfleet_raises_on_purpose_ends_its_traceback_at_the_script_s_call(monkeypatch) -> None:
    """A rank's traceback of a MacfleetError (or a Ctrl-C) stops at the last frame outside
    macfleet (here the test's, standing for the script's): its message says what went wrong.
    Frames of the script's own code that macfleet called stay, and so does every frame of any
    other error."""
    from macfleet import knobs
    from macfleet.workers.bootstrap import without_macfleet_frames

    def raised(call: Any) -> BaseException:
        try:
            call()
        except BaseException as exc:
            return exc
        raise AssertionError(f"{call} raised nothing")

    def files(exc: BaseException) -> list[str]:
        return [os.path.basename(frame.filename) for frame in traceback.extract_tb(exc.__traceback__)]

    here = os.path.basename(__file__)
    bad = {"MACFLEET_STREAMS": "two"}
    exc = raised(lambda: knobs.count("MACFLEET_STREAMS", 1, bad))
    assert isinstance(exc, ConfigError) and files(exc) == [here, here, "knobs.py", "knobs.py"]
    assert without_macfleet_frames(exc) == 2 and files(exc) == [here, here]

    # the script's code that macfleet called (here a check of a knob's value) stays, and the frame that called it
    def check(value: int) -> bool:
        return knobs.count("MACFLEET_STREAMS", 1, bad) == value

    exc = raised(lambda: knobs._read("X", 1, {"X": "1"}, int, "", "", check))
    assert files(exc) == [here, here, "knobs.py", here, "knobs.py", "knobs.py"], files(exc)
    assert without_macfleet_frames(exc) == 2 and files(exc) == [here, here, "knobs.py", here]
    # raised in a thread and again by the script's: Python's own frames in between go too
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        exc = raised(lambda: pool.submit(knobs.count, "MACFLEET_STREAMS", 1, bad).result())
    assert "thread.py" in files(exc) and without_macfleet_frames(exc) >= 4 and files(exc) == [here, here], files(exc)
    # a Ctrl-C that came while macfleet waited (a rank in a collective): where in the script is the news
    exc = raised(lambda: knobs._read("X", 1, {"X": "1"}, functools.partial(signal.default_int_handler, 2), "", "",
                                     bool))
    assert isinstance(exc, KeyboardInterrupt) and without_macfleet_frames(exc) == 1 and files(exc) == [here, here]
    # not macfleet's on purpose (a bug of macfleet's would be this): every frame kept
    exc = raised(lambda: knobs.parse_size("lots"))
    assert isinstance(exc, ValueError) and without_macfleet_frames(exc) == 0 and files(exc)[-1] == "knobs.py"

    def again(first: Any) -> None:  # an error raised while handling another, as a thread's raised again
        try:
            first()
        except BaseException:
            knobs.switch("MACFLEET_SHM", True, {"MACFLEET_SHM": "yes"})

    exc = raised(lambda: again(lambda: knobs.count("MACFLEET_STREAMS", 1, bad)))
    without_macfleet_frames(exc)
    assert "During handling" not in "".join(traceback.format_exception(exc))
    def raise_own() -> None:  # the script's own, raised while handling macfleet's: all said
        try:
            knobs.count("MACFLEET_STREAMS", 1, bad)
        except ConfigError:
            raise ConfigError("the script's own")

    exc = raised(raise_own)
    assert without_macfleet_frames(exc) == 0 and "During handling" in "".join(traceback.format_exception(exc))
    exc = raised(lambda: again(lambda: {}["key"]))  # the script's own error first: kept
    without_macfleet_frames(exc)
    assert "During handling" in "".join(traceback.format_exception(exc)) and "KeyError" in repr(exc.__context__)
    monkeypatch.setenv("MACFLEET_FULL_TRACEBACK", "1")
    exc = raised(lambda: knobs.count("MACFLEET_STREAMS", 1, bad))
    assert without_macfleet_frames(exc) == 0 and files(exc)[-1] == "knobs.py"


def report_of_raised(call: Any, path: Any) -> str:
    """The launcher's report of a job of one whose rank raised what ``call`` raises, its error
    file written (at ``path``) as a rank's bootstrap writes it."""
    from macfleet import errorfile
    from macfleet.launcher.coordinator import Failure
    from macfleet.launcher.report import failure_report
    from macfleet.protocol import WorkerExit

    try:
        call()
    except Exception as raised:
        errorfile.write(str(path), raised)
    else:
        raise AssertionError(f"{call} raised nothing")
    exit_ = WorkerExit(0, "mini", 7, 1, None, 0.0, error=json.loads(path.read_text()))
    return failure_report(Failure(0.0, "exit", 0, exit_), {0: exit_}, 1)


def test_a_collective_that_timed_out_names_the_timeout_and_how_to_raise_it(tmp_path) -> None:
    """Rank 0 preparing the data for longer than the collective timeout while the others wait
    (the stall check lets a working rank be): the error said 'did not reach a barrier within
    600 s', and nothing of MACFLEET_TIMEOUT."""
    from macfleet.errors import CollectiveTimeout

    def timed_out() -> None:
        raise CollectiveTimeout("local rank 0: local ranks [1] of this host did not reach a barrier within 600 s")

    def other() -> None:
        int("x")

    hint = "give the timeout above that work's length: macfleet launch --env MACFLEET_TIMEOUT=3600"
    report = report_of_raised(timed_out, tmp_path / "error.json")
    assert "did not reach a barrier within 600 s" in report and hint in report
    assert hint not in report_of_raised(other, tmp_path / "other.json")


def test_ranks_that_waited_out_the_rendezvous_name_its_timeout_and_how_to_raise_it(tmp_path) -> None:
    """A rank downloading the data before macfleet.init() for over 10 minutes: the others' error
    said 'not every rank registered within 600 s', and nothing of what to change."""
    from macfleet.errors import RendezvousError

    def waited_out() -> None:
        raise RendezvousError("rank 0: not every rank registered within 600 s (coordinator tcp://10.0.0.2:5000)")

    def unreachable() -> None:
        raise RendezvousError("rank 2 published no endpoint for channel ring-0")

    hint = "give the timeout above that work's length: macfleet launch --env MACFLEET_RENDEZVOUS_TIMEOUT=3600"
    report = report_of_raised(waited_out, tmp_path / "error.json")
    assert hint in report
    assert hint not in report_of_raised(unreachable, tmp_path / "other.json")


def test_a_rank_out_of_the_memory_of_a_gpu_it_shares_is_told_its_share(tmp_path, monkeypatch) -> None:
    """Out of GPU memory, torch names neither the share macfleet capped the rank at nor that its
    own advice (PYTORCH_MPS_HIGH_WATERMARK_RATIO) cannot lift it. The error file (written as the
    rank's bootstrap writes it) carries the share to the report."""
    def report(exc: Exception, fraction: str | None) -> str:
        if fraction is None:
            monkeypatch.delenv("MACFLEET_MEMORY_FRACTION", raising=False)
        else:
            monkeypatch.setenv("MACFLEET_MEMORY_FRACTION", fraction)

        def raise_it() -> None:
            raise exc

        return report_of_raised(raise_it, tmp_path / "error.json")

    hint = "this rank may use 0.45 of its GPU's memory"
    # torch.cuda's name: torch 2.1 has no torch.OutOfMemoryError, which is the same class where it is
    cuda = torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")
    mps = RuntimeError("MPS backend out of memory (MPS allocated: 8.1 GB, other allocations: 1.2 MB, max allowed: "
                       "8.2 GB). Tried to allocate 512.00 MB on private pool. Use PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 "
                       "to disable upper limit for memory allocations (may cause system failure).")
    for exc in (cuda, mps):
        said = report(exc, "0.45")
        assert hint in said and "fewer ranks on mini, or a larger --memory-fraction" in said, said
    assert "of its GPU's memory" not in report(cuda, None)  # a GPU of its own: nothing macfleet capped
    assert "of its GPU's memory" not in report(ValueError("out of range"), "0.45")


def test_a_torch_distributed_call_left_in_a_ported_script_is_answered_with_macfleet_s(tmp_path) -> None:
    """A DDP script half moved to macfleet: macfleet.init() in place of init_process_group, and
    torch's DistributedSampler (or a dist call) kept. torch's error says to call
    init_process_group; the report says what macfleet has in its place. The errors are torch's
    own, raised here without a process group, and written as a rank's bootstrap writes them.
    (DDP itself kept, and the script's own init_process_group, runs as under torchrun.) A
    Horovod script run as it is, without Horovod, is pointed to macfleet's calls too."""
    import torch.distributed as dist
    from torch.utils.data.distributed import DistributedSampler as TorchSampler

    def report(call: Any) -> str:
        return report_of_raised(call, tmp_path / "error.json")

    assert not dist.is_initialized()
    sampler = report(lambda: TorchSampler(range(10)))
    assert "use macfleet.DistributedSampler, which takes the same options" in sampler, sampler
    ddp = report(lambda: torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2)))
    assert "use macfleet.DataParallel(model), which takes DDP's options" in ddp, ddp
    rank = report(dist.get_world_size)
    assert "does not set up torch.distributed: in place of dist.get_world_size(...), macfleet.world_size() (" in rank
    # An evaluation's reduce or gather to rank 0 is the all-call, which gives every rank the result.
    summed = report(lambda: dist.reduce(torch.ones(2), dst=0))
    assert "in place of dist.reduce(...), macfleet.all_reduce(t) gives every rank the result" in summed, summed
    gathered = report(lambda: dist.gather(torch.ones(2), dst=0))
    assert "in place of dist.gather(...), out = macfleet.all_gather(t) gives every rank" in gathered, gathered
    lacking = report(lambda: dist.all_to_all_single(torch.ones(2), torch.ones(2)))  # none of macfleet's
    assert "macfleet.init() does not set up torch.distributed: use macfleet's calls" in lacking, lacking
    if importlib.util.find_spec("horovod") is None:  # a Horovod script run as it is, where Horovod is not
        horovod = report(lambda: __import__("horovod"))
        assert "macfleet has one for each (hvd.init() is macfleet.init()" in horovod, horovod
    other = report(lambda: TorchSampler(range(10), num_replicas=2, rank=5))  # another of its errors: no hint
    assert not any(hint in other for hint in ("use macfleet.DistributedSampler", "init() does not set up")), other


def test_a_ddp_script_with_its_model_on_a_mac_s_gpu_is_answered_with_macfleet_dataparallel(tmp_path) -> None:
    """torch.distributed has no backend for mps, and a DDP script moved to Macs with its model
    on the GPU fails in gloo's check of the tensor's device or in c10d's lookup of a backend for
    it (or, on torch 2.6, in init_process_group() without a backend); no message says what
    runs on mps. torch raises them only on a Mac: the texts are torch's, as a Mac printed them
    (DDP on torch 2.4, ultralytics pull request 15701; torch issue 149537) and as c10d words
    them (ProcessGroup.hpp's getBackend; ProcessGroupGloo.cpp's "unsupported device type")."""
    def report(message: str) -> str:
        def raised() -> None:
            raise RuntimeError(message)
        return report_of_raised(raised, tmp_path / "error.json")

    options = ("TensorOptions(dtype=long long, device={}, layout=Strided, requires_grad=false (default), "
               "pinned_memory=false (default), memory_format=(nullopt))")
    ddp = (f"ProcessGroupGloo::allgather: invalid tensor type at index 0 (expected {options.format('cpu')}, "
           f"got {options.format('mps:0')})")
    hint = "torch.distributed has no backend for a Mac's GPU (gloo takes CPU tensors only): train on mps with"
    unnamed = ("We detected accelerator mps on your machine. But we don't know which communication backend to use "
               "for this accelerator. Please specify the `backend` argument in the `init_process_group` call.")
    for message in (ddp, "No backend type associated with device type mps",
                    "ProcessGroupGloo::allreduce: unsupported device type mps", unnamed):
        said = report(message)
        assert hint in said and "macfleet.DataParallel(model), which takes DDP's options" in said, said
    for other in (ddp.replace("mps:0", "meta"), "No backend type associated with device type npu"):
        assert hint not in report(other), other


def test_a_float64_tensor_on_a_mac_s_gpu_is_answered_with_where_it_comes_from(tmp_path) -> None:
    """Metal has no float64, and torch's message says to use float32 but not where the float64
    came from: on a Mac, NumPy's arrays (float64 by default), or, with a torch from before MPS
    had GradScaler's kernels, the GradScaler's own unscale_ (torch issue 142397). torch raises
    these only on a Mac: the text is torch's (mps-facts.md section 4), raised here from a
    function named as torch's GradScaler file names it, or from the script."""
    message = ("Cannot convert a MPS Tensor to float64 dtype as the MPS framework doesn't support float64. "
               "Please use float32 instead.")
    scaler: dict[str, Any] = {}
    exec(compile(f"def unscale_():\n    raise TypeError({message!r})\n",  # noqa: S102 - a stand-in of torch's file
                 "/opt/python/site-packages/torch/amp/grad_scaler.py", "exec"), scaler)

    def in_the_script() -> None:
        raise TypeError(message)

    by_scaler = report_of_raised(scaler["unscale_"], tmp_path / "error.json")
    assert "this torch's GradScaler keeps its scale in float64" in by_scaler, by_scaler
    assert "torch.from_numpy(a).float()" not in by_scaler, by_scaler
    elsewhere = report_of_raised(in_the_script, tmp_path / "error.json")
    assert "torch.from_numpy(a).float().to(macfleet.device())" in elsewhere, elsewhere
    assert "GradScaler" not in elsewhere, elsewhere
    other = report_of_raised(lambda: torch.zeros(2).to(torch.float64).view(torch.int8).view(3), tmp_path / "e.json")
    assert "no float64" not in other, other


def nn_module_attribute(name: str) -> object:
    """An attribute a module lacks: AttributeError("'Linear' object has no attribute ...")."""
    return getattr(torch.nn.Linear(1, 1), name)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a torch without CUDA (a Mac's, or a CPU build)")
def test_a_cuda_call_left_in_a_script_moved_to_macs_is_answered_with_macfleet_device(tmp_path) -> None:
    """A CUDA script moved to Macs that kept .cuda() or torch.cuda.set_device(local_rank) fails
    with torch's "Torch not compiled with CUDA enabled" (or, for set_device, a missing
    attribute of torch._C), which does not say what to write; so does a DDP script that kept
    NCCL. Torch's own errors, raised here."""
    def report(call: Any) -> str:
        return report_of_raised(call, tmp_path / "error.json")

    hint = "mini has no CUDA (a Mac's GPU is mps): put the model and tensors on macfleet.device()"
    for call in (lambda: torch.zeros(1).cuda(), lambda: torch.cuda.set_device(0), lambda: torch.ones(1, device="cuda")):
        said = report(call)
        assert hint in said, said
    for call in (lambda: torch.ones(1, device="nowhere"), lambda: nn_module_attribute("_cuda_graph")):
        other = report(call)
        assert "has no CUDA" not in other, other
    import torch.distributed as dist

    nccl = report(lambda: dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1))
    assert "NCCL needs NVIDIA GPUs, which mini does not have" in nccl and not dist.is_initialized(), nccl


def test_memory_fractions_that_add_up_past_one_gpu_are_warned_of_with_one_that_fits() -> None:
    """mps-facts.md rule 4: the shares of the ranks on one GPU add up to 1 at most (on a Mac
    that GPU's memory is the machine's, and past it the machine pages). ``--memory-fraction`` is
    each rank's share; where it breaks the rule, the warning's own advice must keep it."""
    from macfleet.env import oversubscribed, shared_memory_fraction

    for processes in range(1, 13):
        for fraction in (0.05, 0.1, 0.25, 0.34, 0.5, 0.9, 1.0):
            warning = oversubscribed(fraction, processes, "mps")
            assert (warning is not None) == (fraction * processes > 1), (fraction, processes)
            if warning:
                most = float(re.search(r"Give at most ([\d.]+) ", warning).group(1))
                assert most * processes <= 1 < (most + 0.01) * processes, warning
                assert f"{processes} ranks that share mps" in warning and "(without it each gets" in warning
                assert shared_memory_fraction(processes) * processes <= 1  # the default fits


def test_jobs_sharing_a_host_are_warned_of_memory_only_where_their_gpu_shares_add_up_past_it() -> None:
    """The same rule across jobs: each job's ranks on a GPU take 0.9 split among them (or their
    ``--memory-fraction``; a rank alone on its GPU is uncapped), whatever runs beside them. Jobs
    on the CPU take no share of a GPU, and neither does --device auto on a host without one (a
    Linux machine's CPU: two such jobs were warned of a GPU's memory). On a host of several GPUs
    a job's ranks take them in turn, so the first GPU holds the most of each job's ranks (two
    jobs of two ranks on two GPUs, one uncapped rank of each on each, were summed as four ranks
    on one GPU). Where the warning is given, its advice must keep the rule."""
    from macfleet.workers.other_jobs import JobNote, sharing

    now = 10_000.0
    for gpus in (0, 1, 2):
        for device in ("auto", "cpu", "cuda"):
            for ranks in range(1, 5):
                for fraction in (None, 0.1, 0.3, 0.6):
                    for other_device in ("mps", "auto", "cpu"):
                        other = JobNote("a", 42, 2, "train.py", now - 7500, other_device, None)
                        said = sharing("mini1", [other], ranks, device, fraction, gpus, now=now)
                        assert said.startswith("macfleet agent on mini1: another macfleet job is running here: 2 "
                                               "ranks of train.py, started 2 h 5 min ago (its agent: pid 42)"), said
                        jobs = [(n, share) for n, share, dev in ((ranks, fraction, device), (2, None, other_device))
                                if dev != "cpu" and not (dev == "auto" and gpus == 0)]
                        on_first = [(math.ceil(n / max(gpus, 1)), share) for n, share in jobs]
                        asked = sum(n * (share or (0.9 / n if n > 1 else 1.0)) for n, share in on_first)
                        assert ("times its memory" in said) == (asked > 1 + 1e-9), (said, asked)
                        if asked > 1:
                            total = sum(n for n, _ in on_first)
                            each = float(re.search(r"0\.9 at most \(([\d.]+) each\)", said).group(1))
                            assert f"the {total} ranks on one GPU" in said, said
                            assert each * total <= 0.9 < (each + 0.001) * total, said


def test_bench_sizes_are_weighed_against_each_host_s_memory_for_its_own_ranks() -> None:
    """Each host holds the tensors of its own ranks only; one whose memory is unknown is let be."""
    from macfleet.workers.benchallreduce import HELD_PER_SIZE, memory_shortfalls

    gib = 1 << 30
    fleet = [("mini1", 16 * gib), ("mini1", 16 * gib), ("mini2", 8 * gib), ("old", None)]
    assert HELD_PER_SIZE == 4  # the numbers below
    assert memory_shortfalls("1536M", fleet) == []
    assert memory_shortfalls("3G", fleet) == ["2 ranks on mini1 would hold about 24.0 GiB, and it has 16.0 GiB",
                                              "1 rank on mini2 would hold about 12.0 GiB, and it has 8.0 GiB"]
    assert memory_shortfalls("2G", fleet) == []  # exactly full still fits


def test_doctor_says_where_a_mac_has_much_less_memory_a_rank_than_another() -> None:
    from macfleet.launcher.doctor import memory_advice
    from macfleet.launcher.hosts import Host

    air, studio, mini = Host("air", 2), Host("studio", 2), Host("mini", 1)
    assert memory_advice([air, studio], [8.0, 64.0]) == [
        "air: 4.0 GiB of memory a rank, against 32.0 on studio: every rank holds the whole model and its part of the "
        "batch, so what fits air is what the job can train (fewer ranks on air give each more)"]
    assert memory_advice([mini, studio], [16.0, 64.0]) == [  # 16 a rank against 32: said, with no fewer to give
        "mini: 16.0 GiB of memory a rank, against 32.0 on studio: every rank holds the whole model and its part of "
        "the batch, so what fits mini is what the job can train"]
    assert memory_advice([mini, studio], [24.0, 64.0]) == []  # 24 against 32: near enough
    assert memory_advice([air, studio], [None, 64.0]) == [] and memory_advice([studio], [64.0]) == []


def test_the_layers_import_one_another_as_the_design_says() -> None:
    """DESIGN.md section 1: the launcher and the workers may import the library, which imports
    neither, and they never import each other (``macfleet/__main__.py`` is the ``macfleet``
    command, run by ``python -m macfleet``, not a module of the library). The library's runtime imported the workers'
    stack dumps, the bench's rank side the launcher's size parser, and the launcher the
    workers' command lines. And the launcher and the agent start without torch (seconds of every
    start on a cold Mac)."""
    import ast

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    banned = {"macfleet": ("macfleet.launcher", "macfleet.workers"), "launcher": ("macfleet.workers",),
              "workers": ("macfleet.launcher",)}
    found = []
    for folder, prefixes in banned.items():
        for name in sorted(os.listdir(os.path.join(root, folder))):
            if not name.endswith(".py") or (folder, name) == ("macfleet", "__main__.py"):
                continue  # ``python -m macfleet``: the command's entry point, as pyproject's script is; nothing imports it
            with open(os.path.join(root, folder, name)) as f:
                tree = ast.parse(f.read())
            for node in ast.walk(tree):
                modules = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                found += [f"{folder}/{name} imports {m}" for m in modules if m.startswith(prefixes)]
    assert found == []
    out = subprocess.run([sys.executable, "-c", "import sys, macfleet.launcher.cli, macfleet.workers.agent; "
                          "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_knobs_are_checked_and_named() -> None:
    """int() of MACFLEET_STREAMS=abc was a ValueError from every rank, MACFLEET_STREAMS=0 meant
    the default, a negative MACFLEET_TIMEOUT no wait at all, MACFLEET_SHM=yes on."""
    from macfleet import knobs

    bad = {"MACFLEET_STREAMS": "0", "MACFLEET_TIMEOUT": "-1", "MACFLEET_SHM": "yes", "MACFLEET_CHUNK_BYTES": "4X",
           "MACFLEET_CONNECT_TIMEOUT": "nan", "MACFLEET_SHM_SLOT_BYTES": "-4K"}
    found = knobs.problems(bad)
    assert len(found) == len(bad) and all(any(name in f for f in found) for name in bad), found
    good = {"MACFLEET_STREAMS": "2", "MACFLEET_TIMEOUT": "0.5", "MACFLEET_SHM": "0", "MACFLEET_CHUNK_BYTES": "4096",
            "MACFLEET_SHM_OBJECTS": "1", "MACFLEET_RENDEZVOUS_TIMEOUT": ""}
    assert knobs.problems(good) == []
    assert knobs.count("MACFLEET_STREAMS", None, good) == 2 and knobs.seconds("MACFLEET_TIMEOUT", 9, good) == 0.5
    assert knobs.switch("MACFLEET_SHM", True, good) is False and knobs.seconds("MACFLEET_RENDEZVOUS_TIMEOUT", 9, good) == 9
    # sizes as the README gives them, and as macfleet bench --sizes takes them
    assert [knobs.nbytes("MACFLEET_CHUNK_BYTES", 1, {"MACFLEET_CHUNK_BYTES": v}) for v in ("4M", "64K", "1.5MiB")] == \
        [4 << 20, 64 << 10, 3 << 19]


def test_a_faulthandler_dump_is_tidied_like_a_traceback(tmp_path) -> None:
    """A silent rank's stacks come from faulthandler (innermost first, no source, no thread
    names): the report shows them as a traceback, a user thread kept, an idle pool's left out."""
    import faulthandler
    import queue
    from concurrent.futures import ThreadPoolExecutor

    from macfleet.workers import dumps

    pool = ThreadPoolExecutor(1, thread_name_prefix="macfleet-ring")  # idle: stdlib frames alone
    pool.submit(int).result()
    inbox: queue.Queue = queue.Queue()
    started = threading.Event()

    def waits_for_work() -> None:
        started.set()
        inbox.get()  # blocks in queue.py, then threading.py's Condition.wait

    thread = threading.Thread(target=waits_for_work, daemon=True)
    thread.start()
    started.wait(10)
    deadline = time.monotonic() + 10
    while sys._current_frames()[thread.ident].f_code.co_name != "wait" and time.monotonic() < deadline:
        time.sleep(0.01)  # polling for the thread to block in the queue, not standing in for it
    path = tmp_path / "dump"
    with open(path, "w") as f:
        faulthandler.dump_traceback(f, all_threads=True)
    text = dumps.tidy(path.read_text())
    inbox.put(None)
    thread.join(10)
    pool.shutdown()
    assert "in waits_for_work\n    inbox.get()" in text, text
    assert "(most recent call last)" in text and "concurrent" not in text, text


# -- where a rank the others wait for is (whereabouts) ------------------------------------------
def test_ps_times_read_as_linux_and_macos_print_them() -> None:
    """The ``time`` column as procps prints it ([DD-]HH:MM:SS) and as macOS's ps does
    (minutes past 59, centiseconds)."""
    assert whereabouts.ps_time_s("00:00:30") == 30
    assert whereabouts.ps_time_s("1-02:03:04") == 86400 + 2 * 3600 + 3 * 60 + 4
    assert whereabouts.ps_time_s("0:00.34") == pytest.approx(0.34)
    assert whereabouts.ps_time_s("125:03.12") == pytest.approx(125 * 60 + 3.12)
    assert whereabouts.ps_time_s("-") == 0 and whereabouts.ps_time_s("") == 0 and whereabouts.ps_time_s("TIME") == 0


def test_a_rank_s_processor_time_counts_a_grandchild_at_work_and_after() -> None:
    """What ``tar`` uses, started through a shell (``os.system``), is the rank's work: while it
    runs, read from /proc and from ``ps`` (macOS's way, which runs here too), and once ended."""
    spin = ("import sys, time\nwhile time.process_time() < 1.2: pass\nprint('spun', flush=True)\n"
            "sys.stdin.read()")  # then it stays, a running grandchild, until its input closes
    before = whereabouts.processor_s()
    child = subprocess.Popen(["sh", "-c", f'"{sys.executable}" -c "$0"', spin], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "spun\n"
        assert whereabouts.descendants_s(whereabouts.proc_table()) >= 1.0
        assert whereabouts.descendants_s(whereabouts.ps_table()) >= 1.0  # 1.2 s: whole seconds, ticks lost
        assert whereabouts.ps_table()[os.getpid()][0] == os.getppid()
    finally:
        child.stdin.close()
        child.wait(30)
    assert whereabouts.processor_s() - before >= 1.0
    # a grandchild ended and waited for by a shell that still runs: Linux counts it in the shell's
    spun = f'"{sys.executable}" -c "import time\nwhile time.process_time() < 1.2: pass"; echo ended; read x'
    shell = subprocess.Popen(["sh", "-c", spun], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert shell.stdout.readline() == "ended\n"
        assert whereabouts.descendants_s(whereabouts.proc_table()) >= 1.0
    finally:
        shell.stdin.close()
        shell.wait(30)


def test_a_main_thread_waiting_on_a_download_of_its_own_or_of_a_thread_it_waits_for_is_seen(tmp_path) -> None:
    """A download on the main thread, or in a thread pool whose result the main thread waits
    for (huggingface_hub's snapshot_download), or through asyncio, waits on the network; a pool
    or a loop that computes or sleeps does not (its stacks or processor time say whether it
    works). A checkpoint written to a slow disk waits on the disk."""
    import asyncio
    import concurrent.futures
    import urllib.request

    @contextlib.contextmanager
    def trickling(seconds: float) -> Iterator[int]:
        """A slow server's port, for one download of ``seconds``."""
        server = subprocess.Popen([sys.executable, str(BIN / "trickle.py"), str(seconds)], stdout=subprocess.PIPE,
                                  text=True)
        try:
            yield int(server.stdout.readline())
        finally:
            server.wait(30)

    def download(seconds: float) -> None:
        with trickling(seconds) as port, urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as reply:
            reply.read()

    def seen_while(block: Any) -> set[str | None]:
        """What waits_outside said of this (the main) thread, looked at from another while it ran ``block``."""
        seen: set[str | None] = set()
        done = threading.Event()

        def look() -> None:
            while not done.wait(0.05):
                seen.add(whereabouts.waits_outside())

        looker = threading.Thread(target=look)
        looker.start()
        try:
            block()
        finally:
            done.set()
            looker.join()
        return seen

    assert "the network" in seen_while(lambda: download(1.0))
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fetch") as pool:
        assert "the network, in its thread fetch_0" in seen_while(lambda: pool.submit(download, 1.0).result())
        assert seen_while(lambda: pool.submit(time.sleep, 0.5).result()) == {None}

    # the same through asyncio (aiohttp, httpx): on the main thread's loop, and on a loop in a
    # thread of its own that the main thread waits for (as fsspec runs one, for datasets' downloads)
    async def adownload(seconds: float) -> None:
        with trickling(seconds) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET / HTTP/1.0\r\n\r\n")
            await reader.read()
            writer.close()

    # a checkpoint saved to a slow disk (a NAS over Wi-Fi): here a FIFO that a thread drains slowly
    fifo = tmp_path / "nas"
    os.mkfifo(fifo)

    def drain() -> None:
        with open(fifo, "rb", buffering=0) as nas:
            while nas.read(1 << 16):
                time.sleep(0.01)  # the slow disk's pace, not a synchronisation

    def save() -> None:
        if TORCH_VERSION >= (2, 3):
            torch.save(torch.zeros(2 << 20), str(fifo))
            return
        # torch before 2.3 holds the GIL while it writes to a path it opened itself (pytorch PR
        # 120818): no other thread runs until the save ends, this drainer included (a deadlock).
        # Through a file object the writes are Python's, which let go of the GIL, on every torch.
        with open(fifo, "wb") as f:
            torch.save(torch.zeros(2 << 20), f)

    drainer = threading.Thread(target=drain)
    drainer.start()
    try:
        assert "the disk" in seen_while(save)
    finally:
        drainer.join()

    assert "the network" in seen_while(lambda: asyncio.run(adownload(1.0)))
    loop = asyncio.new_event_loop()
    io_thread = threading.Thread(target=loop.run_forever, name="fsspecIO")
    io_thread.start()
    try:
        fetch = seen_while(lambda: asyncio.run_coroutine_threadsafe(adownload(1.0), loop).result())
        assert "the network, in its thread fsspecIO" in fetch, fetch
        assert seen_while(lambda: asyncio.run_coroutine_threadsafe(asyncio.sleep(0.5), loop).result()) == {None}
    finally:
        loop.call_soon_threadsafe(loop.stop)
        io_thread.join()
        loop.close()


# -- every rank wraps the same model ----------------------------------------------------------
def test_a_model_that_differs_between_ranks_is_named_by_its_first_difference() -> None:
    """The error every rank raises when DataParallel's ranks wrap different models (the job case
    is in test_data_parallel): a layer more, a layer frozen on one rank, a buffer fewer."""
    def model(width: int = 10, extra: bool = False, stats: bool = True) -> torch.nn.Module:
        layers = [torch.nn.Linear(4, width), torch.nn.BatchNorm1d(width, track_running_stats=stats),
                  torch.nn.Linear(width, 2)]
        return torch.nn.Sequential(*layers, *([torch.nn.Linear(2, 2)] if extra else []))

    frozen = model()
    frozen[2].requires_grad_(False)
    ours = layout(model())
    assert "rank 2 has 8 parameters and rank 0 has 6; the first one rank 0 lacks is parameter '3.weight' " \
           "([2, 2] float32)" in difference([ours, ours, layout(model(extra=True))])
    assert difference([ours, layout(frozen)]).startswith(
        "rank 1 wraps a different model from rank 0's in DataParallel: parameter '2.weight' trains on rank 0 and "
        "is frozen (requires_grad=False) on rank 1. Every rank must build the same model")
    assert "rank 0 has 3 buffers and rank 1 has 0; the first one rank 1 lacks is buffer '1.running_mean' " \
           "([10] float32)" in difference([ours, layout(model(stats=False)), ours])
    assert difference([ours, layout(model(11)), layout(model(12))]).startswith(
        "ranks 1, 2 wrap a different model from rank 0's in DataParallel: parameter '0.weight' is [11, 4] "
        "float32 on rank 1 and [10, 4] float32 on rank 0")
    with pytest.raises(ValueError):
        difference([ours, layout(model())])


# -- what the ranks left outside their process groups (workers/leftovers.py) --------------------
def test_processes_with_both_marks_outside_the_ranks_groups_are_found_and_stopped() -> None:
    """A process the ranks started keeps their environment: this agent's job id and pid. One
    with either mark alone is another job's (or was started to outlive this one), and one in a
    rank's process group is the agent's to stop itself."""
    from macfleet.workers import leftovers

    job, agent = "f00d", 4242424
    marks = {"MACFLEET_JOB_ID": job, "MACFLEET_AGENT_PID": str(agent)}
    envs = {"left": marks, "in a group": marks, "job id only": {"MACFLEET_JOB_ID": job},
            "agent pid only": {"MACFLEET_AGENT_PID": str(agent)}, "another job": {**marks, "MACFLEET_JOB_ID": "beef"}}
    procs = {name: subprocess.Popen(["sleep", "60"], env={**os.environ, **env}, start_new_session=True)
             for name, env in envs.items()}
    # and one that ignores SIGTERM (kept across its exec of sleep)
    procs["stubborn"] = subprocess.Popen(["sh", "-c", "trap '' TERM; exec sleep 61"], env={**os.environ, **marks},
                                         start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        stubborn = ["ps", "-o", "comm=", "-p", str(procs["stubborn"].pid)]
        while "sleep" not in subprocess.run(stubborn, capture_output=True, text=True).stdout \
                and time.monotonic() < deadline:
            time.sleep(0.01)  # polling for its exec, after the trap
        group = procs["in a group"].pid  # its own session: its pid is its group's
        found = leftovers.find(job, agent, {group})
        ended = {procs["left"].pid: -signal.SIGTERM, procs["stubborn"].pid: -signal.SIGKILL}
        assert set(found) == {leftovers.Leftover(pid, "sleep") for pid in ended}, found
        assert leftovers.stop(job, agent, {group}, grace_s=0.5) == found
        assert {p.pid: p.wait(timeout=5) for name, p in procs.items() if p.pid in ended} == ended
        assert all(p.poll() is None for p in procs.values() if p.pid not in ended)
        assert leftovers.find(job, agent, {group}) == []
    finally:
        for p in procs.values():
            p.kill()
            p.wait()
