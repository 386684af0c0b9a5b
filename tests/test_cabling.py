"""``macfleet cabling``: Thunderbolt cables read from what macOS reports, a /30 for each, and
the hostfile of a ring the launcher accepts.

No Mac runs here, so each Mac's answer is written as macOS writes it (system_profiler's JSON,
networksetup's and ifconfig's text), from a wiring the test states; every expectation comes
from that wiring, not from the code under test.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys

import pytest

from macfleet.launcher import cabling
from macfleet.launcher.hosts import Host, parse_hostfile
from macfleet.launcher.thunderbolt import SPLIT, commands, hostfile, parse_probe, plan, report

SUBNET = ipaddress.IPv4Network("10.78.0.0/16")


def mac_answer(name: str, ports: dict[str, tuple[str, str | None]], extra_ifconfig: str = "") -> str:
    """What a Mac prints for the probe: ``ports`` maps its Thunderbolt port numbers ("1") to
    the interface and the port ("B2": Mac B's port 2) at the other end, or None."""
    buses = [{"_name": "thunderboltusb4_bus_9", "device_name_key": name}]  # the bus of no port: skipped
    hardware = "Hardware Port: Ethernet\nDevice: en0\nEthernet Address: 00:00:00:00:00:01\n\n"
    for tag, (iface, far) in ports.items():
        items = [{"_name": "Mac", "domain_uuid_key": f"uuid-{far}"}] if far else \
            [{"_name": "CalDigit TS4", "vendor_name_key": "CalDigit"}]  # a dock: no Mac there
        buses.append({"_name": f"thunderboltusb4_bus_{tag}", "device_name_key": name,
                      "domain_uuid_key": f"uuid-{name}{tag}", "receptacle_1_tag": {"receptacle_id_key": tag},
                      "_items": items})
        hardware += f"Hardware Port: Thunderbolt {tag}\nDevice: {iface}\nEthernet Address: 36:00:00:00:00:0{tag}\n\n"
    hardware += "Hardware Port: Thunderbolt Bridge\nDevice: bridge0\nEthernet Address: N/A\n"
    ifconfig = ("en0: flags=8863<UP,BROADCAST,SMART,RUNNING,SIMPLEX,MULTICAST> mtu 1500\n"
                "\tinet 192.168.1.20 netmask 0xffffff00 broadcast 192.168.1.255\n" + extra_ifconfig)
    return "\n".join([json.dumps({"SPThunderboltDataType": buses}), SPLIT, hardware, SPLIT, ifconfig])


def cabling_command(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "macfleet.launcher.cli", "cabling", *args], capture_output=True,
                          text=True, timeout=60)


def probes(wiring: dict[str, dict[str, tuple[str, str | None]]], ifconfig: str = "") -> list:
    return [parse_probe(mac_answer(name, ports, ifconfig)) for name, ports in wiring.items()]


def test_three_macs_cabled_in_a_triangle_get_a_subnet_per_cable_and_a_ring_the_launcher_accepts(tmp_path) -> None:
    # A's port 1 to B's port 2, A's 2 to C's 1, B's 1 to C's 2; A's port 3 has a dock
    wiring = {"A": {"1": ("en2", "B2"), "2": ("en3", "C1"), "3": ("en4", None)},
              "B": {"1": ("en5", "C2"), "2": ("en2", "A1")},
              "C": {"1": ("en2", "A2"), "2": ("en3", "B1")}}
    found = probes(wiring)
    result = plan([p.ports for p in found], SUBNET)
    index = {"A": 0, "B": 1, "C": 2}
    ends = {frozenset({(c.a, c.a_iface), (c.b, c.b_iface)}) for c in result.cables}
    assert ends == {frozenset({(0, "en2"), (1, "en2")}), frozenset({(0, "en3"), (2, "en2")}),
                    frozenset({(1, "en5"), (2, "en3")})}
    blocks = [c.a_addr.network for c in result.cables]
    assert all(c.a_addr.network == c.b_addr.network and c.a_addr.ip != c.b_addr.ip for c in result.cables)
    assert len(set(blocks)) == 3 and all(b.prefixlen == 30 and b.subnet_of(SUBNET) for b in blocks)
    assert result.order is not None and sorted(result.order) == [0, 1, 2] and result.order[0] == 0
    for i in index.values():
        lines = commands(i, result.cables)
        assert lines[0] == "sudo ifconfig bridge0 down"
        for c in result.cables:
            if i in (c.a, c.b):
                iface, addr = (c.a_iface, c.a_addr) if i == c.a else (c.b_iface, c.b_addr)
                assert f"sudo ifconfig {iface} inet {addr.ip} netmask 255.255.255.252" in lines, lines
    path = tmp_path / "hosts"
    path.write_text(hostfile([Host("A", 2), Host("B", 1, user="me"), Host("C", 1, share=3)], result))
    listed = parse_hostfile(str(path))
    assert [h.ssh_target for h in listed] == [["A", "me@B", "C"][i] for i in result.order]
    assert [h.slots for h in listed] == [[2, 1, 1][i] for i in result.order] and listed[-1].share in (1, 3)
    nets = [[f"{a}/30" for a in h.addrs] for h in listed]
    assert all(len(h.addrs) == 2 for h in listed) and cabling.out_of_order(nets) is None


