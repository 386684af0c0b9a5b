"""Distributed MNIST with macfleet: a small CNN, data parallel over every rank of the job.

    python examples/mnist/train.py --epochs 1                          # one process
    macfleet launch --nproc 2 examples/mnist/train.py --epochs 1       # two processes, one Mac
    macfleet launch --hosts mac1:2,mac2:2 examples/mnist/train.py      # four processes, two Macs

Data: ``--data-url DIR`` with the four MNIST IDX files (raw or .gz); ``--download`` fetches
them into DIR first, and a DIR without them is an error. Without ``--data-url`` the example
trains on generated digits, so it runs offline.
``--train-url DIR`` receives ``checkpoint.pt`` (every epoch, and every ``--checkpoint-every``
steps), the final ``model.pt`` and ``metrics.json``. Under ``macfleet launch --max-restarts N``
a restarted job resumes from ``checkpoint.pt`` (``--resume`` does the same by hand).
"""

import argparse
import json
import math
import os
import time

import torch
import torch.nn.functional as F
from torch import nn

import macfleet
from data import download, load_idx_dir, missing, synthetic_digits

# -----------------------------------------------------------------------------
# config
def positive(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def not_negative(text):
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return value


def rate(text):
    value = float(text)
    if not 0 <= value < float("inf"):  # nan too
        raise argparse.ArgumentTypeError(f"must be a number, 0 or more, not {value}")
    return value


parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--data-url", default=None, help="directory holding (or receiving) the MNIST IDX files")
parser.add_argument("--download", action="store_true", help="fetch MNIST into --data-url if missing")
parser.add_argument("--train-url", default=None, help="directory for the final checkpoint and metrics.json")
parser.add_argument("--batch-size", type=positive, default=64, help="per process; the global batch is this x ranks")
parser.add_argument("--shares", default=None, help="each rank's part of every step, e.g. 3,1 when rank 0's Mac is "
                    "three times as fast: its batch is --batch-size x 3 and its shard of the data three times as large "
                    "(default: the hostfile's share= of each host)")
parser.add_argument("--epochs", type=positive, default=15)
parser.add_argument("--lr", type=rate, default=2e-3, help="Adam learning rate of the first epoch; it falls to 0 "
                    "over the epochs on a cosine")
parser.add_argument("--seed", type=int, default=0, help="model init and data order (same on every rank)")
parser.add_argument("--device", default=None, choices=["auto", "mps", "cuda", "cpu"],
                    help="default: the launcher's choice")
parser.add_argument("--checkpoint-every", type=not_negative, default=0,
                    help="also checkpoint every N steps (0: per epoch only)")
parser.add_argument("--resume", action="store_true", help="continue from the checkpoint in --train-url")
parser.add_argument("--amp", action="store_true", help="bfloat16 autocast (fp32 weights; no GradScaler needed)")
parser.add_argument("--compression", default="none", choices=["none", "fp16", "bf16"],
                    help="gradients cross the network in half precision (half the bytes, for slow links)")
args = parser.parse_args()
if args.resume and not args.train_url:
    parser.error("--resume continues from the checkpoint in --train-url: give --train-url too")
if args.train_url and int(os.environ.get("RANK", "0")) == 0:  # only rank 0 writes; say so now, not after an epoch
    try:
        os.makedirs(args.train_url, exist_ok=True)
    except OSError as exc:
        parser.error(f"--train-url {args.train_url}: {exc.strerror}")
    if not os.access(args.train_url, os.W_OK):
        parser.error(f"--train-url {args.train_url}: not writable")

# -----------------------------------------------------------------------------
# distributed setup: with plain `python` this is a job of one
macfleet.init(device=args.device)
rank, world = macfleet.rank(), macfleet.world_size()
master = rank == 0  # rank 0 prints and writes files
try:
    shares = [positive(part) for part in args.shares.split(",")] if args.shares else macfleet.shares()
except (ValueError, argparse.ArgumentTypeError):
    parser.error(f"--shares {args.shares}: whole numbers above 0, one per rank")
if len(shares) != world:
    parser.error(f"--shares {args.shares}: {len(shares)} shares for {world} ranks")
batch_size = args.batch_size * shares[rank]
device = macfleet.device()
torch.manual_seed(args.seed)  # the same initial model everywhere (DataParallel also broadcasts rank 0's)


def autocast_supported(device):
    """bf16 autocast: CUDA and CPU have it; MPS from torch 2.6 on macOS 14+ (mps-facts.md section 4)."""
    if device.type != "mps":
        return True
    macos14 = getattr(torch.backends.mps, "is_macos_or_newer", lambda *_: False)(14, 0)
    return macos14 and tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 6)


