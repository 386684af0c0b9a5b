"""``nn.SyncBatchNorm`` over macfleet's ranks: batch statistics of the whole global batch.

torch's SyncBatchNorm shares statistics through a torch.distributed process group; a script
converted for DDP (``nn.SyncBatchNorm.convert_sync_batchnorm(model)``) has none under macfleet.
``DataParallel`` turns each of the wrapped model's ``nn.SyncBatchNorm`` modules into this
subclass in place (same object, parameters and buffers; only the class changes), so the
script needs no edit. The arithmetic is torch's:

- forward: each rank's count, mean and sum of squared deviations per channel, gathered from
  every rank and combined (Chan's formula: no cancellation, unlike sums of squares); the
  running statistics are updated with the global mean and unbiased variance;
- backward: the per-channel sums of ``dy`` and ``dy * (x - mean)`` are summed over all ranks
  for the input's gradient; the weight's and bias's stay local, and DataParallel averages them
  with the other gradients.

So N ranks train as one process would on the whole batch with ``nn.BatchNorm``. Both
collectives are small (2C+1 numbers a rank) and go through the host, as everything of
macfleet's does; in backward they come after the gradient buckets released before them
(``Collectives.drain``).
A forward without autograd, or in eval mode, involves no other rank (as DataParallel's).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from macfleet import runtime as rt
from macfleet.parallel import eagerly


class SyncBatchNorm(nn.SyncBatchNorm):
    """``nn.SyncBatchNorm`` whose statistics are shared over macfleet's ranks."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not (self.training and torch.is_grad_enabled()) or rt.world_size() == 1:
            # eval, or autograd off, or alone: a plain BatchNorm. Not nn.SyncBatchNorm's forward,
            # which refuses a CPU or MPS tensor in training mode whenever a torch.distributed
            # process group exists, even of one process.
            return _BatchNorm.forward(self, input)
        return eagerly(self._synced)(input)  # collectives: torch.compile leaves this out of its graph

    def _synced(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        self._check_non_zero_input_channels(input)
        momentum = 0.0 if self.momentum is None else self.momentum
        if self.track_running_stats:
            assert self.num_batches_tracked is not None
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # a cumulative average, as torch's
                momentum = 1.0 / float(self.num_batches_tracked)
        out, mean, var, count = _SyncBatchNormFunction.apply(input, self.weight, self.bias, self.eps)
        if self.track_running_stats:
            assert self.running_mean is not None and self.running_var is not None
            with torch.no_grad():
                unbiased = var * (count / max(count - 1, 1))
                self.running_mean.lerp_(mean.to(self.running_mean.dtype), momentum)
                self.running_var.lerp_(unbiased.to(self.running_var.dtype), momentum)
        return out


def _on_host(packed: torch.Tensor, collective: str) -> torch.Tensor:
    """``packed`` (on the device; float32, or float64 for a float64 model) gathered or summed
    over all ranks, back on the device. The copy to the host is made here, on the thread that
    runs forward or backward: the bucket thread must not issue device work (Metal forbids two
    threads' at once)."""
    host = packed.cpu()
    with rt.on_behalf_of("SyncBatchNorm"):
        if collective == "gather":
            host = rt.all_gather(host, name="batch statistics")
        else:
            rt.all_reduce(host, "sum", name="batch statistics' gradient")
    return host.to(packed.device)


class _SyncBatchNormFunction(torch.autograd.Function):
    """The statistics' arithmetic around two collectives. The normalizing passes over the
    activations are ``F.batch_norm`` in eval mode on the global statistics (one fused pass
    each, on every device), where four elementwise ops each took one. Saves the input, which
    the layer before keeps anyway, not a normalized copy of it. Only documented torch ops:
    aten's BatchNorm backward takes outside statistics differently on CUDA (it asserts
    training-mode ones) and MPS (whose weight and bias gradients are left unset unless the
    input's gradient is asked for too)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
        channels = x.shape[1]
        dims = [0, *range(2, x.dim())]
        shape = [1, channels] + [1] * (x.dim() - 2)
        # float32 for half precision, as torch's BatchNorm; a float64 model keeps its precision
        xf = x.to(torch.float64 if x.dtype == torch.float64 else torch.float32)
        count = x.numel() // channels
        mean = xf.mean(dims) if count else xf.new_zeros(channels)
        m2 = (xf - mean.view(shape)).square().sum(dims)  # measured: 4x faster than var_mean on a CPU
        stats = _on_host(torch.cat([mean.new_tensor([count]), mean, m2]), "gather")  # [world, 2C+1]
        counts, means, m2s = stats[:, :1], stats[:, 1:channels + 1], stats[:, channels + 1:]
        total = float(counts.sum())
        if total == 0:
            raise ValueError("SyncBatchNorm: every rank's batch is empty")
        global_mean = (counts * means).sum(0) / total
        var = (m2s + counts * (means - global_mean).square()).sum(0) / total  # biased, for normalizing
        wf = None if weight is None else weight.to(xf.dtype)
        bf = None if bias is None else bias.to(xf.dtype)
        out = F.batch_norm(xf, global_mean, var, wf, bf, False, 0.0, eps)
        ctx.save_for_backward(xf, global_mean, var, wf)
        ctx.total, ctx.eps, ctx.dtype = total, eps, None if weight is None else weight.dtype
        ctx.mark_non_differentiable(global_mean, var)
        return out.to(x.dtype), global_mean, var, total

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor, *_: Any) -> tuple[torch.Tensor | None, ...]:
        xf, mean, var, wf = ctx.saved_tensors
        dyf = dy.to(xf.dtype)
        dims = [0, *range(2, dy.dim())]
        xhat = F.batch_norm(xf, mean, var, None, None, False, 0.0, ctx.eps)  # (x - mean) * invstd
        sum_dy = dyf.sum(dims)
        sum_dy_xhat = xhat.mul_(dyf).sum(dims)
        del xhat
        # a None weight or bias needs no gradient; with one, BatchNorm has both, of one dtype
        grad_weight = sum_dy_xhat.to(ctx.dtype) if ctx.needs_input_grad[1] else None
        grad_bias = sum_dy.to(ctx.dtype) if ctx.needs_input_grad[2] else None
        grad_x = None
        if ctx.needs_input_grad[0]:
            sums = _on_host(torch.cat([sum_dy, sum_dy_xhat]), "sum")  # over the whole global batch
            channels = mean.numel()
            mean_dy, mean_dy_xhat = sums[:channels] / ctx.total, sums[channels:] / ctx.total
            scale = torch.rsqrt(var + ctx.eps)
            if wf is not None:
                scale = scale * wf
            # scale * (dy - mean_dy - xhat * mean_dy_xhat): the terms in x are eval-mode
            # BatchNorm with weight -scale * mean_dy_xhat and bias -scale * mean_dy, one fused
            # pass; dy * scale is then added in place
            grad_x = F.batch_norm(xf, mean, var, -scale * mean_dy_xhat, -scale * mean_dy, False, 0.0, ctx.eps)
            grad_x = grad_x.addcmul_(dyf, scale.view([1, channels] + [1] * (dy.dim() - 2))).to(dy.dtype)
        return grad_x, grad_weight, grad_bias, None
