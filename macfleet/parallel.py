"""``macfleet.DataParallel``: gradients averaged over all ranks during ``backward()``.

At construction, rank 0's parameters and buffers are broadcast so every rank starts equal.
During backward, a hook on each parameter notices the first gradient and queues one callback
that runs when the autograd engine has finished: it records a device event, waits for it on
the host (never on the GPU: a late peer must not stall Metal's command queue), stages the
gradients to a host buffer, averages them over the ring and copies them back. When
``loss.backward()`` returns, every rank holds the same averaged gradients, so
``optimizer.step()`` needs no change.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import torch
from torch import nn

from macfleet import runtime as rt


class DataParallel(nn.Module):
    def __init__(self, module: nn.Module, broadcast_buffers: bool = True) -> None:
        super().__init__()
        self.module = module
        self.runtime = rt.runtime()
        self.broadcast_buffers = broadcast_buffers
        self.require_backward_grad_sync = True
        self._named_params = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self._queued = False
        for name, p in self._named_params:
            rt.runtime().device.check_dtype(p, f"parameter {name!r}")
        if self.runtime.world_size > 1:
            with torch.no_grad():
                _broadcast_flat([p for _, p in module.named_parameters()], "parameters")
                _broadcast_flat(list(module.buffers()), "buffers")
            for _, p in self._named_params:
                p.register_post_accumulate_grad_hook(self._on_grad_ready)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.broadcast_buffers and self.runtime.world_size > 1 and self.training:
            with torch.no_grad():
                _broadcast_flat(list(self.module.buffers()), "buffers")
        return self.module(*args, **kwargs)

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally; the first backward after the block averages them all."""
        previous, self.require_backward_grad_sync = self.require_backward_grad_sync, False
        try:
            yield
        finally:
            self.require_backward_grad_sync = previous

    def _on_grad_ready(self, _: torch.Tensor) -> None:
        if self.require_backward_grad_sync and not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._average_gradients)

    def _average_gradients(self) -> None:
        self._queued = False
        self.runtime.device.record_event().synchronize()
        params = [p for _, p in self._named_params]
        for p in params:
            if p.grad is None:  # unused on this rank: contribute zeros, every rank sends the same layout
                p.grad = torch.zeros_like(p)
        with torch.no_grad():
            for group in _by_dtype(params):
                flat = torch.cat([p.grad.reshape(-1) for p in group])
                rt.all_reduce(flat, "avg", name="gradients")
                offset = 0
                for p in group:
                    n = p.numel()
                    p.grad.copy_(flat[offset: offset + n].view_as(p.grad))
                    offset += n


def _by_dtype(tensors: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    groups: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault(t.dtype, []).append(t)
    return list(groups.values())


def _broadcast_flat(tensors: list[torch.Tensor], what: str) -> None:
    """Broadcast from rank 0 in one message per dtype rather than one per tensor."""
    for group in _by_dtype([t for t in tensors if t.numel()]):
        flat = torch.cat([t.reshape(-1) for t in group])
        rt.broadcast(flat, 0, name=what)
        offset = 0
        for t in group:
            t.copy_(flat[offset: offset + t.numel()].view_as(t))
            offset += t.numel()
