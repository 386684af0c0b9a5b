import time, torch, macfleet, sys, os
from torch import nn
macfleet.init(device=sys.argv[1])
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "oldsbn"))
import old_sync_batch_norm as old
from macfleet import sync_batch_norm as new
dev = macfleet.device()
sync = (lambda: torch.cuda.synchronize()) if dev.type == "cuda" else (lambda: None)
for shape in [(32, 32, 32, 32), (64, 64, 56, 56)]:
    x = torch.randn(*shape, device=dev, requires_grad=True)
    bn = nn.BatchNorm2d(shape[1]).to(dev); w, b = bn.weight, bn.bias
    dy = torch.randn_like(x)
    def t(fn, n=30):
        for _ in range(5): fn()
        sync(); s = time.perf_counter()
        for _ in range(n): fn()
        sync(); return (time.perf_counter() - s) / n * 1e3
    res = []
    for name, f in (("native", lambda: bn(x)), ("old", lambda: old._SyncBatchNormFunction.apply(x, w, b, 1e-5)[0]),
                    ("new", lambda: new._SyncBatchNormFunction.apply(x, w, b, 1e-5)[0])):
        both = t(lambda: torch.autograd.backward(f(), dy))
        res.append(f"{name} {both:.2f} ms")
    print(dev.type, shape, "fwd+bwd:", ", ".join(res), flush=True)
