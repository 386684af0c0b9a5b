"""``macfleet.DataParallel``: gradients averaged over all ranks while backward is still running.

At construction, rank 0's parameters and buffers are broadcast so every rank starts equal,
and the parameters are laid out in buckets (reverse registration order, which is roughly the
order backward produces their gradients; the first bucket small so communication starts
early, the rest up to ``bucket_cap_mb``; one module's parameters never split across two
buckets, see ``bucket_layout``). Each bucket is one flat tensor on the device and the
parameters' ``.grad`` are views into it, so a bucket leaves the device in one copy
(``zero_grad(set_to_none=True)`` drops the views; a small bucket, or one of small parameters,
lends them again at the start of the next backward, ``Bucket.lend_views``, and any other takes
each gradient in by a copy).

During backward, a hook on each parameter notes its gradient. When a bucket is complete the
hook records a device event and hands the bucket to the process's communication thread, which
starts its copy to a reused host buffer once the event has passed (waiting on the host, never
on the GPU: a late peer must not stall Metal's command queue), and backward goes on. Buckets
are released for averaging strictly in index order (the same on every rank, whatever order
they became ready in); the thread averages released buckets over the ring in release order and
copies them back. On MPS both copies stay on the thread that runs backward instead (the copy to
the host when the bucket is complete, the copies back when backward ends): Metal crashes when
two threads issue MPS work at once (``Device.copies_from_training_thread``). One thread serves
every DataParallel of the process, so two wrapped models
in one backward (a GAN's generator step) exchange in the same order on every rank. A callback
at the end of backward waits for the last bucket, so when ``loss.backward()`` returns every
rank holds the same averaged gradients and ``optimizer.step()`` needs no change.

The first backward after the buckets are laid out averages them at its end instead: it counts
how many times each gradient comes (a layer run in several reentrant checkpoints gets one from
each), and from then on a bucket is complete once each of its gradients has come that often
(``_count``).

A script may freeze, unfreeze or add parameters after wrapping (fine-tuning): the first
training forward after such a change lays the buckets out again (``_lay_out``).
"""

from __future__ import annotations

import functools
import time
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence, TypeVar

import torch
from torch import nn

from macfleet import runtime as rt
from macfleet import batches, loaders, timeline
from macfleet.arguments import WIRE_DTYPES
from macfleet.backends import Device, HostEvent
from macfleet.buckets import Bucket, BucketThread, average, bucket_layout, exchange, stage
from macfleet.collectives import WORK_DTYPE, Collectives
from macfleet.ddp_options import DeviceId, bucket_bytes, input_device, refuse_ddp_only, to_device
from macfleet.errors import ConfigError, ProtocolError
from macfleet.history import warn_at_script
from macfleet.join import Join
from macfleet.same_model import check_same_model


