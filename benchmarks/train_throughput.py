"""Training throughput: macfleet.DataParallel against torch DDP (gloo), side by side.

    python benchmarks/train_throughput.py [--nprocs 1,2,4] [--device cpu|cuda] [--models cnn,large]
                                          [--steps 20] [--threads-per-rank K] [--json FILE]
                                          [--hosts mini1:1,mini2:1 [--launch-args "..."]]
                                          [--compression none|fp16|bf16] [--join] [--ddp-bucket-view]

For each N it runs one job (``macfleet launch --nproc N`` this file) whose ranks train each
model with macfleet.DataParallel and then with torch DistributedDataParallel on gloo (NCCL with
``--ddp-backend nccl``, one GPU per rank), same model, data, batch and processes. Reported:
step time, samples/s, the share of macfleet's step spent waiting for gradients after backward,
and scaling efficiency (throughput at N / (N x throughput at 1)); on CUDA also "GPU MiB", the
most GPU memory each took while it was built and took its first steps (model, gradients, the
library's buffers, activations; the largest over the ranks). DDP keeps its buckets beside the
gradients there (``gradient_as_bucket_view=False``, its default; ``--ddp-bucket-view`` sets it
True); DataParallel's gradients are views of its buckets, and its host staging buffers, in CPU
memory, are not counted (on a Mac they are the same memory as the GPU's).

The wait has two parts (on one host, whose ranks share a clock): "behind", the time rank 0 waits
for the rank whose own backward ends last, whose gradients no exchange can average before they
exist; and "tail", that last rank's own wait, the exchange that is left once every backward
has ended. Each is a median over the steps, as a share of the median step, so the two need not
add up to the wait exactly. On a machine whose ranks compute at uneven speeds, "behind" is a
wait that only evener compute removes.

On a CPU, ``--threads-per-rank K`` gives every rank K compute threads whatever N, so adding a
rank adds cores, as adding a Mac or a GPU does; without it the launcher splits the machine's
cores among the ranks, and N=1 already uses them all (scaling then measures how well N ranks
share one machine, not how the job grows).

Models: ``cnn`` is the MNIST example's CNN (batch 64 per rank); ``large`` is an MLP of about
25M parameters (100 MB of float32 gradients per step, batch 128 per rank), where
communication matters, two thirds of them in one layer whose gradient is ready late in
backward (little to overlap with); ``deep`` has the same 25M parameters in 12 layers of the
same size, as a deep network spreads them (batch 128 per rank); ``bn`` is 8 convolutions with
BatchNorm converted to SyncBatchNorm, as for DDP (batch 32 images of 32x32 per rank, every
layer's statistics shared in forward and backward; DDP only on a GPU, where torch's runs). Its
bare model keeps plain BatchNorm: "of bare" includes what sharing the statistics costs.
``many`` has 162 small parameters (40 blocks of Linear(128, 128) and LayerNorm, 672K numbers;
a ResNet-50 has 161 parameters), batch 64 per rank: each parameter's gradient hook, Python in
macfleet and C++ in DDP, costs more there than the gradients' bytes do.

Each job also times the bare model in the same processes with no gradient exchange at all
(``local``): how fast N ranks can train on this machine if communication were free, the
ceiling for scaling. "of bare" is a library's throughput over the bare model's at the same N:
what the exchange costs, apart from how well the machine itself runs N ranks at once.

The three take their timed steps in turns (round robin, a few steps each), not one after
another, so that a slow spell of a shared machine does not fall on one of them only.

``--hosts`` runs one job across machines instead (``macfleet launch --hosts``, plus
``--launch-args``, e.g. ssh options); ``benchmarks/emulated_links.py --train`` uses it between
network namespaces. ``--compression`` is DataParallel's wire compression (DDP has no equal).
``--join`` takes every step of both libraries inside their ``join()`` blocks (one per turn,
entered and left outside the timed steps), which cost each step a small all-reduce or two.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median_high  # sorted(xs)[len(xs) // 2], as before
from typing import Any, Callable

MODELS = {"cnn": 64, "large": 128, "deep": 128, "bn": 32, "many": 64}  # name -> per-rank batch


def build(name: str):
    import torch
    from torch import nn

    torch.manual_seed(0)
    if name == "cnn":
        model = nn.Sequential(nn.Conv2d(1, 16, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3), nn.ReLU(),
                              nn.MaxPool2d(2), nn.Flatten(), nn.Linear(800, 64), nn.ReLU(), nn.Linear(64, 10))
        shape = (1, 28, 28)
    elif name == "deep":
        blocks = [layer for _ in range(6) for layer in (nn.Linear(1024, 2048), nn.ReLU(), nn.Linear(2048, 1024),
                                                         nn.ReLU())]
        model = nn.Sequential(*blocks, nn.Linear(1024, 10))
        shape = (1024,)
    elif name == "many":
        blocks = [layer for _ in range(40) for layer in (nn.Linear(128, 128), nn.LayerNorm(128), nn.ReLU())]
        model = nn.Sequential(*blocks, nn.Linear(128, 10))
        shape = (128,)
    elif name == "bn":
        layers = [nn.Conv2d(3, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU()]
        for _ in range(7):
            layers += [nn.Conv2d(32, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU()]
        model = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
        shape = (3, 32, 32)
    else:
        model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                              nn.Linear(4096, 1024), nn.ReLU(), nn.Linear(1024, 10))
        shape = (1024,)
    return model, shape


def synced(model, cls):
    """``model`` with its BatchNorms sharing batch statistics across ranks through ``cls``:
    torch's (over the process group) for DDP, or macfleet's. DataParallel would turn torch's
    into macfleet's itself, but leaves them alone where a process group exists, as here."""
    import torch

    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    for m in model.modules():
        if type(m) is torch.nn.SyncBatchNorm:
            m.__class__ = cls
    return model


