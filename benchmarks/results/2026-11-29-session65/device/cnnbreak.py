"""Where the CNN's step goes, macfleet against DDP and the bare model, same processes (probe)."""
import os, time, socket
import torch
from torch import nn
from torch.nn import functional as F
import torch.distributed as dist
import macfleet
from macfleet import buckets

macfleet.init()
rank, world = macfleet.rank(), macfleet.world_size()
dist.init_process_group("gloo", rank=rank, world_size=world)
marks = []
orig = buckets.exchange
def timed(bucket, staged, compression):
    a = time.perf_counter(); orig(bucket, staged, compression); marks.append((a, time.perf_counter()))
buckets.exchange = timed
def build():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 16, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(800, 64), nn.ReLU(), nn.Linear(64, 10))
g = torch.Generator().manual_seed(rank)
x = torch.randn(64, 1, 28, 28, generator=g); y = torch.randint(0, 10, (64,), generator=g)
mf = macfleet.DataParallel(build())
ddp = torch.nn.parallel.DistributedDataParallel(build())
bare = build()
names = ["mf", "ddp", "bare"]
models = [mf, ddp, bare]
opts = [torch.optim.SGD(m.parameters(), lr=0.01) for m in models]
rec = {n: [] for n in names}  # per step: (t0, fwd_end, bwd_ret, opt_end, wait)
def step(i, keep):
    m, o = models[i], opts[i]
    t0 = time.perf_counter(); o.zero_grad(set_to_none=True)
    loss = F.cross_entropy(m(x), y); t1 = time.perf_counter()
    loss.backward(); t2 = time.perf_counter()
    o.step(); t3 = time.perf_counter()
    if keep:
        rec[names[i]].append((t0, t1, t2, t3, getattr(m, "last_wait_s", 0.0)))
STEPS, BLOCKS = int(os.environ.get("STEPS", "600")), 6
for i in range(3):
    for _ in range(20): step(i, False)
nmarks0 = len(marks)
mf_marks = []
for b in range(BLOCKS):
    for k in range(3):
        i = (b + k) % 3
        for _ in range(STEPS // BLOCKS):
            before = len(marks)
            step(i, True)
            if i == 0:
                mf_marks.append(marks[-1] if len(marks) > before else None)
try:
    from macfleet import collectives as C
    cm = C.MARKS[-len(mf_marks):] if hasattr(C, "MARKS") else []
except Exception:
    cm = []
allr = macfleet.all_gather_object((socket.gethostname(), rec, mf_marks, cm))
q = lambda v: [round(sorted(v)[int(len(v) * f)] * 1e6) for f in (0.1, 0.5, 0.9)] if v else []
if rank == 0:
    print(f"N={world} threads={torch.get_num_threads()} (quantiles 10/50/90 of rank 0, us)")
    for n in names:
        r = rec[n]
        print(f"  {n:5s} step {q([s[3]-s[0] for s in r])} fwd {q([s[1]-s[0] for s in r])} bwd {q([s[2]-s[1] for s in r])} "
              f"opt {q([s[3]-s[2] for s in r])} wait {q([s[4] for s in r])}")
    # per-step across ranks for mf: the last rank's tail parts
    mr = [a[1]["mf"] for a in allr]; mk = [a[2] for a in allr]; cms = [a[3] for a in allr]
    f2e, red, ex2ret, lastwait, behind = [], [], [], [], []
    parts = {k: [] for k in ["check", "prep", "enter", "pre-red", "reduce", "post", "exit"]}
    for s in range(len(mr[0])):
        ends = [mr[r][s][2] - mr[r][s][4] for r in range(world)]
        last = max(range(world), key=lambda r: ends[r])
        if any(mk[r][s] is None for r in range(world)):
            continue
        enters = [mk[r][s][0] for r in range(world)]
        f2e.append(mk[last][s][0] - ends[last])
        red.append(mk[last][s][1] - max(enters))
        ex2ret.append(mr[last][s][2] - mk[last][s][1])
        lastwait.append(mr[last][s][4])
        behind.append(ends[last] - ends[0])
        if cms[last] and len(cms[last]) > s and len(cms[last][s]) == 8:
            m = cms[last][s]
            for j, k in enumerate(parts):
                parts[k].append(m[j + 1] - m[j])
    print(f"  mf tail (the last rank): wait {q(lastwait)} = backward end->exchange {q(f2e)} + "
          f"last arrival->exchange exit {q(red)} + exchange exit->backward returned {q(ex2ret)}; rank 0 behind {q(behind)}")
    if any(parts.values()):
        print("  inside its all_reduce:", {k: q(v) for k, v in parts.items()})
dist.destroy_process_group()
macfleet.shutdown()
