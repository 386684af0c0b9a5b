"""One process, no exchange: what a Python hook per parameter costs a backward, by threads.
bare: no hooks; noop: a post-accumulate-grad hook that returns; copy: the hook copies the
gradient into a flat buffer's view and makes that the .grad (DataParallel's unlent path);
lent: every .grad is a zeroed view before backward (autograd adds into it) and the hook returns."""
import sys, time, torch
from torch.nn import functional as F
sys.path.insert(0, "benchmarks")
from train_throughput import build

def run(name, threads, mode, steps=200):
    torch.set_num_threads(threads)
    model, shape = build(name)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, *shape, generator=g); y = torch.randint(0, 10, (64,), generator=g)
    params = list(model.parameters())
    flat = torch.zeros(sum(p.numel() for p in params))
    views, off = {}, 0
    for p in params:
        views[p] = flat[off:off + p.numel()].view_as(p); off += p.numel()
    def noop(p): pass
    def copy(p):
        v = views[p]
        if p.grad is not v:
            v.copy_(p.grad); p.grad = v
    handles = []
    if mode in ("noop", "lent"):
        handles = [p.register_post_accumulate_grad_hook(noop) for p in params]
    elif mode == "copy":
        handles = [p.register_post_accumulate_grad_hook(copy) for p in params]
    times = []
    for s in range(steps + 20):
        for p in params: p.grad = None
        if mode == "lent":
            flat.zero_()
            for p in params: p.grad = views[p]
        loss = F.cross_entropy(model(x), y)
        t = time.perf_counter(); loss.backward(); dt = time.perf_counter() - t
        if s >= 20: times.append(dt)
    for h in handles: h.remove()
    times.sort()
    return times[len(times) // 2] * 1e6, len(params)

for name in sys.argv[1].split(","):
    for threads in [int(t) for t in sys.argv[2].split(",")]:
        res = {}
        for rnd in range(2):
            for mode in ["bare", "noop", "copy", "lent"]:
                res.setdefault(mode, []).append(run(name, threads, mode)[0])
        n = len(list(build(name)[0].parameters()))
        b = min(res["bare"])
        print(f"{name} ({n} params) threads={threads}: backward median us " +
              ", ".join(f"{m} {'/'.join(str(round(v)) for v in vs)}" for m, vs in res.items()) +
              " | per parameter over bare: " + ", ".join(f"{m} {(min(vs) - b) / n:.1f}" for m, vs in res.items() if m != "bare"))
