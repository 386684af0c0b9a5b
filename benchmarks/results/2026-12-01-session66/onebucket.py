"""The `many` model (162 parameters, 2.7 MB of gradients): DataParallel with its default
buckets (the first 1 MiB, then 25 MiB: two buckets and the bucket thread) against all in one
bucket (no thread: averaged on the training thread after backward), DDP (gloo) and the bare
model, in turns, in the same processes. Run under macfleet launch --nproc N."""
import json, os, sys, torch
import torch.distributed as dist
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from train_throughput import Contender, build, interleaved
from statistics import median_high
import macfleet

steps, threads, model_name = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
macfleet.init(device="cpu")
torch.set_num_threads(threads)
rank, world = macfleet.rank(), macfleet.world_size()
dist.init_process_group("gloo", rank=rank, world_size=world)
bare, shape = build(model_name)
g = torch.Generator().manual_seed(rank)
batch = 64
x = torch.randn(batch, *shape, generator=g); y = torch.randint(0, 10, (batch,), generator=g)
two = macfleet.DataParallel(build(model_name)[0])
one = macfleet.DataParallel(build(model_name)[0], first_bucket_mb=100, bucket_cap_mb=100)
ddp = torch.nn.parallel.DistributedDataParallel(build(model_name)[0])
cs = [Contender("default", two, torch.optim.SGD(two.parameters(), lr=0.01), lambda m=two: m.last_wait_s),
      Contender("one-bucket", one, torch.optim.SGD(one.parameters(), lr=0.01), lambda m=one: m.last_wait_s),
      Contender("ddp", ddp, torch.optim.SGD(ddp.parameters(), lr=0.01)),
      Contender("bare", bare, torch.optim.SGD(bare.parameters(), lr=0.01))]
interleaved(cs, x, y, steps, lambda: None, blocks=8)
out = {}
for c in cs:
    t = torch.tensor([median_high(c.times)], dtype=torch.float64)
    macfleet.all_reduce(t, "max")
    out[c.library] = t.item() * 1e3
if rank == 0:
    print("RESULT", json.dumps({"N": world, "model": model_name, "buckets": [len(two.buckets), len(one.buckets)],
                                **{k: round(v, 3) for k, v in out.items()},
                                "ddp/default": round(out["ddp"] / out["default"], 3),
                                "ddp/one": round(out["ddp"] / out["one-bucket"], 3)}))
dist.destroy_process_group()
macfleet.shutdown()
