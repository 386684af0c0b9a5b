"""Session 49, device (``macfleet launch --nproc N --device cuda gpu_idioms.py``): on the GPU path,
against one process on the whole batch (trained on rank 0 beside the job): a model with an
embedding on the CPU and the rest on the GPU (buckets of both devices); SyncBatchNorm in float64
and float32; an EMA (``AveragedModel``) of a DataParallel, and its pickle loaded back. Prints one
line of JSON a rank."""
import copy, io, json
import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel
import macfleet

macfleet.init()
rank, world, dev = macfleet.rank(), macfleet.world_size(), macfleet.device()
B = 24
g = torch.Generator().manual_seed(3)
out = {"rank": rank}


class Mixed(nn.Module):
    """An embedding kept on the CPU (a large vocabulary), the rest on the GPU."""
    def __init__(self):
        super().__init__()
        self.emb = nn.EmbeddingBag(50, 16)
        self.head = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 3)).to(dev)
    def forward(self, ids):
        return self.head(self.emb(ids).to(dev))


def conv_bn(dtype):
    torch.manual_seed(5)
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(8, 3)).to(dev, dtype)


def train(model, inputs, y, steps=5):
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(model(inputs), y).backward()
        opt.step()


def diff(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return max(float((sa[k].double().cpu() - sb[k].double().cpu()).abs().max()) for k in sb if sb[k].is_floating_point())


shard = slice(rank * B // world, (rank + 1) * B // world)
y = torch.randint(0, 3, (B,), generator=g).to(dev)
# 1. parameters on two devices
ids = torch.randint(0, 50, (B, 5), generator=g)
try:
    torch.manual_seed(1)
    net = Mixed()
    ref = copy.deepcopy(net)
    dp = macfleet.DataParallel(net)
    train(dp, ids[shard], y[shard])
    out["mixed_buckets"] = sorted({str(b.flat.device) for b in dp.buckets})
    if rank == 0:
        train(ref, ids, y)
        out["mixed_diff"] = diff(dp.module, ref)
except Exception as e:
    out["mixed"] = f"{type(e).__name__}: {str(e)[:300]}"
# 2. SyncBatchNorm in float64 and float32 on the GPU
for dtype in (torch.float64, torch.float32):
    x = torch.randn(B, 3, 6, 6, generator=g, dtype=dtype).to(dev)
    net = conv_bn(dtype)
    ref = copy.deepcopy(net)
    dp = macfleet.DataParallel(nn.SyncBatchNorm.convert_sync_batchnorm(net))
    train(dp, x[shard], y[shard])
    if rank == 0:
        train(ref, x, y)
        out[f"sync_bn_{str(dtype)[6:]}_diff"] = diff(dp.module, ref)
# 3. copies on the GPU: an EMA of a wrapper, a pickle loaded back
x = torch.randn(B, 3, 6, 6, generator=g).to(dev)
net = conv_bn(torch.float32)
ref = copy.deepcopy(net)
dp = macfleet.DataParallel(nn.SyncBatchNorm.convert_sync_batchnorm(net))
train(dp, x[shard], y[shard], 1)
ema = AveragedModel(dp)
opt = torch.optim.SGD(dp.parameters(), lr=0.1)
for _ in range(3):
    opt.zero_grad(); nn.functional.cross_entropy(dp(x[shard]), y[shard]).backward(); opt.step(); ema.update_parameters(dp)
if rank == 0:
    train(ref, x, y, 1)
    ref_ema = AveragedModel(ref)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for _ in range(3):
        ropt.zero_grad(); nn.functional.cross_entropy(ref(x), y).backward(); ropt.step(); ref_ema.update_parameters(ref)
    out["ema_diff"] = max(float((p.detach().cpu() - q.detach().cpu()).abs().max()) for p, q in zip(ema.parameters(), ref_ema.parameters()))
    out["ema_model_diff"] = diff(dp.module, ref)
    buf = io.BytesIO(); torch.save(dp, buf); buf.seek(0)
    loaded = torch.load(buf, weights_only=False).eval()
    with torch.no_grad():
        out["pickle_eval_equal"] = bool(torch.equal(loaded(x), dp.module.eval()(x)))
print("IDIOMS " + json.dumps(out), flush=True)
macfleet.shutdown()
