"""Where lending a bucket's views stops paying: for gradients of K KiB each (Linear(d, d) without
bias, 8 MiB of them in all), the same DataParallel with every bucket lent and with none, in
turns. argv: steps threads K[,K...] [device]. Rank 0's medians (us): step, backward (less the wait), wait,
and the step's difference per gradient (copied minus lent: > 0 where lending pays)."""
import math, sys, time, torch
from torch import nn
from torch.nn import functional as F
import macfleet
from macfleet import buckets
from macfleet.runtime import runtime
macfleet.init(device=sys.argv[4] if len(sys.argv) > 4 else "cpu")
dev = macfleet.device()
sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
torch.set_num_threads(int(sys.argv[2]))
rank, world = macfleet.rank(), macfleet.world_size()
steps, blocks = int(sys.argv[1]), 8
MODES = {"copy": 0, "lend": 1 << 40}
if rank == 0:
    print(f"N={world} {dev} threads={torch.get_num_threads()}: K KiB, layers, median us copy/lend (step, backward-wait, wait), per gradient (copy-lend)/layers")
for kib in map(int, sys.argv[3].split(",")):
    d = int(round(math.sqrt(kib * 256)))
    layers = max(4, (8 << 10) // kib)
    torch.manual_seed(0)
    net = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(d, d, bias=False), nn.Tanh())], nn.Linear(d, 10, bias=False))
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(64, d, generator=g); y = torch.randint(0, 10, (64,), generator=g)
    net = net.to(dev); x, y = x.to(dev), y.to(dev)
    mf = macfleet.DataParallel(net)
    opt = torch.optim.SGD(mf.parameters(), lr=1e-4)
    rec = {k: [] for k in MODES}
    def step(k, keep):
        buckets.LEND_BYTES = 0
        runtime().device.lend_grad_bytes = MODES[k]  # as run, on 030bb82: buckets.LEND_BYTES_PER_PARAM
        t0 = time.perf_counter(); opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(mf(x), y); t1 = time.perf_counter()
        loss.backward(); t2 = time.perf_counter()
        opt.step(); sync(); t3 = time.perf_counter()
        if keep: rec[k].append((t3 - t0, t2 - t1 - mf.last_wait_s, mf.last_wait_s))
    for k in MODES:
        for _ in range(10): step(k, False)
    keys = list(MODES)
    for b in range(blocks):
        for k in keys[b % 2:] + keys[:b % 2]:
            for _ in range(steps // blocks): step(k, True)
    med = lambda v: sorted(v)[len(v) // 2] * 1e6
    m = {k: [round(med([s[j] for s in r])) for j in range(3)] for k, r in rec.items()}
    if rank == 0:
        nb = [len(b.params) for b in mf.buckets]
        print(f"  K={kib:5d} d={d:4d} layers={layers:4d} buckets={nb} copy={m['copy']} lend={m['lend']} per-grad step {(m['copy'][0]-m['lend'][0])/layers:+.1f} backward {(m['copy'][1]-m['lend'][1])/layers:+.1f}", flush=True)
macfleet.shutdown()
