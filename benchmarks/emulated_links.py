"""All-reduce over emulated links: macfleet and gloo as a fraction of the link rate.

    sudo python benchmarks/emulated_links.py [--rates 1gbit,10gbit] [--sizes 16M,64M] [--json FILE]
    sudo python benchmarks/emulated_links.py --train large,deep [--ranks-per-host 2] [--compression fp16]
    sudo python benchmarks/emulated_links.py --hosts 3 [--cabled]

Puts two hosts in network namespaces joined by veth links to a bridge, shapes both directions
of every link with ``tc qdisc ... tbf rate R``, starts an sshd in each, and runs
``macfleet bench allreduce --hosts`` across them (one rank per host). For two ranks the bus
bandwidth 2(N-1)/N x bytes / time equals what each link direction must carry per second, so
busbw / rate is the fraction of the link the all-reduce uses. With ``--train`` it runs
``train_throughput.py --hosts`` across them instead: DataParallel against DDP (gloo) between two
"Macs" joined by the link. Needs root, iproute2 and sshd.

``--hosts 3`` puts three hosts on the bridge, each with one shaped link (a switch, or a
Thunderbolt bridge); bus bandwidth can then reach the link rate at best, since each host's one
link carries both ring directions. ``--cabled`` joins them instead in a ring of shaped cables
with a subnet each (MLX's Thunderbolt ring), the bridge left unshaped for ssh and the launcher:
each host sends over two cables at once, so bus bandwidth can reach twice the rate of one.
gloo cannot run there (``bench allreduce`` leaves it out).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import netns  # noqa: E402  (the test suite's namespace and sshd helpers)
import sshd as sshd_helper  # noqa: E402

BITS = {"gbit": 1e9, "mbit": 1e6}


def rate_bits(rate: str) -> float:
    return float(rate[:-4]) * BITS[rate[-4:]]


def run_allreduce(hosts: list[netns.NetnsHost], ssh: list[str], rate: str, args: argparse.Namespace,
                  out: Path) -> list[dict]:
    where = ["--hostfile", args.hostfile] if args.hostfile else ["--hosts", ",".join(h.addr for h in hosts)]
    subprocess.run([sys.executable, "-m", "macfleet.launcher.cli", "bench", "allreduce", *where, *ssh,
                    "--sizes", args.sizes, "--budget", "2", "--json", str(out)], check=True)
    rows = json.loads(out.read_text())["rows"]
    for row in rows:
        row["rate"] = rate
        row["fraction_of_link"] = row["busbw_gbs"] * 8e9 / rate_bits(rate)
    return rows


def run_training(hosts: list[netns.NetnsHost], ssh: list[str], rate: str, args: argparse.Namespace,
                 out: Path) -> list[dict]:
    """benchmarks/train_throughput.py across the namespaces: DataParallel against DDP (gloo)."""
    layout = ",".join(f"{h.addr}:{args.ranks_per_host}" for h in hosts)
    subprocess.run([sys.executable, str(Path(__file__).with_name("train_throughput.py")), "--hosts", layout,
                    f"--launch-args={shlex.join(ssh)}", "--models", args.train, "--steps", str(args.steps),
                    "--threads-per-rank", str(args.threads_per_rank), "--compression", args.compression,
                    "--json", str(out)], check=True)
    rows = json.loads(out.read_text())
    for row in rows:
        row["rate"] = rate
    return rows


def print_allreduce(results: list[dict], rates: list[str]) -> None:
    print(f"{'link':>7} {'size':>6} | {'macfleet':>10} {'of link':>8} | {'gloo':>10} {'of link':>8}")
    for rate in rates:
        for size in sorted({r["bytes"] for r in results if r["rate"] == rate}):
            row = {r["library"]: r for r in results if r["rate"] == rate and r["bytes"] == size}
            mf, gl = row["macfleet"], row.get("gloo")
            print(f"{rate:>7} {size >> 20:>5}M | {mf['busbw_gbs'] * 8:>6.2f} Gb/s {mf['fraction_of_link']:>7.0%} | "
                  + (f"{gl['busbw_gbs'] * 8:>6.2f} Gb/s {gl['fraction_of_link']:>7.0%}" if gl else
                     f"{'-':>10} {'-':>8}"))


def print_training(results: list[dict], rates: list[str]) -> None:
    print(f"{'link':>7} {'model':<6} | {'macfleet ms':>11} {'wait':>5} | {'DDP ms':>8} | {'vs DDP':>7} | {'bare ms':>8}")
    for rate in rates:
        for model in dict.fromkeys(r["model"] for r in results if r["rate"] == rate):
            row = {r["library"].split("-")[0]: r for r in results if r["rate"] == rate and r["model"] == model}
            mf, ddp, bare = row["macfleet"], row["ddp"], row["local"]
            print(f"{rate:>7} {model:<6} | {mf['step_s'] * 1e3:>11.1f} {mf['wait_share']:>5.0%} | "
                  f"{ddp['step_s'] * 1e3:>8.1f} | {ddp['step_s'] / mf['step_s']:>6.2f}x | {bare['step_s'] * 1e3:>8.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rates", default="1gbit,10gbit")
    parser.add_argument("--sizes", default="16M,64M")
    parser.add_argument("--train", default=None, metavar="MODELS",
                        help="train these models (train_throughput.py) instead of timing all-reduces")
    parser.add_argument("--ranks-per-host", type=int, default=1)
    parser.add_argument("--threads-per-rank", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--compression", default="none", choices=["none", "fp16", "bf16"])
    parser.add_argument("--hosts", type=int, default=2, help="hosts on the bridge (or in the ring, with --cabled)")
    parser.add_argument("--cabled", action="store_true", help="a ring of shaped cables, a subnet each (3+ hosts)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    args.hostfile = None
    if args.cabled and (args.hosts < 3 or args.train):
        parser.error("--cabled is a ring of 3 or more hosts, timing the all-reduce")
    if not (netns.available() and sshd_helper.available()):
        sys.exit("needs root, iproute2 (ip netns) and sshd")
    rates = args.rates.split(",")
    run = run_training if args.train else run_allreduce
    hosts = netns.create(args.hosts)
    results: list[dict] = []
    servers: list[sshd_helper.Sshd] = []
    try:
        directory = Path(tempfile.mkdtemp(prefix="macfleet-links-"))
        port = sshd_helper.free_port()
        servers = [sshd_helper.start_sshd(directory, [h.addr], port=port, prefix=h.exec_prefix()) for h in hosts]
        n = len(hosts)
        cables = [netns.cable(hosts[k], hosts[(k + 1) % n], k + 1) for k in range(n)] if args.cabled else []
        if cables:  # each host: its end of the cable to the next, and of the one from the previous
            args.hostfile = str(directory / "hosts")
            Path(args.hostfile).write_text("".join(f"{h.addr} addr={cables[k].a_addr},{cables[k - 1].b_addr}\n"
                                                   for k, h in enumerate(hosts)))
        for rate in rates:
            for link in cables or hosts:
                (netns.set_cable_rate if cables else netns.set_rate)(link, rate)
            results += run(hosts, servers[0].launch_options(), rate, args, directory / f"{rate}.json")
    finally:
        for server in servers:
            server.stop()
        netns.destroy(args.hosts)
    (print_training if args.train else print_allreduce)(results, rates)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
