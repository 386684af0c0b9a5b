"""The benchmark's large model, 40 steps, for launch --timeline."""
import torch
from torch import nn
import macfleet
macfleet.init()
dev = macfleet.device()
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                    nn.Linear(4096, 1024), nn.ReLU(), nn.Linear(1024, 10)).to(dev)
model = macfleet.DataParallel(net)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(128, 1024, device=dev), torch.randint(0, 10, (128,), device=dev)
for step in range(40):
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
if dev.type == "cuda":
    torch.cuda.synchronize()
print("buckets", [b.flat.numel() * 4 >> 20 for b in model.buckets])
