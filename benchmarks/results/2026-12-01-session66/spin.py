"""One process: the bare model's training step (forward, backward, SGD step) by threads, under
whatever OpenMP wait settings the environment gives (read once, at the OpenMP runtime's start)."""
import os, sys, time, torch
from torch.nn import functional as F
sys.path.insert(0, "benchmarks")
from train_throughput import MODELS, build
out = []
for name in sys.argv[1].split(","):
    for threads in [int(t) for t in sys.argv[2].split(",")]:
        torch.set_num_threads(threads)
        model, shape = build(name)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        g = torch.Generator().manual_seed(0)
        x = torch.randn(MODELS[name], *shape, generator=g); y = torch.randint(0, 10, (MODELS[name],), generator=g)
        ts = []
        steps = 15 if name == "large" else 100
        for s in range(steps + 5):
            t = time.perf_counter()
            opt.zero_grad(set_to_none=True); F.cross_entropy(model(x), y).backward(); opt.step()
            if s >= 5: ts.append(time.perf_counter() - t)
        ts.sort()
        out.append(f"{name}/{threads}t {ts[len(ts)//2]*1e3:.2f}")
env = " ".join(f"{k}={os.environ[k]}" for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT") if k in os.environ) or "(unset)"
print(f"{env:40s} step ms: " + "  ".join(out))
