"""The GPU path on CUDA (standing in for Metal): run under `macfleet launch --device cuda`.

Checks on every rank, printing one line of JSON: collectives on CUDA tensors (exact; parameters and
inference tensors in place), the DataParallel oracle on CUDA against a CPU run of the whole batch
(one model, two in one backward, SyncBatchNorm, a reentrant checkpoint, a layer in two reentrant
checkpoints, two forwards before one backward, a gradient penalty, a custom autograd function's
all-reduce inside backward, a bucket over 1 MiB lent for the size of its gradients, a model
fine-tuned with layers unfrozen and a new head after wrapping, a deep copy of a wrapper trained on
its own, DDP's ``device_ids`` moving the inputs, and ``torch.compile`` of the wrapper with
inductor), a model left on the CPU warned of, memory reports and the cache given back, the
memory fraction, and ``PolledEvent`` (how MPS events are waited for) on a real device event.
The oracle also runs with every device copy issued from the thread that runs backward, as on
MPS (``Device.copies_from_training_thread``).
"""

import copy
import gc
import json
import os
import sys
import time
import warnings

import torch
from torch import nn

import macfleet
from macfleet import runtime

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import dp_cases  # noqa: E402
import oracle  # noqa: E402

macfleet.init()
rank, world, dev = macfleet.rank(), macfleet.world_size(), macfleet.device()
out = {"rank": rank, "device": str(dev)}
for dtype in (torch.float32, torch.float16, torch.bfloat16):
    ok = True
    for numel in (100_003, 600_001):  # the larger one is over 1 MiB in float32 (one call per rank's row)
        t = (torch.arange(numel, device=dev) % 5).to(dtype) + rank
        macfleet.all_reduce(t)
        want = ((torch.arange(numel) % 5).double() * world + sum(range(world))).to(dtype)
        ok = ok and bool(torch.equal(t.cpu(), want)) and t.device.type == "cuda"
    out[f"all_reduce_{dtype}"] = ok
# MPS's way of waiting for an event (PolledEvent) on a real device event: back only once the
# work before it is done
from macfleet.backends import PolledEvent  # noqa: E402

torch.cuda.synchronize()
started = time.monotonic()
torch.cuda._sleep(200_000_000)  # about 0.1 s of GPU clock cycles
event = torch.cuda.Event()
event.record()
PolledEvent(event).synchronize()
out["polled_event"] = bool(event.query()) and time.monotonic() - started > 0.05
b = torch.full((7,), float(rank), device=dev)
macfleet.broadcast(b, 1 % world)
out["broadcast"] = bool((b.cpu() == 1 % world).all())
# an early-stopping flag (a logical or) and complex numbers, as views of the numbers they are made of
flag = torch.tensor([rank == 0, False, True], device=dev)
macfleet.all_reduce(flag)
c = torch.tensor([1 + 2j, -3j], device=dev) * (rank + 1)
macfleet.all_reduce(c)
whole = sum(range(1, world + 1))
out["bool_and_complex"] = (flag.tolist() == [True, False, True] and flag.device.type == "cuda"
                           and c.cpu().tolist() == [(1 + 2j) * whole, -3j * whole] and c.device.type == "cuda")
# a CUDA parameter (a leaf that requires grad), broadcast and averaged in place as dist's are
p = nn.Parameter(torch.full((1000,), float(rank), device=dev))
macfleet.broadcast(p, world - 1)
first = bool((p.detach().cpu() == world - 1).all())
p.data.fill_(float(rank))
macfleet.all_reduce(p, "avg")
out["parameter_in_place"] = first and bool((p.detach().cpu() == (world - 1) / 2).all()) and p.requires_grad
# a CUDA tensor made under inference_mode (an evaluation metric), reduced outside that mode and inside it
with torch.inference_mode():
    metric = torch.full((300_001,), float(rank + 1), device=dev)
macfleet.all_reduce(metric)
outside = bool((metric.cpu() == whole).all())
with torch.inference_mode():
    macfleet.broadcast(metric, world - 1)
    macfleet.all_reduce(metric, "avg")
out["inference_in_place"] = outside and bool((metric.cpu() == whole).all()) and metric.is_inference()
# the training oracle on the GPU: the whole model in one bucket, then a bucket per module
# (the communication thread), the first wrapper freed before the second is built


def train(model: nn.Module, run, x: torch.Tensor, y: torch.Tensor) -> None:
    """Six SGD steps of ``model``'s parameters on ``run(x)``'s loss against ``y``."""
    opt = oracle.make_optimizer(model)
    for _ in range(6):
        opt.zero_grad()
        nn.functional.cross_entropy(run(x), y).backward()
        opt.step()


def max_diff(got: nn.Module, want: nn.Module) -> float:
    return max((p.detach().cpu() - q.detach()).abs().max().item()
               for p, q in zip(got.parameters(), want.parameters(), strict=True))


