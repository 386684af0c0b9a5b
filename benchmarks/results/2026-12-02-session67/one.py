"""Loop one mode for py-spy: argv steps threads model mode (noexall | mf | bare)."""
import os, sys, time, torch
from torch.nn import functional as F
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from train_throughput import build
import macfleet
from macfleet import buckets
mode = sys.argv[4]
if mode.startswith("noex"):
    buckets.exchange = lambda *a: None
if mode == "noexall":
    buckets.LEND_BYTES = 1 << 40
macfleet.init(device="cpu")
torch.set_num_threads(int(sys.argv[2]))
rank = macfleet.rank()
g = torch.Generator().manual_seed(rank)
model, shape = build(sys.argv[3])
x = torch.randn(64, *shape, generator=g); y = torch.randint(0, 10, (64,), generator=g)
m = model if mode == "bare" else macfleet.DataParallel(model)
o = torch.optim.SGD(m.parameters(), lr=0.01)
if rank == 0: open(f"/tmp/pid{rank}", "w").write(str(os.getpid()))
B = []
for i in range(int(sys.argv[1])):
    o.zero_grad(set_to_none=True)
    loss = F.cross_entropy(m(x), y)
    t = time.perf_counter(); loss.backward(); B.append(time.perf_counter() - t)
    o.step()
B.sort()
if rank == 0: print(mode, "backward median us", round(B[len(B) // 2] * 1e6))
macfleet.shutdown()
