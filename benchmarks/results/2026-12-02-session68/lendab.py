"""A benchmark model (train_throughput's build) with DataParallel's buckets lent (the device's
lend_grad_bytes = inf) and copied (0, buckets over 1 MiB), in turns in the same processes.
argv: steps threads model[,model...] device. Rank 0's medians (us): step, backward less the wait, wait."""
import os, sys, time, torch
from torch.nn import functional as F
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from train_throughput import build, MODELS
import macfleet
from macfleet.runtime import runtime
macfleet.init(device=sys.argv[4])
torch.set_num_threads(int(sys.argv[2]))
dev = macfleet.device()
sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
rank, world = macfleet.rank(), macfleet.world_size()
steps, blocks = int(sys.argv[1]), 8
MODES = {"copy": 0, "lend": float("inf")}
for name in sys.argv[3].split(","):
    model, shape = build(name)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(MODELS[name], *shape, generator=g).to(dev); y = torch.randint(0, 10, (MODELS[name],), generator=g).to(dev)
    mf = macfleet.DataParallel(model.to(dev))
    opt = torch.optim.SGD(mf.parameters(), lr=1e-4)
    rec = {k: [] for k in MODES}
    def step(k, keep):
        runtime().device.lend_grad_bytes = MODES[k]
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
    med = lambda v: round(sorted(v)[len(v) // 2] * 1e6)
    m = {k: [med([s[j] for s in r]) for j in range(3)] for k, r in rec.items()}
    if rank == 0:
        print(f"N={world} {dev} {name}: buckets {[round(b.flat.numel() * 4 / 2**20, 2) for b in mf.buckets]} MiB; median us (step, backward-wait, wait) copy={m['copy']} lend={m['lend']} lend/copy step {m['lend'][0] / m['copy'][0]:.3f}", flush=True)
macfleet.shutdown()