def log(*parts):
    if master:
        print(*parts, flush=True)


# -----------------------------------------------------------------------------
# data: every rank loads the same set; the sampler gives each its own shard
if args.data_url and args.download and macfleet.local_rank() == 0:
    download(args.data_url)
macfleet.barrier()  # nobody reads the files before they are complete
if args.data_url:  # asked for MNIST: generated digits instead would be a silent substitute
    if missing(args.data_url):
        where = "does not exist" if not os.path.isdir(args.data_url) else f"lacks {', '.join(missing(args.data_url))}"
        parser.error(f"--data-url {args.data_url} {where}: it takes the four MNIST IDX files, raw or .gz "
                     f"(--download fetches them there)")
    (x_train, y_train), (x_test, y_test) = load_idx_dir(args.data_url)
    log(f"data: MNIST from {args.data_url} ({len(x_train)} train, {len(x_test)} test)")
else:
    x_train, y_train = synthetic_digits(12_000, seed=1)
    x_test, y_test = synthetic_digits(2_000, seed=2)
    log(f"data: no --data-url; using generated digits ({len(x_train)} train, {len(x_test)} test)")
train_set = torch.utils.data.TensorDataset(x_train, y_train)
sampler = macfleet.DistributedSampler(train_set, shuffle=True, seed=args.seed, shares=shares)
# num_workers=0: macOS DataLoader workers are spawned processes, and this data is in memory anyway
loader = torch.utils.data.DataLoader(train_set, batch_size=batch_size, sampler=sampler, drop_last=True)
if len(loader) == 0:  # drop_last: not one full batch, and an epoch would train nothing
    parser.error(f"--batch-size {args.batch_size}: rank {rank}'s {len(sampler)} samples per epoch make no full batch "
                 f"of {batch_size}")


# -----------------------------------------------------------------------------
# model
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3)
        self.conv2 = nn.Conv2d(16, 32, 3)
        self.fc1 = nn.Linear(32 * 5 * 5, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


# gradients are averaged over all ranks in backward()
model = macfleet.DataParallel(Net().to(device), shares=shares, compression=args.compression)
optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)  # stepped once an epoch
use_amp = args.amp and autocast_supported(device)
if args.amp and not use_amp:
    log("--amp: this torch/macOS has no bf16 autocast on MPS; training in float32")


def evaluate():
    """Test accuracy over the whole test set, each rank scoring its share.

    Every rank must take part: the all_reduce below is a collective, and a rank that skipped
    it would leave the others waiting for it.
    """
    model.eval()
    correct = torch.zeros(2)
    with torch.no_grad():
        for i in range(rank * 500, len(x_test), world * 500):
            logits = model(x_test[i:i + 500].to(device))
            correct += torch.tensor([(logits.argmax(1).cpu() == y_test[i:i + 500]).sum().item(), len(logits)])
    macfleet.all_reduce(correct)
    model.train()
    return (correct[0] / correct[1]).item()


# -----------------------------------------------------------------------------
# resume: after a restart (or with --resume) continue from the last checkpoint
checkpoint_path = os.path.join(args.train_url, "checkpoint.pt") if args.train_url else None
restarted = int(os.environ.get("MACFLEET_RESTART_COUNT", "0")) > 0
start_epoch, step, history = 0, 0, []
# the steps of the epoch a mid-epoch checkpoint was taken in: their loss (summed over steps, as
# the epoch's mean needs it) and time, so that a resumed epoch's line and metrics.json cover the
# whole epoch, not only the steps after the restart
NONE_BEFORE = {"loss": 0.0, "steps": 0, "seconds": 0.0}
before = NONE_BEFORE
if checkpoint_path and (args.resume or restarted):
    # rank 0 decides: the other hosts may not see rank 0's disk
    found = macfleet.broadcast(torch.tensor([int(master and os.path.exists(checkpoint_path))]))
    if found.item():
        state = macfleet.checkpoint.load(checkpoint_path, model, optimizer, sampler, scheduler)
        start_epoch, step, history = state.epoch, state.step, state.extra.get("history", [])
        before = state.extra.get("epoch_so_far", before)
        log(f"resumed from {checkpoint_path}: epoch {start_epoch + 1}, step {step}")
        if start_epoch >= args.epochs:
            log(f"the checkpoint has trained {start_epoch} epochs, and --epochs is {args.epochs}: nothing left to train")
        elif scheduler.T_max != args.epochs:
            # resumed with another --epochs (a finished run given more): the cosine runs over the
            # new length from here, as if the run had started with it. Left on the old one, the
            # rate went past its end at 0 and climbed back to the full rate (a cosine repeats).
            log(f"the learning rate's cosine runs over {args.epochs} epochs now, not {scheduler.T_max}")
            scheduler.T_max = args.epochs
            for group, base in zip(optimizer.param_groups, scheduler.base_lrs):  # its eta_min is 0
                group["lr"] = base * (1 + math.cos(math.pi * scheduler.last_epoch / args.epochs)) / 2
    else:  # after a restart too: rank 0's Mac may be another one now (macfleet launch --min-hosts)
        log(f"no checkpoint in {args.train_url} on rank 0's Mac yet; starting from the beginning")

