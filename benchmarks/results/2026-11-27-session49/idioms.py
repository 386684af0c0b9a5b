"""Idioms of training scripts under DataParallel, against one process on the whole batch (trained
on rank 0 beside the job): ``macfleet launch --nproc 2 idioms.py [CASE,...]``.

``tied`` (an embedding and an output layer sharing one weight), ``twice`` (a layer applied twice
in one forward), ``transposed`` (a parameter that is not contiguous), ``complex`` (a complex64
parameter), ``mixed`` (float32 and float64 layers), ``weightnorm`` (weight_norm and spectral_norm
parametrizations), ``clip`` (clip_grad_norm_ between backward and step), ``scaler`` (bfloat16
autocast, GradScaler, unscale_ and clipping), ``adamw-fused``, ``adam-groups`` (parameter groups
with their own learning rates and weight decay over tied weights)."""
import copy, sys, traceback
import torch
from torch import nn
import macfleet

BATCH = 24
STEPS = 4

class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.mid = nn.Linear(8, 8)
        self.head = nn.Linear(8, 20, bias=False)
        self.head.weight = self.emb.weight
    def forward(self, x):
        return self.head(torch.tanh(self.mid(self.emb(x))))

class Twice(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(10, 10); self.out = nn.Linear(10, 3)
    def forward(self, x):
        return self.out(torch.tanh(self.a(torch.tanh(self.a(x)))))

class Transposed(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3, 10).t())  # non-contiguous parameter
        self.b = nn.Parameter(torch.zeros(3))
        self.mid = nn.Linear(10, 10)
    def forward(self, x):
        return torch.tanh(self.mid(x)) @ self.w + self.b

class Complex(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(10, 3, dtype=torch.complex64))
    def forward(self, x):
        return (x.to(torch.complex64) @ self.w).abs()

class Mixed(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(10, 16)
        self.b = nn.Linear(16, 3).to(torch.float64)
    def forward(self, x):
        return self.b(torch.tanh(self.a(x)).double()).float()

class WeightNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.utils.parametrizations.weight_norm(nn.Linear(10, 16))
        self.b = nn.utils.parametrizations.spectral_norm(nn.Linear(16, 3))
    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))

def mlp():
    return nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 3))

def data(kind):
    g = torch.Generator().manual_seed(5)
    if kind == "tokens":
        return torch.randint(0, 20, (BATCH, 6), generator=g), torch.randint(0, 20, (BATCH, 6), generator=g)
    return torch.randn(BATCH, 10, generator=g), torch.randint(0, 3, (BATCH,), generator=g)

def loss_of(out, y):
    if out.dim() == 3:
        return nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    return nn.functional.cross_entropy(out, y)

def plain_step(model, opt, x, y, extra):
    opt.zero_grad()
    loss_of(model(x), y).backward()
    opt.step()

def clip_step(model, opt, x, y, extra):
    opt.zero_grad()
    loss_of(model(x), y).backward()
    extra.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)))
    opt.step()

def scaler_step(model, opt, x, y, extra):
    scaler = extra[0]
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x)
    scaler.scale(loss_of(out.float(), y)).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
    scaler.step(opt)
    scaler.update()

CASES = {
    "tied": (Tied, "tokens", plain_step, lambda p: torch.optim.SGD(p, lr=0.5, momentum=0.9)),
    "twice": (Twice, "x", plain_step, lambda p: torch.optim.SGD(p, lr=0.5, momentum=0.9)),
    "transposed": (Transposed, "x", plain_step, lambda p: torch.optim.SGD(p, lr=0.5, momentum=0.9)),
    "complex": (Complex, "x", plain_step, lambda p: torch.optim.SGD(p, lr=0.1)),
    "mixed": (Mixed, "x", plain_step, lambda p: torch.optim.SGD(p, lr=0.5)),
    "weightnorm": (WeightNorm, "x", plain_step, lambda p: torch.optim.SGD(p, lr=0.5)),
    "clip": (mlp, "x", clip_step, lambda p: torch.optim.SGD(p, lr=0.5)),
    "scaler": (mlp, "x", scaler_step, lambda p: torch.optim.SGD(p, lr=0.5)),
    "adamw-fused": (mlp, "x", plain_step, lambda p: torch.optim.AdamW(p, lr=0.01, fused=True)),
    "adam-groups": (Tied, "tokens", plain_step, lambda p: torch.optim.Adam([{"params": list(p)[:1], "lr": 0.001}, {"params": list(p)[1:], "lr": 0.01, "weight_decay": 0.1}])),
}

def run(name, rank, world):
    make, kind, step, make_opt = CASES[name]
    torch.manual_seed(1)
    base = make()
    ref = copy.deepcopy(base)
    dp = macfleet.DataParallel(base)
    opt = make_opt(dp.parameters())
    x, y = data(kind)
    shard = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
    extra = [torch.amp.GradScaler("cpu")] if name == "scaler" else []
    for _ in range(STEPS):
        step(dp, opt, x[shard], y[shard], extra)
    if rank != 0:
        return None
    ropt = make_opt(ref.parameters())
    rextra = [torch.amp.GradScaler("cpu")] if name == "scaler" else []
    for _ in range(STEPS):
        step(ref, ropt, x, y, rextra)
    got = dp.module.state_dict(); want = ref.state_dict()
    diff = max(float((got[k].to(torch.complex128) - want[k].to(torch.complex128)).abs().max()) for k in want)
    moved = max(float((want[k].to(torch.complex128) - v.to(torch.complex128)).abs().max()) for k, v in make_init(make).items())
    norms = max(abs(a - b) / b for a, b in zip(extra, rextra, strict=True)) if name == "clip" else None
    return diff, moved, norms

def make_init(make):
    torch.manual_seed(1)
    return make().state_dict()

def main():
    macfleet.init()
    rank, world = macfleet.rank(), macfleet.world_size()
    names = sys.argv[1].split(",") if len(sys.argv) > 1 else list(CASES)
    for name in names:
        try:
            r = run(name, rank, world)
            if rank == 0:
                print(f"{name}: diff {r[0]:.3g} (moved {r[1]:.3g}) {'' if r[2] is None else f'gradient norms before clipping {r[2]:.2g} apart (relative)'}", flush=True)
        except Exception as e:
            print(f"rank {rank} {name}: {type(e).__name__}: {e}", flush=True)
            traceback.print_exc()
    macfleet.shutdown()

main()