def test_four_macs_listed_out_of_cabling_order_come_out_in_it() -> None:
    # a square A-B-C-D-A, listed A, C, B, D
    wiring = {"A": {"1": ("en2", "B1"), "2": ("en3", "D2")},
              "C": {"1": ("en2", "B2"), "2": ("en3", "D1")},
              "B": {"1": ("en2", "A1"), "2": ("en3", "C1")},
              "D": {"1": ("en2", "C2"), "2": ("en3", "A2")}}
    result = plan([p.ports for p in probes(wiring)], SUBNET)
    assert result.order in ([0, 2, 1, 3], [0, 3, 1, 2])  # A, B, C, D or A, D, C, B


def test_a_chain_closes_no_ring_and_a_cable_named_from_one_end_only_still_counts() -> None:
    chain = {"A": {"1": ("en2", "B1")}, "B": {"1": ("en2", "A1"), "2": ("en3", "C1")}, "C": {"1": ("en2", "B2")}}
    result = plan([p.ports for p in probes(chain)], SUBNET)
    assert len(result.cables) == 2 and result.order is None
    one_sided = {"A": {"1": ("en2", "B1")}, "B": {"1": ("en2", None)}}  # B's report has not caught up
    result = plan([p.ports for p in probes(one_sided)], SUBNET)
    assert [(c.a, c.a_iface, c.b, c.b_iface) for c in result.cables] == [(0, "en2", 1, "en2")]
    assert result.order == [0, 1]
    with pytest.raises(ValueError, match="fewer than 1 subnets"):
        plan([p.ports for p in probes(one_sided)], ipaddress.IPv4Network("10.78.0.0/31"))


def test_the_report_writes_the_hostfile_or_says_why_it_cannot(tmp_path, capsys) -> None:
    triangle = {"A": {"1": ("en2", "B1"), "2": ("en3", "C2")}, "B": {"1": ("en2", "A1"), "2": ("en3", "C1")},
                "C": {"1": ("en2", "B2"), "2": ("en3", "A2")}}
    hosts = [Host(name, 1) for name in triangle]
    out = tmp_path / "hosts.txt"
    assert report(hosts, probes(triangle), SUBNET, str(out)) == 0
    printed = capsys.readouterr().out
    assert out.read_text() == hostfile(hosts, plan([p.ports for p in probes(triangle)], SUBNET))
    assert printed.count("sudo ifconfig bridge0 down") == 3 and f"--hostfile {out}" in printed, printed
    assert report(hosts, probes(triangle), SUBNET, "/dev/full") == 1  # a disk with no room: printed instead
    said = capsys.readouterr()
    assert "cannot write /dev/full: No space left on device" in said.err and out.read_text() in said.out, said
    chain = {"A": {"1": ("en2", "B1")}, "B": {"1": ("en2", "A1"), "2": ("en3", "C1")}, "C": {"1": ("en2", "B2")}}
    assert report(hosts, probes(chain), SUBNET, str(tmp_path / "chain.txt")) == 1
    assert "close no ring" in capsys.readouterr().err and not (tmp_path / "chain.txt").exists()
    pair = {"A": {"1": ("en2", "B1")}, "B": {"1": ("en2", "A1")}, "C": {}, "D": {}}  # C and D not cabled at all
    assert report([Host(name, 1) for name in pair], probes(pair), SUBNET, None) == 1
    assert "C, D have no cable to any of the others" in capsys.readouterr().err
    office = "en7: flags=8863<UP,BROADCAST,RUNNING> mtu 1500\n\tinet 10.78.4.9 netmask 0xffffff00 broadcast 10.78.4.255\n"
    assert report(hosts, probes(triangle, office), SUBNET, None) == 1  # a LAN on 10.78.4.0/24 already
    assert "already uses 10.78.4.9/24 on en7" in capsys.readouterr().err
    assert report(hosts, probes(triangle, office), ipaddress.IPv4Network("10.79.0.0/16"), None) == 0
    done = "en2: flags=8863<UP,BROADCAST,RUNNING> mtu 1500\n\tinet 10.78.0.1 netmask 0xfffffffc broadcast 10.78.0.3\n"
    assert report(hosts, probes(triangle, done), SUBNET, None) == 0  # run again once set up: its own cables' addresses


def test_an_answer_that_is_not_a_mac_s_is_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="did not answer as a Mac does"):
        parse_probe("sh: 1: system_profiler: not found\n")
    with pytest.raises(ValueError, match="not the JSON it writes"):
        parse_probe(f"garbage\n{SPLIT}\n{SPLIT}\n")


def test_the_command_names_a_host_it_cannot_read_in_one_line() -> None:
    """This Linux machine has no system_profiler: the real commands run, and fail, here."""
    job = cabling_command("--hosts", "localhost,nosuch.invalid")
    assert job.returncode == 1 and "Traceback" not in job.stdout + job.stderr, job
    assert "cannot read the Thunderbolt ports of localhost: " in job.stderr, job.stderr
    assert "system_profiler" in job.stderr.split("localhost: ")[1].splitlines()[0], job.stderr  # the shell's words
    assert "cannot read the Thunderbolt ports of nosuch.invalid: " in job.stderr, job.stderr
    alone = cabling_command("--hosts", "localhost")
    assert alone.returncode == 2 and "two or more" in alone.stderr, alone
    bad = cabling_command("--hosts", "a,b", "--subnet", "10.78.0.0/33")
    assert bad.returncode == 2 and "is not an IPv4 range" in bad.stderr, bad
    # said before the Macs are asked, not as a traceback after
    nowhere = cabling_command("--hosts", "localhost,nosuch.invalid", "--output", "/no/such/dir/hosts.txt")
    assert nowhere.returncode == 2 and "'--output' / '-o': cannot write in /no/such/dir" in nowhere.stderr, nowhere
    assert "Thunderbolt" not in nowhere.stderr, nowhere.stderr
