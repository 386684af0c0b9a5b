"""Where macfleet's extra backward time on `many` goes: the default DataParallel against the same
with the exchange itself skipped (hooks, hand-overs, the bucket thread, no all-reduce), DDP, bare.
argv: steps threads model. Rank 0's medians (us): step, forward, backward, optimizer, wait."""
import os, sys, time, torch
import torch.distributed as dist
from torch.nn import functional as F
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from train_throughput import build
import macfleet
from macfleet import buckets
SKIP = [False]
real = buckets.exchange
def exchange(bucket, staged, compression):
    if not SKIP[0]:
        real(bucket, staged, compression)
buckets.exchange = exchange
macfleet.init(device="cpu")
torch.set_num_threads(int(sys.argv[2]))
rank, world = macfleet.rank(), macfleet.world_size()
dist.init_process_group("gloo", rank=rank, world_size=world)
name = sys.argv[3]
g = torch.Generator().manual_seed(rank)
shape = build(name)[1]
x = torch.randn(64, *shape, generator=g); y = torch.randint(0, 10, (64,), generator=g)
mf = macfleet.DataParallel(build(name)[0])
models = {"mf": mf, "noex": mf, "ddp": torch.nn.parallel.DistributedDataParallel(build(name)[0]), "bare": build(name)[0]}
opts = {k: torch.optim.SGD(m.parameters(), lr=0.01) for k, m in models.items()}
rec = {k: [] for k in models}
def step(k, keep):
    SKIP[0] = k == "noex"
    m, o = models[k], opts[k]
    t0 = time.perf_counter(); o.zero_grad(set_to_none=True)
    loss = F.cross_entropy(m(x), y); t1 = time.perf_counter()
    loss.backward(); t2 = time.perf_counter()
    o.step(); t3 = time.perf_counter()
    if keep: rec[k].append((t3 - t0, t1 - t0, t2 - t1, t3 - t2, getattr(m, "last_wait_s", 0.0) if k in ("mf", "noex") else 0.0))
for k in models:
    for _ in range(10): step(k, False)
steps, blocks = int(sys.argv[1]), 8
keys = list(models)
for b in range(blocks):
    for k in keys[b % 4:] + keys[:b % 4]:
        for _ in range(steps // blocks): step(k, True)
med = lambda v: round(sorted(v)[len(v) // 2] * 1e6)
if rank == 0:
    print(f"N={world} threads={torch.get_num_threads()} model={name} inline={os.environ.get('MACFLEET_INLINE_BYTES', 'default')}: median us (step, forward, backward, optimizer, wait; backward-wait)")
    for k, r in rec.items():
        print(f"  {k:5s}", [med([s[j] for s in r]) for j in range(5)], med([s[2] - s[4] for s in r]), "mean step", round(sum(s[0] for s in r) / len(r) * 1e6))
dist.destroy_process_group(); macfleet.shutdown()
