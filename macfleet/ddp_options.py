"""What DDP's own options mean to ``DataParallel``, so that a DDP script ports by its name alone.

A script that moves to Macs from torch DDP keeps its wrapping line:
``DistributedDataParallel(model, device_ids=[local_rank], output_device=local_rank)`` becomes
``macfleet.DataParallel(...)`` with the same arguments. ``device_ids`` names the rank's one
device; as in DDP the forward then moves the inputs to it: to the model's device, which is the
one a consistent DDP script names, and which on a Mac is the GPU whatever ``local_rank`` says
(a CUDA script's ``device_ids=[1]`` on a Mac's second rank means its GPU, not a second one).
``output_device``, ``dim``, ``gradient_as_bucket_view`` (the gradients are the buckets' views
anyway), ``static_graph``, ``init_sync`` (every rank starts from rank 0's parameters anyway),
``check_reduction``, ``batched_grad_copy`` and ``lazy_bucket_allocation`` (torch 2.15: DDP
frees its buckets, which are copies of the gradients, after backward; DataParallel's buckets
are the gradients, with no copy to free) change nothing. A ``process_group`` is refused:
DataParallel averages over the macfleet job, and a group of torch.distributed's is no subset of
it; DDP's other options say what to do instead (``refuse_ddp_only``). (``forward_sync_buffers``,
torch 2.13's name for ``broadcast_buffers`` at each forward, whose False keeps the buffers' sync
at the start where ``broadcast_buffers=False`` drops it, and DDP's None for those and for
``bucket_cap_mb`` are read where DataParallel reads its own options.)
"""

from __future__ import annotations

import math
from dataclasses import fields, is_dataclass, replace
from typing import Any, Sequence

import torch
from torch import nn

from macfleet.errors import ConfigError

DeviceId = int | str | torch.device

# DDP's other options, where given other than DDP's default: what a ported script does instead
DDP_ONLY = {
    "mixed_precision": "DDP's mixed_precision (torch's private _MixedPrecision) has no counterpart here: train under "
                       "torch.autocast (bfloat16 on a Mac's GPU, as the MNIST example's --amp does), and pass "
                       "compression='bf16' or 'fp16' to send the gradients in half precision",
    "device_mesh": "DataParallel averages gradients over the whole macfleet job: leave device_mesh out (a "
                   "DeviceMesh of torch.distributed's has no meaning for it)",
    "bucket_cap_mb_list": "give bucket_cap_mb (the cap of every bucket) and first_bucket_mb (the first one's) in "
                          "place of a list of caps",
    "delay_all_reduce_named_params": "DataParallel starts each bucket's exchange as soon as its gradients are "
                                     "ready and holds no parameter back to the end of backward: leave "
                                     "delay_all_reduce_named_params and param_to_hook_all_reduce out",
    "skip_all_reduce_unused_params": "DataParallel does not skip the parameters that get no gradient: with "
                                     "find_unused_parameters=True it averages their gradients as zeros; leave "
                                     "skip_all_reduce_unused_params out",
}
DDP_ONLY["param_to_hook_all_reduce"] = DDP_ONLY["delay_all_reduce_named_params"]
DDP_DEFAULTS = {"skip_all_reduce_unused_params": False, "batched_grad_copy": False,  # the rest: None
                "lazy_bucket_allocation": False}


def refuse_ddp_only(options: dict[str, Any]) -> None:
    """Raise for a DDP option that DataParallel does not take, unless it is given DDP's default
    (a ported line may spell those out); ``batched_grad_copy`` and ``lazy_bucket_allocation``
    change nothing, whatever they are given. A name DDP does not have either is a TypeError, as
    Python's for any other unknown keyword."""
    for name, value in options.items():
        if name not in DDP_ONLY and name not in DDP_DEFAULTS:
            raise TypeError(f"DataParallel.__init__() got an unexpected keyword argument {name!r}")
        if name in DDP_ONLY and value is not DDP_DEFAULTS.get(name):
            raise ConfigError(f"{name}={value!r}: {DDP_ONLY[name]}")


def bucket_bytes(name: str, mib: object) -> int:
    """A bucket cap given in MiB, in bytes; 0 gives each parameter a bucket of its own, as in DDP.
    nan and inf failed with a bare ValueError, a negative passed for 0, and a string ("25", as
    argparse hands it over) with "Exceeds the limit (4300 digits)", after a copy of itself made
    2 million characters long."""
    if isinstance(mib, bool) or not isinstance(mib, (int, float)) or not math.isfinite(mib) or mib < 0:
        # DDP(model, [local_rank]): DDP's second argument is device_ids, where ours is the cap
        ported = (f" (DataParallel's second argument is bucket_cap_mb, where DDP's is device_ids: give "
                  f"device_ids={mib!r} by name)" if name == "bucket_cap_mb" and isinstance(mib, (list, tuple)) else "")
        raise ConfigError(f"{name}={mib!r}: give a number of MiB, 0 or more{ported}")
    return int(mib * 2**20)


def input_device(module: nn.Module, device_ids: Sequence[DeviceId] | None, process_group: object) -> torch.device | None:
    """Where the forward moves its inputs: the module's device where ``device_ids`` is given (DDP's
    rule), None where it is not. Raises for what DDP's options cannot mean here."""
    if process_group is not None:
        raise ConfigError(
            "DataParallel averages gradients over the whole macfleet job: leave process_group out "
            "(a torch.distributed group has no meaning for it)")
    if device_ids is None:
        return None
    if isinstance(device_ids, (int, str, torch.device)) or len(device_ids) != 1:
        raise ConfigError(
            f"device_ids={device_ids!r}: give the one device of this rank in a list, as for DDP "
            f"(device_ids=[local_rank]), or leave it out")
    devices = {p.device for p in module.parameters()} | {b.device for b in module.buffers()}
    if len(devices) > 1:
        names = ", ".join(sorted(str(d) for d in devices))
        raise ConfigError(
            f"device_ids names one device, and this model is on several ({names}): leave device_ids out "
            f"for such a model, as DDP asks, and move the inputs yourself")
    return devices.pop() if devices else None


def to_device(value: Any, device: torch.device) -> Any:
    """``value`` with every tensor in it moved to ``device``: tensors, and tuples (named ones
    too), lists, dicts and dataclasses of them, as DDP moves a forward's inputs."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*(to_device(v, device) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(to_device(v, device) for v in value)
    if isinstance(value, dict):
        return type(value)((k, to_device(v, device)) for k, v in value.items())
    if is_dataclass(value) and not isinstance(value, type):
        return replace(value, **{f.name: to_device(getattr(value, f.name), device) for f in fields(value) if f.init})
    return value
