"""One process, no macfleet: torchvision's ResNet-18 (batch 8 of 32x32) trained in float32 and in
float64 from the same start, SGD lr 0.1. How far apart rounding alone takes them after 1 and 3
steps: the scale of what a comparison of DataParallel with one process may show on this model."""
import torch, torchvision, copy
from torch import nn
torch.manual_seed(3)
m = torchvision.models.resnet18(num_classes=5)
g = torch.Generator().manual_seed(9)
xs, ys = torch.randn(8, 3, 32, 32, generator=g), torch.randint(0, 5, (8,), generator=g)
for steps in (1, 3):
    a = copy.deepcopy(m); b = copy.deepcopy(m).double()
    for model, x in ((a, xs), (b, xs.double())):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(steps):
            opt.zero_grad(); nn.functional.cross_entropy(model(x), ys).backward(); opt.step()
    sa, sb = a.state_dict(), b.state_dict()
    print(steps, max(float((sa[k].double() - sb[k]).abs().max()) for k in sa if sa[k].is_floating_point()))