x, y = oracle.make_batch()
shard = slice(rank * oracle.BATCH // world, (rank + 1) * oracle.BATCH // world)
xs, ys = x[shard].to(dev), y[shard].to(dev)
tiny = {"bucket_cap_mb": 1e-4, "first_bucket_mb": 1e-4}
ref = oracle.make_model()
train(ref, ref, x, y)
for label, options in (("one_bucket", {}), ("many_buckets", tiny)):
    model = macfleet.DataParallel(oracle.make_model().to(dev), **options)
    train(model, model, xs, ys)
    out[f"oracle_max_diff_{label}"] = max_diff(model.module, ref)
    out[f"buckets_{label}"] = len(model.buckets)
    del model
    gc.collect()  # its staging memory is unlocked and unmapped before the next wrapper's
# two wrapped models in one backward (a GAN's generator step), buckets per module, staged
# through the one communication thread of the process
chain_ref = dp_cases.Chained()
train(chain_ref, chain_ref, x, y)


def two_models_max_diff() -> float:
    chain = dp_cases.Chained().to(dev)
    pair = nn.Sequential(macfleet.DataParallel(chain.g, **tiny), macfleet.DataParallel(chain.d, **tiny))
    train(chain, pair, xs, ys)
    return max_diff(chain, chain_ref)


out["oracle_max_diff_two_models"] = two_models_max_diff()
gc.collect()
# SyncBatchNorm (converted as for DDP) against plain BatchNorms on the whole batch, running
# statistics included: its statistics cross to the host and back on the thread that runs
# forward and backward, and its backward's collectives come after the buckets released before them
sync_bn_ref = dp_cases.make("sync-bn")
train(sync_bn_ref, sync_bn_ref, x, y)


def sync_bn_max_diff() -> float:
    net = nn.SyncBatchNorm.convert_sync_batchnorm(dp_cases.make("sync-bn")).to(dev)
    model = macfleet.DataParallel(net, **tiny)
    train(net, model, xs, ys)
    want = sync_bn_ref.state_dict()
    return max((v.detach().cpu().double() - want[k].double()).abs().max().item() for k, v in net.state_dict().items())


out["oracle_max_diff_sync_batch_norm"] = sync_bn_max_diff()
gc.collect()
# what DataParallel's end of backward must find on any device: a reentrant checkpoint over the
# last layers (the step's first gradients come in a nested backward), two forwards before one
# backward past a buffer the first one saved, a gradient penalty's autograd.grad, and a custom
# autograd function's all-reduce in the middle of backward (after the buckets released before it);
# a layer run in two reentrant checkpoints (its gradient comes twice in one backward); and a
# bucket of 2.5 MB that lends its views for the size of its gradients (``wide``, default bucket
# sizes): zeroed on the GPU at backward's start, autograd adds into it; a model in channels_last,
# before wrapping and after
CASES = ("checkpoint", "two-forwards", "input-gradient", "in-backward", "shared-checkpoints", "wide", "channels-last")


def case_max_diff(case: str) -> float:
    """``dp_cases`` CASE on the GPU against the same on the CPU on the whole batch."""
    want, net = dp_cases.make(case), dp_cases.for_ranks(case, dp_cases.make(case).to(dev))
    model = macfleet.DataParallel(net, **({} if case == "wide" else tiny))
    for module, run, inputs, targets in ((want, want, x, y), (net, model, xs, ys)):
        opt = oracle.make_optimizer(module)
        for step in range(6):
            dp_cases.change(case, module, step, rank=0)  # channels-last's conversion; none of CASES makes new parameters
            opt.zero_grad()
            dp_cases.loss(case, run, inputs, targets).backward()
            opt.step()
    return max_diff(net, want)


for case in CASES:
    out[f"oracle_max_diff_{case}"] = case_max_diff(case)
gc.collect()
# MPS's way (Device.copies_from_training_thread): every copy to and from the host buffers
# issued by the thread that runs backward, none by the bucket thread; many buckets, then two
# models sharing the bucket thread
device_impl = runtime.runtime().device
device_impl.copies_from_training_thread = True
model = macfleet.DataParallel(oracle.make_model().to(dev), **tiny)
train(model, model, xs, ys)
out["oracle_max_diff_copies_from_training_thread"] = max_diff(model.module, ref)
del model
out["oracle_max_diff_two_models_copies_from_training_thread"] = two_models_max_diff()
out["oracle_max_diff_sync_batch_norm_copies_from_training_thread"] = sync_bn_max_diff()
for case in CASES:
    out[f"oracle_max_diff_{case}_copies_from_training_thread"] = case_max_diff(case)
device_impl.copies_from_training_thread = False
gc.collect()
# fine-tuning: a layer unfrozen, another frozen and a new head given after wrapping; the
# buckets and their host staging buffers are laid out again at the next forward
tuned_ref = dp_cases.make("fine-tune")
tuned = dp_cases.make("fine-tune").to(dev)
for module, run, inputs, targets, r in ((tuned_ref, tuned_ref, x, y, 0),
                                        (tuned, macfleet.DataParallel(tuned, **tiny), xs, ys, rank)):
    opt = oracle.make_optimizer(module)
    for step in range(6):
        if dp_cases.change("fine-tune", module, step, r):
            module.to(inputs.device)  # the new head
            opt = oracle.make_optimizer(module)
        opt.zero_grad()
        nn.functional.cross_entropy(run(inputs), targets).backward()
        opt.step()
out["oracle_max_diff_fine_tune"] = max_diff(tuned, tuned_ref)
del run
gc.collect()
# DDP's wrapping line, ported by its name: device_ids=[local_rank] (rank 1's names a second GPU
# where the ranks share one) makes the forward move its inputs to the model's device, here from
# the CPU, as DDP's does
ported = macfleet.DataParallel(oracle.make_model().to(dev), device_ids=[rank], output_device=rank, **tiny)
train(ported, ported, x[shard], ys)
out["oracle_max_diff_device_ids"] = max_diff(ported.module, ref)
del ported
gc.collect()
# a copy (copy.deepcopy, AveragedModel) of a wrapper that trained: its buckets and their host
# staging buffers are laid out at the copy's first training forward, and it trains on its own
teacher = macfleet.DataParallel(oracle.make_model().to(dev), **tiny)
train(teacher, teacher, xs, ys)
student, student_ref = copy.deepcopy(teacher), copy.deepcopy(ref)
train(student, student, xs, ys)
train(student_ref, student_ref, x, y)
out["oracle_max_diff_copy"] = max(max_diff(student.module, student_ref), max_diff(teacher.module, ref))
out["copy_trained"] = max_diff(student.module, ref) > 1e-3
del teacher, student
gc.collect()
# torch.compile of the wrapper, as DDP's users write it, with the default backend (inductor:
# Triton kernels on CUDA), compiled once although the script makes a loss module at every step
try:
    torch._dynamo.config.error_on_recompile = True
    compiled_module = oracle.make_model().to(dev)
    compiled = torch.compile(macfleet.DataParallel(compiled_module, **tiny))
    opt = oracle.make_optimizer(compiled_module)
    for _ in range(6):
        opt.zero_grad()
        nn.CrossEntropyLoss()(compiled(xs), ys).backward()  # a new module: it registers a buffer
        opt.step()
    out["oracle_max_diff_compiled"] = max_diff(compiled_module, ref)
except Exception as exc:  # a check script: say what failed, and go on with the other checks
    out["oracle_max_diff_compiled"] = f"{type(exc).__name__}: {str(exc)[:300]}"
# a model wrapped where it was built, on the CPU, by a rank that drives the GPU: rank 0 warns,
# at this script's line, and not for the model moved to the GPU first
with warnings.catch_warnings(record=True) as said:
    warnings.simplefilter("always")
    left = macfleet.DataParallel(oracle.make_model(), **tiny)
    moved = macfleet.DataParallel(oracle.make_model().to(dev), **tiny)
cpu_warnings = [w for w in said if "parameters are on the CPU" in str(w.message)]
out["cpu_model_warned"] = (len(cpu_warnings) == (1 if rank == 0 else 0)
                           and all(w.filename == __file__ for w in cpu_warnings))
del left, moved
gc.collect()
# memory as macfleet reports it, and the cache given back (what the example does once an epoch)
before = macfleet.memory()
block = torch.empty(64 << 20, dtype=torch.uint8, device=dev)
held = macfleet.memory()
del block
cached = macfleet.memory()
macfleet.empty_cache()
after = macfleet.memory()
out["memory_reported"] = held["allocated"] - before["allocated"] >= 64 << 20 and held["reserved"] >= held["allocated"]
out["cache_given_back"] = cached["reserved"] - after["reserved"] >= 64 << 20
# memory fraction: asking for more than this process's share must fail. By default the share is
# 0.9 over the ranks on this GPU (ranks take a host's GPUs in turn): one rank alone is uncapped.
total = torch.cuda.get_device_properties(dev).total_memory
out["memory_fraction_env"] = float(os.environ.get("MACFLEET_MEMORY_FRACTION", "0"))
on_this_gpu = len([r for r in range(int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
                   if r % torch.cuda.device_count() == dev.index])
try:
    big = torch.empty(int(total * 0.6), dtype=torch.uint8, device=dev)
    out["over_share_allocation"] = "allowed"
    del big
except torch.cuda.OutOfMemoryError:  # the same class as newer torch's torch.OutOfMemoryError; on every torch
    out["over_share_allocation"] = "refused"
out["memory_share_by_ranks_on_gpu"] = (
    out["memory_fraction_env"] == (0.0 if on_this_gpu == 1 else round(0.9 / on_this_gpu, 4))
    and out["over_share_allocation"] == ("allowed" if on_this_gpu == 1 else "refused"))
print("CUDA " + json.dumps(out), flush=True)
macfleet.shutdown()
