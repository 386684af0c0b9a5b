"""What a training script does with macfleet, after ``torch.set_default_device(DEVICE)``:
``default_device.py DEVICE OUT_DIR``. Mac scripts often start with
``torch.set_default_device("mps")``; what macfleet makes for itself (host buffers, its own
small tensors, the sampler's shuffle) must stay on the host whatever the default. ``meta``
stands in for a GPU where there is none: a tensor made there has no data, so any of ours made
on the default device fails. The model and the data are put on ``macfleet.device()`` by name,
as a script would with the default device it set. Prints ``default device ok`` at the end."""

import os
import sys

import torch
from torch import nn

import macfleet


def main() -> None:
    torch.set_default_device(sys.argv[1])
    out = sys.argv[2]
    macfleet.init()
    rank, world, dev = macfleet.rank(), macfleet.world_size(), macfleet.device()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16, device=dev), nn.BatchNorm1d(16, device=dev), nn.ReLU(),
                        nn.Linear(16, 4, device=dev))
    model = macfleet.DataParallel(net, bucket_cap_mb=1e-4, first_bucket_mb=1e-4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    batches = [(torch.randn(6, 8, generator=g, device="cpu").to(dev),
                torch.randint(0, 4, (6,), generator=g, device="cpu").to(dev))
               for _ in range(3 + rank)]  # uneven: rank r has 3 + r batches
    sampler = macfleet.DistributedSampler(50, seed=1)
    order = list(sampler)
    with model.join(optimizer=opt):
        for step, (x, y) in enumerate(batches):
            opt.zero_grad()
            if step == 0:
                with model.no_sync():
                    nn.functional.cross_entropy(model(x), y).backward()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    synced = macfleet.DataParallel(nn.SyncBatchNorm.convert_sync_batchnorm(nn.BatchNorm1d(8, device=dev)))
    synced(batches[0][0]).sum().backward()
    params = torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()])
    everyone = macfleet.all_gather(params)
    assert all(torch.equal(everyone[0], e) for e in everyone), "ranks' parameters differ"
    total = macfleet.all_reduce(torch.ones(3, device=dev))
    assert total.tolist() == [float(world)] * 3, total
    half = macfleet.all_reduce(torch.ones(5, device=dev, dtype=torch.float16), compression="bf16")
    assert half.tolist() == [float(world)] * 5, half
    src = macfleet.broadcast(torch.full((4,), float(rank), device=dev), 0)
    assert src.tolist() == [0.0] * 4, src
    sparse = macfleet.all_reduce(torch.eye(3, device=dev).to_sparse())
    assert torch.equal(sparse.to_dense().cpu(), torch.eye(3, device="cpu") * world), sparse
    shared = macfleet.host_tensor(10, torch.float32).fill_(1)
    assert shared.device.type == "cpu"
    macfleet.all_reduce(shared)
    assert shared.tolist() == [float(world)] * 10, shared
    orders = macfleet.all_gather_object(order)
    assert set(sum(orders, [])) == set(range(50)), orders  # every sample, drawn by a CPU generator
    assert macfleet.broadcast_object({"rank": rank})["rank"] == 0
    macfleet.barrier()
    macfleet.checkpoint.save(os.path.join(out, "ck.pt"), model, opt, step=3, sampler=sampler)
    loaded = macfleet.checkpoint.load(os.path.join(out, "ck.pt"), model, opt, sampler)
    assert loaded.step == 3, loaded
    print("default device ok", flush=True)
    macfleet.shutdown()


if __name__ == "__main__":
    main()
