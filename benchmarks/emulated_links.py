"""All-reduce over emulated links: macfleet and gloo as a fraction of the link rate.

    sudo python benchmarks/emulated_links.py [--rates 1gbit,10gbit] [--sizes 16M,64M] [--json FILE]

Puts two hosts in network namespaces joined by veth links to a bridge, shapes both directions
of every link with ``tc qdisc ... tbf rate R``, starts an sshd in each, and runs
``macfleet bench allreduce --hosts`` across them (one rank per host). For two ranks the bus
bandwidth 2(N-1)/N x bytes / time equals what each link direction must carry per second, so
busbw / rate is the fraction of the link the all-reduce uses. Needs root, iproute2 and sshd.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import netns  # noqa: E402  (the test suite's namespace and sshd helpers)
import sshd as sshd_helper  # noqa: E402

BITS = {"gbit": 1e9, "mbit": 1e6}
BURST = {"1gbit": "256kb", "10gbit": "4mb"}


def rate_bits(rate: str) -> float:
    return float(rate[:-4]) * BITS[rate[-4:]]


def shape(hosts: list[netns.NetnsHost], rate: str) -> None:
    burst = BURST.get(rate, "1mb")
    for host in hosts:  # both directions: the host's egress and the bridge's egress towards it
        for prefix, dev in ((host.exec_prefix(), host.veth), ([], f"{host.veth}p")):
            subprocess.run([*prefix, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
                            "burst", burst, "latency", "100ms"], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rates", default="1gbit,10gbit")
    parser.add_argument("--sizes", default="16M,64M")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if not (netns.available() and sshd_helper.available()):
        sys.exit("needs root, iproute2 (ip netns) and sshd")
    hosts = netns.create(2)
    results = []
    server = None
    try:
        directory = Path(tempfile.mkdtemp(prefix="macfleet-links-"))
        port = sshd_helper.free_port()
        servers = [sshd_helper.start_sshd(directory, [h.addr], port=port, prefix=h.exec_prefix()) for h in hosts]
        server = servers[0]
        for rate in args.rates.split(","):
            shape(hosts, rate)
            out = directory / f"{rate}.json"
            subprocess.run([sys.executable, "-m", "macfleet.launcher.cli", "bench", "allreduce", "--hosts",
                            ",".join(h.addr for h in hosts), *server.launch_options(), "--sizes", args.sizes,
                            "--budget", "2", "--json", str(out)], check=True)
            for row in json.loads(out.read_text())["rows"]:
                row["rate"] = rate
                row["fraction_of_link"] = row["busbw_gbs"] * 8e9 / rate_bits(rate)
                results.append(row)
    finally:
        for s in locals().get("servers", []):
            s.stop()
        netns.destroy(2)
    print(f"{'link':>7} {'size':>6} | {'macfleet':>10} {'of link':>8} | {'gloo':>10} {'of link':>8}")
    for rate in args.rates.split(","):
        for size in sorted({r["bytes"] for r in results if r["rate"] == rate}):
            row = {r["library"]: r for r in results if r["rate"] == rate and r["bytes"] == size}
            mf, gl = row["macfleet"], row["gloo"]
            print(f"{rate:>7} {size >> 20:>5}M | {mf['busbw_gbs'] * 8:>6.2f} Gb/s {mf['fraction_of_link']:>7.0%} | "
                  f"{gl['busbw_gbs'] * 8:>6.2f} Gb/s {gl['fraction_of_link']:>7.0%}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