@dataclass
class Contender:
    """One way of training the model, with the times of its steps."""

    library: str
    model: Any
    opt: Any
    wait_of: Callable[[], float] | None = None  # the last step's wait after backward (macfleet only)
    block: Callable[[], Any] = nullcontext  # the context its steps are taken in (join() with --join)
    times: list[float] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)
    # when each timed step's own backward ended, before its wait (perf_counter; macfleet only)
    backward_ends: list[float] = field(default_factory=list)
    gpu_peak_bytes: int | None = None  # on a GPU: the most memory its building and first steps took
    _returned: float = 0.0  # when the last step's backward() returned, its wait included

    def step(self, x, y, sync) -> float:
        from torch.nn import functional as F

        sync()
        started = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        F.cross_entropy(self.model(x), y).backward()
        self._returned = time.perf_counter()
        self.opt.step()
        sync()
        return time.perf_counter() - started

    def note_wait(self) -> None:
        """After a timed step: its wait after backward, and when its own backward ended."""
        self.waits.append(self.wait_of())
        self.backward_ends.append(self._returned - self.waits[-1])

    def medians(self) -> tuple[float, float | None]:
        """Median step time and median wait-after-backward (seconds; None without ``wait_of``)."""
        return median_high(self.times), median_high(self.waits) if self.waits else None