# -----------------------------------------------------------------------------
# training loop
def loss_sum(total_loss):
    """The global batch's loss summed over this epoch's steps so far: each rank's sum weighted by
    its share of the batch (a collective)."""
    return macfleet.all_reduce(total_loss.cpu() * shares[rank], "sum").item() / sum(shares)


log(f"training on {world} process{'es' if world > 1 else ''}, device {device}, "
    f"global batch {args.batch_size * sum(shares)}")
for epoch in range(start_epoch, args.epochs):
    # same shuffle on every rank, different shard; a resumed epoch skips what was already done
    sampler.set_epoch(epoch)
    started, total_loss, steps, consumed = time.perf_counter(), torch.zeros((), device=device), 0, 0
    for x, y in loader:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_amp):
            loss = F.cross_entropy(model(x.to(device)), y.to(device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        total_loss += loss.detach()  # on the device: on MPS every .item() or .cpu() drains the GPU's queue
        steps, step, consumed = steps + 1, step + 1, consumed + len(x)
        if checkpoint_path and args.checkpoint_every and step % args.checkpoint_every == 0:
            # collectives: every rank calls them (each one's RNG state goes in); rank 0 writes
            so_far = {"loss": before["loss"] + loss_sum(total_loss), "steps": before["steps"] + steps,
                      "seconds": before["seconds"] + time.perf_counter() - started}
            macfleet.checkpoint.save(checkpoint_path, model, optimizer, step=step, epoch=epoch, sampler=sampler,
                                     sampler_consumed=consumed, scheduler=scheduler, history=history,
                                     epoch_so_far=so_far)
    steps_done = before["steps"] + steps
    seconds = before["seconds"] + time.perf_counter() - started
    mean_loss = (before["loss"] + loss_sum(total_loss)) / max(steps_done, 1)
    before = NONE_BEFORE  # the next epoch starts whole
    scheduler.step()
    accuracy = evaluate()
    samples_per_s = steps_done * args.batch_size * sum(shares) / seconds
    history.append({"epoch": epoch + 1, "loss": mean_loss, "test_accuracy": accuracy,
                    "samples_per_s": samples_per_s, "seconds": seconds})
    memory = macfleet.memory()  # GPU memory (empty on a CPU); the cache goes back once an epoch
    macfleet.empty_cache()
    log(f"epoch {epoch + 1}/{args.epochs}: loss {mean_loss:.4f}, test accuracy {accuracy:.4f}, "
        f"{samples_per_s:,.0f} samples/s ({seconds:.1f} s)"
        + (f", GPU memory {memory['allocated'] / 2**20:,.0f} MiB in tensors, {memory['reserved'] / 2**20:,.0f} MiB "
           f"held" if memory else ""))
    if checkpoint_path:
        sampler.set_epoch(epoch + 1)  # the checkpoint resumes at the start of the next epoch
        macfleet.checkpoint.save(checkpoint_path, model, optimizer, step=step, epoch=epoch + 1, sampler=sampler,
                                 scheduler=scheduler, history=history)

# -----------------------------------------------------------------------------
# results
if master and args.train_url:
    torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "args": vars(args)},
               os.path.join(args.train_url, "model.pt"))
    with open(os.path.join(args.train_url, "metrics.json"), "w") as f:
        json.dump({"world_size": world, "epochs": history, "final_test_accuracy": history[-1]["test_accuracy"]
                   if history else None}, f, indent=2)
    log(f"wrote {args.train_url}/model.pt and metrics.json")
macfleet.shutdown()