class DataParallel(nn.Module):
    """Wrap ``module`` so that ``backward()`` leaves every rank with the average gradient.

    ``bucket_cap_mb``/``first_bucket_mb``: bucket sizes (DDP's defaults). ``broadcast_buffers``:
    send rank 0's buffers (e.g. BatchNorm statistics) to all ranks at every training forward
    (in training mode, with autograd on: a forward under ``torch.no_grad()`` needs no other rank);
    False leaves every rank's buffers its own, at the start too, as DDP's does.
    ``find_unused_parameters``: parameters that get no gradient in a step count as zero
    instead of being an error. ``compression``: ``"fp16"``/``"bf16"`` halve the bytes on the
    network (reduction stays float32 on the host; ranks of one host exchange float32 through
    shared memory, where there is no network to save). ``shares``: each rank's part of every
    step's samples, one number per rank, the same list on every rank (a fast Mac's batch can be
    larger than a slow one's, see ``DistributedSampler``); the gradients are then averaged
    weighted by them, which is the gradient of the whole step's mean loss. Default: equal.

    DDP's own options are taken as well, so that a DDP script's wrapping line ports unchanged
    (``macfleet.ddp_options``): ``device_ids=[local_rank]`` makes the forward move its inputs to
    the model's device, as DDP's does; ``forward_sync_buffers`` (torch 2.13's name) is
    ``broadcast_buffers`` at each forward, but its False, as there, still sends rank 0's buffers
    at the start; None means what it means there (True; for ``bucket_cap_mb``, 25);
    ``output_device``, ``dim``, ``init_sync``, ``check_reduction``, ``gradient_as_bucket_view``,
    ``static_graph``, ``batched_grad_copy`` and ``lazy_bucket_allocation`` change nothing.
    DDP's others (``mixed_precision``, ``device_mesh``, ...) given other than DDP's default are a
    ``ConfigError`` that says what to do instead.
    """

    def __init__(self, module: nn.Module, bucket_cap_mb: float | None = 25.0, first_bucket_mb: float = 1.0,
                 broadcast_buffers: bool | None = True, find_unused_parameters: bool = False,
                 compression: str = "none", shares: Sequence[float] | None = None, *,
                 device_ids: Sequence[DeviceId] | None = None, output_device: DeviceId | None = None, dim: int = 0,
                 process_group: object = None, init_sync: bool = True, check_reduction: bool = False,
                 gradient_as_bucket_view: bool = False, static_graph: bool = False,
                 forward_sync_buffers: bool | None = None, **ddp_only: Any) -> None:
        super().__init__()
        if not isinstance(module, nn.Module):  # an AttributeError from deep inside, before
            raise ConfigError(f"DataParallel wraps a torch.nn.Module (the model), not {type(module).__name__}")
        refuse_ddp_only(ddp_only)  # DDP's other options: what to do instead
        # As DDP's: rank 0's buffers go to every rank at the start unless broadcast_buffers=False
        # says not (a script that keeps rank-local buffers); forward_sync_buffers (torch 2.13's
        # name for the syncs at each forward) leaves the start's sync on.
        self._start_sync_buffers = forward_sync_buffers is not None or broadcast_buffers is not False
        if forward_sync_buffers is not None:
            broadcast_buffers = forward_sync_buffers
        broadcast_buffers = True if broadcast_buffers is None else broadcast_buffers
        bucket_cap_mb = 25.0 if bucket_cap_mb is None else bucket_cap_mb  # DDP's None: its default, 25 MiB
        if compression not in WIRE_DTYPES:
            raise ConfigError(f"compression {compression!r}: choose one of {', '.join(WIRE_DTYPES)}")
        _check_not_wrapped(module)
        _check_materialized(module)
        self.module = module
        self.device_ids, self.output_device = device_ids, output_device  # read by some DDP scripts
        self._input_device = input_device(module, device_ids, process_group)
        leave_out_of_graphs()
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.compression = compression
        self._shares = None if shares is None else list(shares)  # as given: each rank's weight (``_attach``)
        self._caps = bucket_bytes("first_bucket_mb", first_bucket_mb), bucket_bytes("bucket_cap_mb", bucket_cap_mb)
        self._forget_place()
        self._attach(rt.runtime())
        _left_on_the_cpu(module, self.runtime)
        if self.runtime.world_size == 1:
            # refused in a job of one too, so a script does not work on one Mac and fail on two
            _check_trainable([(n, p) for n, p in module.named_parameters() if p.requires_grad], self.runtime.device)
            return
        with torch.no_grad(), rt.on_behalf_of("DataParallel (start)"):
            _agree_on_options(shares, self.runtime.world_size, {
                "bucket_cap_mb": bucket_cap_mb, "first_bucket_mb": first_bucket_mb,
                "broadcast_buffers": broadcast_buffers, "broadcast_buffers (at the start)": self._start_sync_buffers,
                "find_unused_parameters": find_unused_parameters, "compression": compression})
        self._lay_out("DataParallel (start)")

    def _forget_place(self) -> None:
        """No place in a job yet, and no buckets: at construction, and in what a copy or a pickle
        keeps (``__getstate__``)."""
        self._runtime: rt.Runtime | None = None  # the job's, from the first use (``runtime``)
        self.require_backward_grad_sync = True  # a copy made inside no_sync() is not inside the block
        self.scale = 1.0  # this rank's gradients' weight in the averages (``_attach``)
        self._step = _Step()
        self._join: Join | None = None  # the join() block this DataParallel trains in, if any
        self.buckets: list[Bucket] = []
        self._where: dict[int, tuple[Bucket, int]] = {}
        self._hooks: list[Any] = []  # handles of the hooks on the bucketed parameters
        self._replaced_by: str | None = None  # set when a newer DataParallel took the parameters over
        # The module as the buckets were laid out for it: every parameter, whether it required a
        # gradient, its buffers, and the count of registrations then (see _Registrations).
        self._known_params: list[tuple[str, nn.Parameter]] = []
        self._trainable: list[bool] = []
        self._known_buffers: list[torch.Tensor] = []
        self._seen = -1  # never laid out
        self._comm: BucketThread | None = None

    @property
    def last_wait_s(self) -> float:
        """How long the end of the last backward waited for communication (and slower ranks)."""
        return self._step.wait_s

    # -- copies -------------------------------------------------------------------------------
    @property
    def runtime(self) -> rt.Runtime:
        """The job this DataParallel averages in: the process's, from construction, or for a copy
        (``copy.deepcopy``, ``torch.load``) from its first training forward."""
        return self._runtime if self._runtime is not None else self._attach(rt.runtime())

    def _attach(self, runtime: rt.Runtime) -> rt.Runtime:
        self._weights = _share_weights(self._shares, runtime.world_size)  # each rank's
        self._runtime = runtime
        self.scale = self._weights[runtime.rank] * len(self._weights) / sum(self._weights)
        if runtime.world_size > 1:
            assert runtime.collectives is not None  # several ranks: there is a ring
            self._collectives: Collectives = runtime.collectives  # for the hooks below
            self._collectives.step_share = self.scale / runtime.world_size  # its part of each step
        return runtime

    def __getstate__(self) -> dict[str, Any]:
        """What a copy (``copy.deepcopy``, ``AveragedModel(model)``) or a pickle
        (``torch.save(model)``) keeps: the module and the options, not this process's place in
        the job (its connections and threads) nor the buckets. A copy lays its own out at its
        first training forward, as after a fine-tuning change, which broadcasts rank 0's
        parameters: every rank trains it, or none does. Until then, and wherever it is loaded,
        a forward in eval mode or without autograd is the module's own, and needs no job."""
        state = self.__dict__.copy()
        state.pop("_collectives", None)
        placeless = _Placeless()
        DataParallel._forget_place(placeless)  # type: ignore[arg-type]  # assigns plain attributes only
        state.update(vars(placeless))
        return state

    # -- layout -------------------------------------------------------------------------------
    def _lay_out(self, caller: str) -> None:
        """Lay the buckets out for the module's parameters as they are now: those that exist and
        require a gradient. At construction, and again at the first training forward after a
        script froze or unfroze parameters, or gave the module new ones (a fine-tuning job's new
        head): a parameter that trains outside the buckets would be trained apart on every rank.
        As at construction, rank 0's parameters (and buffers, unless ``broadcast_buffers=False``)
        go to every rank (a new layer is initialized differently on each), and every rank must
        make the same change."""
        _Registrations.install()
        self._seen = _Registrations.count
        self._known_params = list(self.module.named_parameters())
        self._trainable = [p.requires_grad for _, p in self._known_params]
        self._known_buffers = list(self.module.buffers())
        named = [(n, p) for n, p in self._known_params if p.requires_grad]
        _check_trainable(named, self.runtime.device)
        _share_batch_statistics(self.module)
        self._unhook()
        for bucket in self.buckets:  # gradients leave the old buckets' memory, as they are
            for k, p in enumerate(bucket.params):
                if p.grad is not None and bucket.holds(k, p.grad):
                    p.grad = p.grad.clone()
        with torch.no_grad(), rt.on_behalf_of(caller):
            check_same_model(self.module)
            _broadcast_flat([p for _, p in self._known_params], "parameters")
            if self._start_sync_buffers:
                self._broadcast_buffers(0)
            self.buckets, self._where = [], {}
            self._build_buckets(bucket_layout(named, *self._caps))
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad_ready) for _, p in named]
        _take_over(self, [p for _, p in named])

    def _stale(self) -> bool:
        """Whether the module's parameters changed since the buckets were laid out. Walking the
        module tree costs 0.5 ms a step on a ResNet-50; torch's registration hooks say when a
        walk is due, and whether each parameter trains is read from the list kept."""
        if self._seen < 0:  # never laid out: a copy's first training forward
            return True
        if self._seen != _Registrations.count:
            self._seen = _Registrations.count
            params = list(self.module.named_parameters())
            if [(n, id(p)) for n, p in params] != [(n, id(p)) for n, p in self._known_params]:
                return True
            self._known_buffers = list(self.module.buffers())  # a buffer may have been replaced
        trainable = [p.requires_grad for _, p in self._known_params]
        # Frozen whole (a GAN's discriminator while the generator trains through it): no gradient
        # comes for the buckets to average, so they stand as they are for when it trains again.
        # Laid out anew, as for a fine-tuning job's change, each such step broadcast the
        # parameters and made new buckets twice, at the freeze and at the thaw.
        return trainable != self._trainable and any(trainable)

    def _retire(self, successor: DataParallel) -> None:
        """A newer DataParallel wraps these parameters (a script wrapped the model again after
        unfreezing layers, as DDP asks): only one may average their gradients."""
        self._unhook()
        self._replaced_by = type(successor.module).__name__

    def _unhook(self) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks = []

    def _build_buckets(self, groups: list[list[tuple[str, nn.Parameter]]]) -> None:
        for index, group in enumerate(groups):
            offsets, total = [], 0
            for _, p in group:
                offsets.append(total)
                total += p.numel()
            first = group[0][1]
            # Host memory that this host's ranks share where it is reduced as it is (float32,
            # float64): all_reduce then neither copies it in nor out (macfleet.shm).
            shared = rt.host_tensor(total, first.dtype) if first.dtype not in WORK_DTYPE else None
            if first.device.type == "cpu":
                flat = shared if shared is not None else torch.zeros(total, dtype=first.dtype, device="cpu")
                host = None
            else:
                flat = torch.zeros(total, dtype=first.dtype, device=first.device)
                host = self.runtime.device.host_buffer(total, first.dtype, shared)
            bucket = Bucket(index, [p for _, p in group], [n for n, _ in group], offsets, flat, host, self.scale,
                            strided=self.runtime.device.strided_grad_views)
            for k, (_, p) in enumerate(group):
                self._where[id(p)] = (bucket, k)
                with torch.no_grad():
                    view = bucket.view(k)
                    if p.grad is not None:  # what was accumulated stays
                        view.copy_(p.grad.to_dense() if p.grad.layout != torch.strided else p.grad)
                    p.grad = view  # gradients accumulate straight into the bucket
            self.buckets.append(bucket)

    # -- training-time behaviour --------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self._input_device is not None:  # device_ids given: the inputs go to the model, as with DDP
            args, kwargs = to_device(args, self._input_device), to_device(kwargs, self._input_device)
        # A forward without autograd has no backward to average: it needs no other rank, so
        # rank 0 may run one alone (validation under torch.no_grad() with the model still in
        # training mode; DDP gates its reducer on the same). Its buffers come from rank 0 at the
        # next training forward, the one that counts.
        if not (self.training and torch.is_grad_enabled()):
            return self.module(*args, **kwargs)
        if _is_compiling is not None and _is_compiling():  # see ``eagerly``
            torch.compiler.disable(self._before_training_forward)(args, kwargs)
            return torch.compiler.disable(self._watch_outputs)(self.module(*args, **kwargs))
        self._before_training_forward(args, kwargs)
        return self._watch_outputs(self.module(*args, **kwargs))

    def _watch_outputs(self, output: Any) -> Any:
        """Hook the outputs, so that the end-of-backward callback is queued on the backward that
        runs from the loss. Queued from the first parameter's hook alone, it may land on a nested
        backward: a reentrant checkpoint (``torch.utils.checkpoint(use_reentrant=True)``, Hugging
        Face's ``gradient_checkpointing_enable()``) runs its segment's backward as a backward of
        its own, which ends before the layers under the segment have their gradients, and the
        step would end there without them. (DDP's ``_DDPSink`` on its outputs does the same.)"""
        if self._hooks:
            for t in batches.tensors_in(output):
                if t.requires_grad:
                    t.register_hook(self._on_output_grad)
        if self._step.began:
            timeline.RECORDER.span("forward", self._step.began, time.time())
        return output

    def _on_output_grad(self, grad: torch.Tensor) -> None:
        self._step.forwards = 0
        if self.require_backward_grad_sync:
            self._queue_finish()

    def _queue_finish(self) -> None:
        """Queue ``_finish_backward`` on the backward under way, once. A backward that reaches
        the outputs but no parameter (``torch.autograd.grad`` of the output by the input, for a
        gradient penalty) finds nothing to finish."""
        if not self._step.finish_queued:
            self._step.finish_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_ended)
            grad_bytes = self.runtime.device.lend_grad_bytes
            self._step.lent = [bucket for bucket in self.buckets if bucket.lend_views(grad_bytes)]

    def _backward_ended(self) -> None:
        step = self._step
        step.finish_queued = False
        if step.queued:
            self._finish_backward()
        else:  # it reached no parameter (``torch.autograd.grad`` of the outputs): no gradient changes
            for bucket in step.lent:
                bucket.take_back_views()
        step.lent = []

    def _before_training_forward(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        step = self._step
        if step.queued:
            # Autograd drops the end-of-backward callback when backward raises: this rank released
            # some buckets and not others, and the other ranks wait for the rest. Going on would
            # step on gradients that were never averaged (DDP refuses too, at its next backward).
            raise ProtocolError(
                "the previous backward raised before DataParallel had averaged its gradients, so this "
                "rank is out of step with the others and cannot train on; let that exception end the "
                "process (macfleet launch --max-restarts N restarts the job from its last checkpoint)")
        step.finish_queued = False  # autograd dropped it too, if a backward that averaged nothing raised
        if self._replaced_by is not None:
            raise ConfigError(
                f"this DataParallel's parameters were wrapped again by a newer DataParallel (of "
                f"{self._replaced_by}), which now averages their gradients: train through the newer one")
        step.forwards += 1
        step.began = time.time() if timeline.RECORDER.on else 0.0
        runtime = self.runtime
        changed = runtime.world_size > 1 and self._stale()
        # inside join(): which ranks train in this step, and which of them the buffers come from
        agreed = None if self._join is None else self._join.agree(self.require_backward_grad_sync, changed)
        source = 0 if agreed is None else agreed.source
        if changed:
            self._lay_out("DataParallel (parameters changed)")
        self._check_placement()
        if self.broadcast_buffers and self._known_buffers and runtime.world_size > 1:
            with torch.no_grad(), rt.on_behalf_of("DataParallel (buffers)"):
                self._broadcast_buffers(source)
        if runtime.world_size > 1:
            if runtime.rank == 0:
                loaders.CHECK(runtime.world_size)  # a DataLoader that every rank reads whole
            batches.NOTES(args, kwargs, loaders.CHECK.warned)  # ranks that get the same batches
        rt.note_sources_again()  # the script's modules imported after init (its model's, by now)

    def _broadcast_buffers(self, source: int) -> None:
        """Rank ``source``'s buffers on every rank, written past autograd's version counters, as
        DDP's broadcast writes them: a second forward before backward (a siamese or contrastive
        loss on two views) would otherwise make the first one's backward refuse every buffer it
        saved (a mask it multiplied by; the CPU's BatchNorm saves its running statistics) as
        "modified by an inplace operation". What changes in them is rank 0's running statistics,
        which no training backward reads."""
        _broadcast_flat([b.data for b in self._known_buffers], "buffers", source)

    def _check_placement(self) -> None:
        """The buckets were laid out for the parameters' device and dtype at construction; a
        model moved or cast after wrapping (``DataParallel(net).to("mps")``) would otherwise fail
        inside backward with an error about gradient dtypes, or train on stale views. A model
        converted otherwise (to channels_last) keeps its buckets, its gradients' views mended."""
        converted = False
        for bucket in self.buckets:
            for k in bucket.moved():
                converted = True
                name, p = bucket.names[k], bucket.params[k]
                if p.device != bucket.flat.device or p.dtype != bucket.flat.dtype:
                    raise ConfigError(
                        f"parameter {name!r} is {str(p.dtype).replace('torch.', '')} on {p.device}, but "
                        f"DataParallel laid out its gradients for {str(bucket.flat.dtype).replace('torch.', '')} "
                        f"on {bucket.flat.device} when it was built: move or cast the model before wrapping "
                        f"it, as in DataParallel(net.to(device))")
                bucket.mend_view(k)
        if converted:  # the conversion made new 4-D buffers too, past the registration hooks ``_stale`` reads
            self._known_buffers = list(self.module.buffers())

    def join(self, *, optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None = None,
             divide_by_initial_world_size: bool = True, enable: bool = True,
             throw_on_early_termination: bool = False) -> Join:
        """A block for the training loop in which ranks may have different numbers of batches
        (torch DDP's ``join()``, see ``macfleet.join``): a rank that runs out stays in the block's
        exit and takes part in the others' steps with zero gradients. Gradients are divided by the
        whole job, or by the ranks still training with ``divide_by_initial_world_size=False``.
        When all have left their loops, every rank gets the model of a rank that trained to the
        end, and ``optimizer``'s state (one or a list) too. ``throw_on_early_termination=True``
        raises ``macfleet.UnevenInputs`` on every rank at the step the first rank runs out."""
        return Join(self, optimizer, divide_by_initial_world_size, enable, throw_on_early_termination)

    def _ahead_of_buckets(self, fn: Callable[[], Any]) -> Callable[[], None]:
        """Run the collective ``fn`` on the bucket thread, before the buckets released after it,
        without waiting; the function returned waits for it (join()'s round in forward)."""
        comm = BucketThread.of(self.runtime)
        call = comm.submit(fn)

        def settle() -> None:
            self._collectives.ahead = None
            comm.wait([call])

        self._collectives.ahead = settle  # a collective of the script's, on this thread, comes after it
        return settle

    def _weigh(self, factor: float) -> None:
        """This rank's gradients count ``factor`` times their share in the coming averages (join())."""
        for bucket in self.buckets:
            bucket.scale = self.scale * factor

    def _shadow_step(self, source: int, syncing: bool) -> None:
        """The collectives of a training step, made with zeros by a rank out of batches (join())."""
        with torch.no_grad():
            if self.broadcast_buffers:
                with rt.on_behalf_of("DataParallel (buffers)"):
                    self._broadcast_buffers(source)
            if not syncing:
                return
            # the host buffers are zeroed: their last copies back to the device must be over
            self.runtime.device.record_event().synchronize()  # our own work only, never a peer's
            for bucket in self.buckets:  # in index order, as the training ranks release them
                exchange(bucket, bucket.staged().zero_(), self.compression)

    def _broadcast_state(self, source: int) -> None:
        """Rank ``source``'s parameters, and its buffers where they are shared, on every rank."""
        _broadcast_flat([p for _, p in self._known_params], "parameters", source)
        if self.broadcast_buffers:
            self._broadcast_buffers(source)

    def register_comm_hook(self, state: object, hook: Callable[..., Any]) -> None:
        """DDP's communication hooks have no place here: say what does their usual job."""
        raise ConfigError(
            "DataParallel has no communication hooks; for fp16_compress_hook or bf16_compress_hook pass "
            "compression='fp16' or 'bf16' to DataParallel (the same on every rank)")

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally; the first backward after the block averages them all."""
        previous, self.require_backward_grad_sync = self.require_backward_grad_sync, False
        try:
            yield
        finally:
            self.require_backward_grad_sync = previous

    def _on_grad_ready(self, p: torch.Tensor) -> None:
        step = self._step
        step.forwards = 0  # a backward is under way (the outputs' hook says so too, where it finds them)
        if not self.require_backward_grad_sync:
            return
        if not step.queued:  # first gradient of this backward: arm the step
            step.queued = True
            step.began = time.time() if timeline.RECORDER.on else 0.0
            step.released = 0
            for bucket in self.buckets:
                bucket.pending, bucket.done = {id(q) for q in bucket.params}, False
                bucket.counts = {} if bucket.repeats is None or bucket.repeats else None
            if self._comm is None and len(self.buckets) > 1:
                self._comm = BucketThread.of(self.runtime)
            self._queue_finish()
        bucket, k = self._where[id(p)]
        if p.grad is not bucket.views[k]:  # else it is its view still, or again (``Bucket.lend_views``)
            if p.grad is None:  # autograd had just given it one: a hook that ran before ours took it
                raise self._taken(bucket, k, "before")
            self._adopt(bucket, k)
        if bucket.counts is not None and self._count(bucket, p):
            return
        pending, key = bucket.pending, id(p)
        if key in pending:
            pending.discard(key)
            if not pending and self._comm is not None:
                self._complete(bucket, self._comm)
        elif not pending and self._comm is not None:
            self._came_late(bucket, k)

    def _count(self, bucket: Bucket, p: torch.Tensor) -> bool:
        """Count a gradient of a bucket whose gradients may come more than once in a backward;
        whether more of this parameter's are to come. A parameter's gradient comes once per
        backward that reaches it, and a reentrant checkpoint (``use_reentrant=True``) runs a
        backward of its own: a layer run in two of them (weights shared across depth, as
        ALBERT's, with gradient checkpointing) gets its gradient twice in the step's backward,
        the second time added to the first. Averaged at the first, the bucket would go out
        without the second, which autograd then adds into it while it is exchanged. So the
        first backward only counts, and its buckets are averaged at its end (DDP's
        ``static_graph`` learns the same in its first step); from then on a bucket is complete
        when each of its gradients has come as many times as then."""
        counts = bucket.counts
        assert counts is not None
        came = counts[id(p)] = counts.get(id(p), 0) + 1
        if bucket.repeats is None:  # the first backward: averaged at its end (``_settle_counts``)
            return True
        return came < bucket.repeats.get(id(p), 1)

    def _taken(self, bucket: Bucket, k: int, when: str) -> ConfigError:
        """A gradient hook of the script's, registered ``when`` DataParallel's, took the gradient
        away in backward: an optimizer step fused into backward (torch's tutorial on it) steps
        with this rank's gradient alone, before any average, and the ranks' models part."""
        return ConfigError(
            f"the gradient of {bucket.names[k]!r} was taken away in backward by a hook that ran {when} "
            f"DataParallel's (register_post_accumulate_grad_hook, as an optimizer step fused into backward "
            f"makes): that step uses this rank's gradient alone, and the ranks' models would drift apart. "
            f"Step the optimizer after loss.backward(), which returns with every gradient averaged")

    def _came_late(self, bucket: Bucket, k: int) -> None:
        """A gradient came after its bucket had gone to be averaged: autograd added it into the
        bucket while the bucket is exchanged, so this step's average is lost."""
        key = id(bucket.params[k])
        came = "more than once" if bucket.counts is None else f"{bucket.counts[key]} times"
        learned = (bucket.repeats or {}).get(key, 1)
        raise ConfigError(
            f"the gradient of {bucket.names[k]!r} came {came} in this backward, and "
            f"{'once' if learned == 1 else f'{learned} times'} in DataParallel's first: the last came after its "
            f"bucket had gone to be averaged, and this step's gradients are lost. A layer run in several reentrant "
            f"checkpoints gets a gradient from each, so it must run in as many in every step; with "
            f"torch.utils.checkpoint(..., use_reentrant=False) it gets one gradient whatever the count")

    def _complete(self, bucket: Bucket, comm: BucketThread) -> None:
        """Start the complete bucket's copy to the host, and release every bucket whose turn
        has come. This runs on the thread that runs backward, which on every rank sees the
        same graph in the same order: releases, across models too, agree between ranks."""
        step = self._step
        start = step.released
        while step.released < len(self.buckets) and not self.buckets[step.released].pending:
            step.released += 1
        self._hand_over(comm, bucket, self.buckets[start:step.released])

    def _hand_over(self, comm: BucketThread, bucket: Bucket, release: list[Bucket]) -> None:
        """Give ``bucket`` to the communication thread, which copies it to the host once its
        gradients are ready; where the device takes copies from this thread only, copy it here."""
        device = self.runtime.device
        ready = device.record_event()
        if timeline.RECORDER.on:
            timeline.RECORDER.instant(f"gradient bucket {bucket.index} ready", {"bytes": bucket.flat.numel() *
                                                                                  bucket.flat.element_size()})
        comm.hand_over(bucket, self._copy_here(bucket, ready) if device.copies_from_training_thread else ready,
                       release, self.compression)

    def _copy_here(self, bucket: Bucket, ready: HostEvent) -> HostEvent:
        """Start the bucket's copy to its host buffer from this thread. Where the device makes
        the copy at once (MPS: backward waits for it), the copy goes on the timeline here; where
        it is only queued (CUDA), ``average`` puts the wait for it there."""
        device = self.runtime.device
        made_here = timeline.RECORDER.on and bucket.host is not None and device.copies_from_training_thread
        began = time.time() if made_here else 0.0
        copied = stage(bucket, ready, device)
        if began:
            timeline.RECORDER.span(f"gradient bucket {bucket.index} to host", began, time.time())
        return copied

    def _adopt(self, bucket: Bucket, k: int) -> None:
        """Make the parameter's gradient the bucket's view again (zero_grad(set_to_none=True)
        or an optimizer may have replaced it), keeping what was accumulated. A sparse gradient
        (``nn.Embedding(sparse=True)``) is averaged dense, as Horovod's ``sparse_as_dense``: the
        bucket holds every row anyway, and a sum of sparse rows from N ranks is dense enough.
        It goes back to the script sparse (``_restore_sparse``). A gradient with a graph of its
        own (``backward(create_graph=True)``) is an error: DDP averages its values and warns
        that the higher-order terms stay each rank's, so that the ranks' models part."""
        p, view = bucket.params[k], bucket.view(k)
        if p.grad is None:
            view.zero_()
        elif p.grad.requires_grad:
            raise ConfigError(
                f"backward(create_graph=True) gave {bucket.names[k]!r} a gradient that carries its graph: "
                f"DataParallel averages the ranks' gradients as values, so a second derivative taken through "
                f"them (a Hessian-vector product, a penalty on them) would be this rank's alone, and the ranks "
                f"would drift apart. For a penalty on the gradients, take them with torch.autograd.grad(loss, "
                f"params, create_graph=True) and call backward() on the total: DataParallel averages it whole")
        elif p.grad.layout != torch.strided:
            view.copy_(p.grad.to_dense())
            bucket.sparse[k] = p.grad.sparse_dim()
        elif not bucket.holds(k, p.grad):
            view.copy_(p.grad)
        else:
            return
        p.grad = view

    def _finish_backward(self) -> None:
        """End of backward: launch buckets whose parameters got no gradient, then wait for all.

        A model whose gradients fit in one bucket has nothing to overlap: its bucket is averaged
        here, on the thread that ran backward, which saves two thread hand-offs per step
        (measured 150-250 us on the device machine, as much as a small model's whole exchange)."""
        step, comm, device = self._step, self._comm, self.runtime.device
        step.queued = False
        for bucket in self.buckets:  # the first backward: before any bucket of it goes out
            if bucket.counts is not None and bucket.repeats is None:
                self._check_kept(bucket, bucket.counts)
        for bucket in self.buckets:
            if bucket.counts is not None:
                self._settle_counts(bucket, comm)
        unused = [(b, k) for b in self.buckets if b.pending for k, p in enumerate(b.params) if id(p) in b.pending]
        if unused and not self.find_unused_parameters:
            names = ", ".join(b.names[k] for b, k in unused[:5]) + (" ..." if len(unused) > 5 else "")
            if comm is not None:  # what was released finishes first: nothing of this step outlives it
                comm.wait(self.buckets[:step.released])
            raise ConfigError(
                f"parameters got no gradient in this step: {names}. Every rank must produce a gradient for "
                f"every parameter (pass find_unused_parameters=True to DataParallel to count them as zero)")
        for bucket, k in unused:
            self._adopt(bucket, k)
            bucket.pending.discard(id(bucket.params[k]))
            if not bucket.pending and comm is not None:
                self._complete(bucket, comm)
        started = time.perf_counter()
        began, step.began = step.began, 0.0
        if began:  # on the timeline, with this step's bookkeeping; the wait starts here
            now = time.time()
            timeline.RECORDER.span("backward (first gradient to last)", began, now)
            began = now
        self._note_work(started)
        collectives = self._collectives
        since = collectives.start_waiting()  # what the training loop loses to the exchange and slower ranks
        try:
            if comm is None:  # one bucket: averaged here, unless another model's buckets are in flight
                bucket, shared = self.buckets[0], BucketThread.existing(self.runtime)
                if shared is not None and not shared.idle():  # after what another model released, in order
                    self._hand_over(shared, bucket, [bucket])
                    comm = shared
                else:
                    average(bucket, self._copy_here(bucket, device.record_event()), device, self.compression)
            if comm is not None:
                # where the bucket thread leaves the copies back to this thread (MPS), each bucket goes
                # back as soon as it is averaged, while the thread averages the next
                for b in self.buckets:  # in the order they are averaged
                    comm.wait([b])
                    if device.copies_from_training_thread and b.host is not None:
                        device.from_host(b.host, b.flat)
        finally:
            collectives.stop_waiting(since)
        device.staged()  # later device work (optimizer.step) sees the averaged gradients
        ended = time.perf_counter()
        if began:
            timeline.RECORDER.span("waiting for gradients", began, time.time())
        step.wait_s = ended - started
        step.ended = (ended, collectives.waited_s)
        self._restore_sparse()

    def _check_kept(self, bucket: Bucket, came: dict[int, int]) -> None:
        """At the end of the first backward: every gradient that came is still in its bucket,
        where ``_adopt`` put it; one that is not was replaced by a hook of the script's that ran
        after ours (``_taken``)."""
        for k, p in enumerate(bucket.params):
            if id(p) in came and (p.grad is None or not bucket.holds(k, p.grad)):
                raise self._taken(bucket, k, "after")

    def _settle_counts(self, bucket: Bucket, comm: BucketThread | None) -> None:
        """At the end of backward, a bucket whose gradients were counted (``_count``): the
        first backward says how many times each comes; and a gradient that came, though fewer
        times than that, came (a checkpointed layer run fewer times in this step)."""
        counts, bucket.counts = bucket.counts, None
        assert counts is not None
        if bucket.repeats is None:
            bucket.repeats = {key: came for key, came in counts.items() if came > 1}
        if bucket.pending and counts:
            bucket.pending.difference_update(counts)
            if not bucket.pending and comm is not None:
                self._complete(bucket, comm)

    def _note_work(self, now: float) -> None:
        """How long this rank worked since the last step's exchange ended: optimizer step, data,
        forward, backward, but not its waits for the others (the buffers' broadcast in forward
        waits for a slower Mac too). Its median says how fast this Mac trains, for the shares
        the launcher suggests."""
        if self._step.ended is not None:
            ended, waited = self._step.ended
            self._collectives.step_work_s.append((now - ended) - (self._collectives.waited_s - waited))

    def _restore_sparse(self) -> None:
        """Gradients that autograd made sparse are sparse again once averaged: an optimizer for
        them (``SparseAdam``) takes no other kind. Their rows are those any rank touched. A
        bucket whose step brought no sparse gradient, and none before, is marked dense: from
        now on it may lend its views (``Bucket.lend_views``)."""
        for bucket in self.buckets:
            if bucket.sparse:
                for k, sparse_dim in bucket.sparse.items():
                    bucket.params[k].grad = bucket.view(k).to_sparse(sparse_dim)
                bucket.sparse.clear()
                bucket.dense = False
            elif bucket.dense is None:
                bucket.dense = True


T = TypeVar("T")


# torch 2.3 and later (Dynamo folds this call while it traces); None before
_is_compiling: Callable[[], bool] | None = getattr(torch.compiler, "is_compiling", None)


def eagerly(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn``, left out of the graph where torch.compile traces the caller
    (``torch.compile(DataParallel(net))``, as DDP's users write it). DataParallel's bookkeeping
    is Python with side effects: traced, it printed Dynamo's warnings about builtins it cannot
    trace, and guarded the graph on counters that change. Not applied once at import: that
    imports torch._dynamo, 1.3 s of every rank's start, for the scripts that never compile.
    On torch 2.1 and 2.2 ``fn`` is left out already (``leave_out_of_graphs``)."""
    if _is_compiling is None:
        return fn
    return torch.compiler.disable(fn) if _is_compiling() else fn


@functools.cache  # once per process
def leave_out_of_graphs() -> None:
    """torch 2.1 and 2.2 cannot say whether Dynamo is tracing, so ``eagerly`` cannot ask, and
    the bookkeeping, traced, made ``torch.compile(DataParallel(net))`` compile again at every
    step (steps 15x slower on torch 2.1). There the methods that ``eagerly`` wraps are left out
    of every graph for good, when the first DataParallel is made: that imports torch._dynamo
    (0.3 s on torch 2.1), and each call of them costs a few microseconds more."""
    if _is_compiling is not None:
        return
    from macfleet.sync_batch_norm import SyncBatchNorm  # it imports this module

    for cls, name in ((DataParallel, "_before_training_forward"), (DataParallel, "_watch_outputs"),
                      (SyncBatchNorm, "_synced")):
        setattr(cls, name, torch.compiler.disable(getattr(cls, name)))


def _share_batch_statistics(module: nn.Module) -> None:
    """torch's SyncBatchNorm shares batch statistics through torch.distributed's process group,
    and where there is none it runs as a plain BatchNorm, silently: a DDP script converted with
    ``convert_sync_batchnorm`` would train with each rank's statistics alone. Its modules become
    macfleet's SyncBatchNorm (the same objects, parameters and buffers), which shares them over
    macfleet's ranks. A script with a process group of its own keeps torch's."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return
    from macfleet.sync_batch_norm import SyncBatchNorm  # imported here: it builds on eagerly above

    for m in module.modules():
        if type(m) is nn.SyncBatchNorm:
            m.__class__ = SyncBatchNorm


def _share_weights(shares: Sequence[float] | None, world: int) -> list[float]:
    """Each rank's weight in the average, for ``shares``."""
    if shares is None:
        return [1.0] * world
    weights = [float(s) for s in shares]
    if len(weights) != world or not all(0 < w < float("inf") for w in weights):
        raise ConfigError(f"shares must be {world} numbers above 0 (one per rank), not {list(shares)}")
    return weights


def _agree_on_options(shares: Sequence[float] | None, world: int, options: dict[str, float | bool | str]) -> None:
    """Every rank must pass DataParallel the same options. Shares weight the gradients: the
    average is wrong on all ranks if they differ. The bucket sizes lay the buckets out, and
    ``broadcast_buffers`` makes a collective at every forward (and, unless it is False, at the
    start: DDP's ``forward_sync_buffers=False`` keeps that one): ranks that differ met in
    collectives of different sizes or kinds ("rank 1 is in shared_tensor of 880 float32 ...
    while rank 0 is in shared_tensor of 528 float32"), an error that named no option. ``compression`` and
    ``find_unused_parameters`` change what crosses the network and when. One broadcast of rank
    0's, and a rank that differs names the option."""
    def number(value: float | bool | str) -> float:
        return float(list(WIRE_DTYPES).index(value)) if isinstance(value, str) else float(value)

    given = [1.0] * world if shares is None else [float(s) for s in shares]
    mine = torch.tensor(given + [number(v) for v in options.values()], dtype=torch.float64, device="cpu")
    rank0 = rt.broadcast(mine.clone(), 0, name="options")
    if not torch.equal(mine[:world], rank0[:world]):
        raise ConfigError(f"this rank's DataParallel shares {given} differ from rank 0's {rank0[:world].tolist()}: "
                          f"every rank must pass the same list")
    for (name, value), theirs in zip(options.items(), rank0[world:].tolist(), strict=True):
        if number(value) != theirs:
            theirs_as = list(WIRE_DTYPES)[int(theirs)] if isinstance(value, str) else type(value)(theirs)
            raise ConfigError(f"this rank's DataParallel {name}={value!r} differs from rank 0's {name}={theirs_as!r}: "
                              f"every rank must pass the same options")


def _left_on_the_cpu(module: nn.Module, runtime: rt.Runtime) -> None:
    """A model wrapped where it was built, on the CPU, by a rank that drives a GPU: it trains,
    on the CPU, several times slower than on the Mac's GPU, and nothing else would say so.
    Said by rank 0, at the script's line; ``--device cpu`` trains on the CPU on purpose."""
    trainable = [p for p in module.parameters() if p.requires_grad]
    if runtime.device.kind == "cpu" or runtime.rank != 0 or not trainable:
        return
    if all(p.device.type == "cpu" for p in trainable):
        warn_at_script(f"DataParallel wraps a model whose parameters are on the CPU, while this rank drives "
                       f"{runtime.device.torch_device}: it would train on the CPU. Move it first, "
                       f"DataParallel(model.to(macfleet.device())), or launch with --device cpu to train on the CPU")


def _check_not_wrapped(module: nn.Module) -> None:
    """A DataParallel in the model: its forward refused the outer one's call, as its parameters
    were "wrapped again by a newer DataParallel", and said to train through the newer one, as the
    script did."""
    for name, inner in module.named_modules():
        if isinstance(inner, DataParallel):
            if not name:
                raise ConfigError("the model given to DataParallel is a DataParallel already: wrap a model once; to "
                                  "wrap it anew (after freezing or adding layers), wrap the model inside it, "
                                  "DataParallel(model.module)")
            raise ConfigError(f"the model given to DataParallel holds a DataParallel ({name!r}): wrap a model once, "
                              f"the whole model, with the model inside that one ({name}.module) in its place")


def _check_materialized(module: nn.Module) -> None:
    """A model built on the meta device (``with torch.device("meta")``, to build a big one
    fast) and wrapped before it was given memory: the error came from our broadcast of the
    parameters, named "parameters", or, in a job of one, from torch at the first forward."""
    for kind, named in (("parameter", module.named_parameters()), ("buffer", module.named_buffers())):
        for name, tensor in named:
            if tensor.is_meta:
                raise ConfigError(f"{kind} {name!r} is on the meta device, which holds no data: give the model "
                                  f"memory before wrapping it, model.to_empty(device=macfleet.device()) and then "
                                  f"load or initialize its weights")


def _check_trainable(named: list[tuple[str, nn.Parameter]], device: Device) -> None:
    for name, p in named:
        if isinstance(p, nn.parameter.UninitializedParameter):
            raise ConfigError(
                f"parameter {name!r} is not initialized yet (a lazy module such as nn.LazyLinear): run one "
                f"forward pass on a sample batch before wrapping the model, as DDP asks too")
        device.check_dtype(p, f"parameter {name!r}")


@dataclass(slots=True)
class _Step:
    """The training step under way. Apart from the module's attributes: nn.Module's
    ``__setattr__`` costs 2 us a write (more, run cold after backward), and a step made a dozen."""

    queued: bool = False  # a gradient of this backward has come: the step's exchange is under way
    finish_queued: bool = False  # the end-of-backward callback is queued on a backward under way
    began: float = 0.0  # with the timeline on: when this forward, or this backward's first gradient, came
    forwards: int = 0  # training forwards since a backward last reached the outputs (join() allows one)
    released: int = 0  # buckets released for averaging in this step: always a prefix, in index order
    wait_s: float = 0.0  # how long the end of the last backward waited for communication
    ended: tuple[float, float] | None = None  # when the last step's exchange ended, and waited_s then
    lent: list[Bucket] = field(default_factory=list)  # buckets that lent their views to this backward


class _Placeless:
    """Holds the attributes ``DataParallel._forget_place`` gives, for ``__getstate__``."""


class _Registrations:
    """How many parameters, buffers and submodules the process's modules have been given since
    DataParallel was first used (torch's global registration hooks). While the count stands
    still, no wrapped module gained or lost a parameter or buffer."""

    count = 0
    _installed = False

    @classmethod
    def install(cls) -> None:
        if not cls._installed:
            cls._installed = True
            module = nn.modules.module
            module.register_module_parameter_registration_hook(cls._registered)
            module.register_module_buffer_registration_hook(cls._registered)
            module.register_module_module_registration_hook(cls._registered)

    @classmethod
    def _registered(cls, *_: Any) -> None:
        cls.count += 1


_wrappers: weakref.WeakSet[DataParallel] = weakref.WeakSet()  # every DataParallel of the process that averages


def _take_over(new: DataParallel, params: list[nn.Parameter]) -> None:
    """``new`` averages ``params`` from now on. An older DataParallel of the same module, or
    holding any of them, stops: a model wrapped again (after unfreezing layers, as DDP asks)
    must not be averaged twice, nor by buckets laid out for the model as it was."""
    mine = {id(p) for p in params}  # both sides alive: an id names one parameter
    for old in list(_wrappers):
        if old is not new and (old.module is new.module or any(id(p) in mine for b in old.buckets for p in b.params)):
            old._retire(new)
            _wrappers.discard(old)
    _wrappers.add(new)


def _by_dtype(tensors: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    groups: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.dtype, t.device), []).append(t)
    return list(groups.values())


def _broadcast_flat(tensors: list[torch.Tensor], what: str, src: int = 0) -> None:
    """Broadcast from rank ``src`` in one message per dtype rather than one per tensor."""
    for group in _by_dtype([t for t in tensors if t.numel()]):
        flat = torch.cat([t.reshape(-1) for t in group])
        rt.broadcast(flat, src, name=what)
        offset = 0
        for t in group:
            t.copy_(flat[offset: offset + t.numel()].view_as(t))
            offset += t.numel()