def interleaved(contenders: list[Contender], x, y, steps: int, sync, blocks: int = 4) -> None:
    """``steps`` timed steps of each contender, in ``blocks`` turns taken round robin (each turn
    starting with the next one), so that a slow spell of a shared machine falls on all of them
    alike instead of on whichever happened to run then (each has taken its untimed steps in
    ``settled``)."""
    for b in range(blocks):
        for c in contenders[b % len(contenders):] + contenders[:b % len(contenders)]:
            with c.block():
                for _ in range(steps // blocks + (b < steps % blocks)):
                    c.times.append(c.step(x, y, sync))
                    if c.wait_of:
                        c.note_wait()


def contender(library: str, model, join: bool) -> Contender:
    """``model`` (wrapped by ``library``, or bare) trained with plain SGD; in its ``join()`` with
    ``join``."""
    import torch

    return Contender(library, model, torch.optim.SGD(model.parameters(), lr=0.01),
                     (lambda: model.last_wait_s) if library == "macfleet" else None,
                     model.join if join else nullcontext)


def settled(make: Callable[[], Contender], x, y, sync) -> Contender:
    """The contender ``make`` builds, after three untimed steps (buffers, buckets, connections).
    On a GPU it is built and stepped with its peak memory counted from nothing: what it took
    on the GPU at the most (model, gradients, the library's buffers, activations), beside what
    the others already hold; the largest over the ranks."""
    import torch

    import macfleet

    gpu = x.device.type == "cuda"
    if gpu:
        sync()
        torch.cuda.reset_peak_memory_stats(x.device)
        before = torch.cuda.memory_allocated(x.device)
    c = make()
    with c.block():
        for _ in range(3):
            c.step(x, y, sync)
    if gpu:
        peak = torch.tensor([torch.cuda.max_memory_allocated(x.device) - before], dtype=torch.float64)
        c.gpu_peak_bytes = int(macfleet.all_reduce(peak, "max").item())
    return c


def wait_parts(c: Contender) -> tuple[float, float] | None:
    """This rank's wait after backward in two parts, as shares of its median step: the time it
    spent behind the rank whose own backward ended last (medians over the steps), which no
    exchange can give back, since that rank's gradients are not there yet; and the wait of
    that last rank, which is the exchange's tail after every backward has ended. None where
    the ranks are on several hosts, whose clocks do not compare. Every rank calls it."""
    import socket

    import macfleet

    ranks = macfleet.all_gather_object((socket.gethostname(), c.backward_ends, c.waits))
    if len({host for host, _, _ in ranks}) > 1:
        return None
    me, behind, tails = macfleet.rank(), [], []
    for s in range(len(c.waits)):
        last = max(range(len(ranks)), key=lambda r: ranks[r][1][s])
        behind.append(ranks[last][1][s] - ranks[me][1][s])
        tails.append(ranks[last][2][s])
    step = median_high(c.times)
    return median_high(behind) / step, median_high(tails) / step


def rank_main(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    import macfleet

    macfleet.init(device=args.device)
    if args.threads_per_rank:
        torch.set_num_threads(args.threads_per_rank)
    rank, world, device = macfleet.rank(), macfleet.world_size(), macfleet.device()
    dist.init_process_group(args.ddp_backend, rank=rank, world_size=world)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    results = []
    for name in args.models.split(","):
        batch = MODELS[name]
        model, shape = build(name)  # every build starts from the same seed: equal models
        params = sum(p.numel() for p in model.parameters())
        g = torch.Generator().manual_seed(rank)
        x = torch.randn(batch, *shape, generator=g).to(device)
        y = torch.randint(0, 10, (batch,), generator=g).to(device)
        if device.type == "cuda":  # cuBLAS's and cuDNN's workspaces, which the first step of any model
            warm = build(name)[0].to(device)  # allocates, are not the first contender's own memory
            torch.nn.functional.cross_entropy(warm(x), y).backward()
            del warm
        contenders = [settled(lambda: contender("macfleet", macfleet.DataParallel(
            synced(build(name)[0], macfleet.SyncBatchNorm).to(device), compression=args.compression), args.join),
            x, y, sync)]
        if name != "bn" or device.type == "cuda":  # torch's SyncBatchNorm needs a GPU
            contenders.append(settled(lambda: contender(
                f"ddp-{args.ddp_backend}", torch.nn.parallel.DistributedDataParallel(
                    synced(build(name)[0], torch.nn.SyncBatchNorm).to(device),
                    device_ids=[device.index] if device.type == "cuda" else None,
                    gradient_as_bucket_view=args.ddp_bucket_view), args.join), x, y, sync))
        contenders.append(settled(lambda: contender("local", model.to(device), join=False), x, y, sync))
        interleaved(contenders, x, y, args.steps, sync)
        for c in contenders:
            seconds, waited = c.medians()
            parts = wait_parts(c) if c.wait_of else None
            worst = torch.tensor([seconds], dtype=torch.float64)
            macfleet.all_reduce(worst, "max")  # a step is as slow as its slowest rank
            results.append({"model": name, "params": params, "batch": batch, "library": c.library, "world": world,
                            "step_s": worst.item(), "samples_s": batch * world / worst.item(),
                            "wait_share": None if waited is None else waited / seconds,
                            "behind_share": None if parts is None else parts[0],
                            "tail_share": None if parts is None else parts[1],
                            "gpu_peak_bytes": c.gpu_peak_bytes,
                            "rank0_steps_s": c.times})  # in the order taken: a slow spell shows as a run
        del contenders  # before the next model's are built
    if rank == 0 and args.out:
        Path(args.out).write_text(json.dumps(results))
    dist.destroy_process_group()
    macfleet.shutdown()


def orchestrate(args: argparse.Namespace) -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        layouts = [["--hosts", args.hosts, *shlex.split(args.launch_args)]] if args.hosts else [
            ["--nproc", n] for n in args.nprocs.split(",")]
        for k, layout in enumerate(layouts):
            out = Path(tmp) / f"{k}.json"
            command = [sys.executable, "-m", "macfleet.launcher.cli", "launch", *layout,
                       "--device", args.device, os.path.abspath(__file__), "--rank-mode", "--out", str(out),
                       "--models", args.models, "--steps", str(args.steps), "--device", args.device,
                       "--ddp-backend", args.ddp_backend, "--threads-per-rank", str(args.threads_per_rank),
                       "--compression", args.compression, *(["--join"] if args.join else []),
                       *(["--ddp-bucket-view"] if args.ddp_bucket_view else [])]
            subprocess.run(command, check=True)
            rows += json.loads(out.read_text())
    base = {(r["model"], r["library"]): r["samples_s"] for r in rows if r["world"] == 1}
    bare = {(r["model"], r["world"]): r["samples_s"] for r in rows if r["library"] == "local"}
    for r in rows:
        one = base.get((r["model"], r["library"]))
        r["scaling_efficiency"] = r["samples_s"] / (r["world"] * one) if one else None
        ceiling = bare.get((r["model"], r["world"]))
        r["of_bare"] = r["samples_s"] / ceiling if ceiling and r["library"] != "local" else None
    threads = f", {args.threads_per_rank} threads per rank" if args.threads_per_rank else ""
    where = f", hosts {args.hosts}" if args.hosts else ""
    wire = f", DataParallel compression {args.compression}" if args.compression != "none" else ""
    wire += ", every step inside join()" if args.join else ""
    wire += ", DDP's gradients views of its buckets" if args.ddp_bucket_view else ""
    gpu = any(r["gpu_peak_bytes"] is not None for r in rows)  # peak memory, where it is counted: CUDA
    print(f"training throughput, device {args.device}{threads}{where}{wire} (step time is the slowest rank's median)")
    print(f"{'model':<6} {'N':>2} {'library':<10} {'step ms':>9} {'samples/s':>10} {'wait share':>10} "
          f"{'behind':>7} {'tail':>5} {'scaling':>8} {'of bare':>8} {'vs DDP':>7}{' GPU MiB' if gpu else ''}")
    for r in rows:
        ddp = next((d for d in rows if d["model"] == r["model"] and d["world"] == r["world"]
                    and d["library"].startswith("ddp")), None)
        ratio = f"{ddp['step_s'] / r['step_s']:.2f}x" if ddp and r["library"] == "macfleet" else ""
        wait, behind, tail = (f"{r[k]:.0%}" if r.get(k) is not None else "" for k in
                              ("wait_share", "behind_share", "tail_share"))
        eff = f"{r['scaling_efficiency']:.0%}" if r["scaling_efficiency"] is not None else ""
        of_bare = f"{r['of_bare']:.0%}" if r["of_bare"] is not None else ""
        memory = f" {r['gpu_peak_bytes'] / 2**20:>7.0f}" if gpu else ""
        print(f"{r['model']:<6} {r['world']:>2} {r['library']:<10} {r['step_s'] * 1e3:>9.1f} {r['samples_s']:>10.0f} "
              f"{wait:>10} {behind:>7} {tail:>5} {eff:>8} {of_bare:>8} {ratio:>7}{memory}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nprocs", default="1,2,4")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda", "mps", "auto"])
    parser.add_argument("--models", default="cnn,large,deep", help="of cnn, large, deep, bn, many")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--ddp-backend", default="gloo", choices=["gloo", "nccl"])
    parser.add_argument("--threads-per-rank", type=int, default=0, help="CPU compute threads per rank (0: the "
                        "launcher's share of the cores)")
    parser.add_argument("--hosts", default=None, help="one job on these hosts (macfleet launch --hosts) "
                        "instead of --nprocs")
    parser.add_argument("--launch-args", default="", help="more options for macfleet launch (with --hosts)")
    parser.add_argument("--compression", default="none", choices=["none", "fp16", "bf16"])
    parser.add_argument("--join", action="store_true", help="steps inside DataParallel.join() and DDP.join()")
    parser.add_argument("--ddp-bucket-view", action="store_true",
                        help="DDP(gradient_as_bucket_view=True): its gradients in its buckets, as DataParallel's are")
    parser.add_argument("--json", default=None)
    parser.add_argument("--rank-mode", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    rank_main(args) if args.rank_mode else orchestrate(args)


if __name__ == "__main__":
    main()
