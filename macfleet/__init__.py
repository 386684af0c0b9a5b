"""macfleet: train one PyTorch model on several Macs (or processes) at once.

    import macfleet
    macfleet.init()
    model = macfleet.DataParallel(model.to(macfleet.device()))
    ...loss.backward()   # gradients are averaged over every rank here
    optimizer.step()

Run with ``macfleet launch --nproc 2 train.py`` (one Mac) or ``--hosts a:2,b:2`` (several);
with plain ``python train.py`` the job has one rank.

The torch-dependent names load on first use, so the launcher and the agents (which only need
the protocol) start without importing torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from macfleet.errors import (
    CollectiveTimeout,
    ConfigError,
    JobAborted,
    MacfleetError,
    PeerLost,
    ProtocolError,
    RendezvousError,
    UnevenInputs,
)

__version__ = "0.1.0"

_LAZY = {
    "init": "macfleet.runtime",
    "shutdown": "macfleet.runtime",
    "rank": "macfleet.runtime",
    "world_size": "macfleet.runtime",
    "local_rank": "macfleet.runtime",
    "shares": "macfleet.runtime",
    "device": "macfleet.runtime",
    "memory": "macfleet.runtime",
    "empty_cache": "macfleet.runtime",
    "all_reduce": "macfleet.runtime",
    "broadcast": "macfleet.runtime",
    "all_gather": "macfleet.runtime",
    "barrier": "macfleet.runtime",
    "host_tensor": "macfleet.runtime",
    "broadcast_object": "macfleet.objects",
    "all_gather_object": "macfleet.objects",
    "DataParallel": "macfleet.parallel",
    "DistributedSampler": "macfleet.sampler",
    "SyncBatchNorm": "macfleet.sync_batch_norm",
}

if TYPE_CHECKING:
    from macfleet.objects import all_gather_object, broadcast_object
    from macfleet.parallel import DataParallel
    from macfleet.runtime import (all_gather, all_reduce, barrier, broadcast, device, empty_cache, host_tensor, init,
                                  local_rank, memory, rank, shares, shutdown, world_size)
    from macfleet.sampler import DistributedSampler
    from macfleet.sync_batch_norm import SyncBatchNorm


def __getattr__(name: str) -> Any:
    if name == "checkpoint":  # macfleet.checkpoint.save(...) without a separate import
        value = import_module("macfleet.checkpoint")
        globals()[name] = value
        return value
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'macfleet' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


# Spelled out, not built from _LAZY, so that linters and type checkers see what is exported.
__all__ = [
    "CollectiveTimeout", "ConfigError", "JobAborted", "MacfleetError", "PeerLost", "ProtocolError",
    "RendezvousError", "UnevenInputs", "__version__", "checkpoint",
    "init", "shutdown", "rank", "world_size", "local_rank", "shares", "device", "memory", "empty_cache", "all_reduce",
    "broadcast", "all_gather", "barrier", "host_tensor", "broadcast_object", "all_gather_object", "DataParallel",
    "DistributedSampler", "SyncBatchNorm",
]
