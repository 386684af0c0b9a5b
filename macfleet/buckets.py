"""Gradient buckets, and the thread that averages them while backward runs.

A bucket is one flat tensor holding the gradients of a run of parameters (their ``.grad`` are
views into it), laid out by ``bucket_layout``. ``BucketThread`` is the process's one
communication thread: the thread that runs backward hands it each complete bucket with a
device event, and releases buckets for averaging strictly in index order; the thread copies
each to its host buffer once the event has passed (``stage``: waiting on the host, never on
the GPU), averages released buckets over all ranks in release order (``average``), and copies
them back. DataParallel (``macfleet.parallel``) decides what goes into which bucket and when a
bucket is complete; this module moves and averages them.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch import nn

from macfleet import runtime as rt
from macfleet import timeline
from macfleet.backends import Device, HostEvent

# Buckets up to LEND_BYTES, or of at most the device's ``lend_grad_bytes`` a gradient on average,
# hold the gradients from the start of backward (``lend_views``).
LEND_BYTES = 1 << 20


@dataclass
class Bucket:
    """The gradients of a run of parameters, in one flat tensor, and the state of its exchange."""

    index: int
    params: list[nn.Parameter]
    names: list[str]
    offsets: list[int]
    flat: torch.Tensor  # on the device; the parameters' .grad are views into it
    host: torch.Tensor | None = None  # reused staging buffer (None when the device is the host)
    scale: float = 1.0  # this rank's gradients count this much in the average (``shares``)
    strided: bool = True  # views in their parameters' dense layout (``Device.strided_grad_views``)
    pending: set[int] = field(default_factory=set)  # ids of parameters whose gradient has not come yet
    sparse: dict[int, int] = field(default_factory=dict)  # position -> sparse_dim of a gradient that came sparse
    done: bool = True  # averaged in the current step (set by the communication thread)
    # whether every gradient of it came dense so far (None: no step has ended yet); see ``lend_views``
    dense: bool | None = None
    # How many times a backward brings each gradient, where more than once: a layer run in several
    # reentrant checkpoints gets its gradient from each checkpoint's backward of its own. None
    # until a backward has shown it (``DataParallel._count``).
    repeats: dict[int, int] | None = None
    counts: dict[int, int] | None = None  # id(param) -> its gradients so far in this backward, where counted
    # The parameters' gradients as views of ``flat``, made once: a slice and a view_as per
    # gradient per step cost a quarter of the gradient hook's time (cProfile, 202 parameters).
    views: list[torch.Tensor] = field(init=False, repr=False, compare=False)
    # where each view's memory starts, and its parameter's, when the view was made (``moved``)
    places: list[int] = field(init=False, repr=False, compare=False)
    homes: list[int] = field(init=False, repr=False, compare=False)
    label: str = field(init=False, repr=False, compare=False)  # its name in collectives' errors and timeline

    def __post_init__(self) -> None:
        self.views = [self._make_view(k) for k in range(len(self.params))]
        self.places = [view.data_ptr() for view in self.views]
        self.homes = [p.data_ptr() for p in self.params]
        self.label = f"gradient bucket {self.index}"

    def _make_view(self, k: int) -> torch.Tensor:
        """The k-th gradient's place in ``flat``, laid out as autograd lays out the gradients it
        makes: with the parameter's strides where they are dense (channels_last), else
        contiguous. A gradient in another layout than its parameter's is added into more slowly,
        and torch warned on every rank that the "gradient layout contract" was broken. Plain
        where the device's kernels are not trusted with such views (``strided``)."""
        offset, p = self.offsets[k], self.params[k]
        # never an inference tensor, though the model may be wrapped under torch.inference_mode():
        # it becomes the parameter's .grad, which training writes outside that mode
        with torch.inference_mode(False):
            piece = self.flat[offset: offset + p.numel()]
            if p.is_contiguous() or not self.strided:
                return piece.view_as(p)
            return piece.as_strided(p.shape, torch.empty_like(p, device="meta").stride())

    def view(self, k: int) -> torch.Tensor:
        return self.views[k]

    def holds(self, k: int, grad: torch.Tensor) -> bool:
        """Whether ``grad`` lies in the k-th gradient's place in the bucket (any view of that
        memory; an empty one has none, and is where it should be)."""
        return grad.data_ptr() == self.places[k]

    def moved(self) -> list[int]:
        """The positions whose parameter or gradient view lies elsewhere than when the view was
        made: a module's ``_apply`` converted them (``model.to(...)`` after wrapping). Two
        pointers a parameter, read at every training forward: a parameter converted to another
        dtype, device or layout gets new memory, made while the old is held, so at another
        address; and so does its gradient where it had one."""
        return [k for k, (p, view) in enumerate(zip(self.params, self.views))
                if p.data_ptr() != self.homes[k] or view.data_ptr() != self.places[k]]

    def mend_view(self, k: int) -> None:
        """Make the k-th gradient's view lie in the bucket, in its parameter's layout, again.
        After wrapping, ``model.to(memory_format=torch.channels_last)`` converts each parameter
        and sets each gradient's ``.data`` (the view tensor itself, which stays the parameter's
        ``.grad``) to a converted copy. Autograd then added the gradients into that copy, which
        no rank exchanges: each rank stepped on its own, and the ranks' models parted, silently.
        What the copy holds (gradients accumulated under ``no_sync()``) is kept."""
        p, view = self.params[k], self.views[k]
        self.homes[k] = p.data_ptr()
        mended = self._make_view(k)
        if view.data_ptr() == self.places[k] and view.stride() == mended.stride():
            return  # the parameter alone has new memory, in its old layout (``p.data = ...``): the view stands
        with torch.no_grad():
            # a plain clone: the view may still be this memory, in another layout (and a copy from
            # a plain tensor is the one MPS is trusted with: ``Device.strided_grad_views``)
            mended.copy_(view.clone(memory_format=torch.contiguous_format))
        if p.grad is view:
            p.grad = mended
        self.views[k], self.places[k] = mended, mended.data_ptr()

    def lend_views(self, grad_bytes: float) -> bool:
        """At the start of a backward: where no parameter of this bucket holds a gradient
        (``zero_grad(set_to_none=True)``, torch's default), zero the bucket and make each
        gradient its view again, so that autograd adds each gradient into the bucket in C++
        instead of handing over new tensors for the gradient hook to copy in, a torch call
        each from Python (run cold after the layer's backward, 10-30 us each). Only where the
        bucket is small (``LEND_BYTES``) or its gradients are, ``grad_bytes`` on average (the
        device's ``lend_grad_bytes``): autograd then makes two more passes over the memory
        (zeroing the bucket, reading the zeros back), which for large gradients on the CPU
        cost more than the calls they save. Only once a step has shown every gradient of it
        dense: a sparse one (``nn.Embedding(sparse=True)``) added into a dense view would stay
        dense, and ``SparseAdam`` takes no other kind. Returns whether it lent them."""
        nbytes = self.flat.numel() * self.flat.element_size()
        if not self.dense or nbytes > max(LEND_BYTES, len(self.params) * grad_bytes):
            return False
        for p in self.params:
            if p.grad is not None:  # what was accumulated is adopted as it is
                return False
        self.flat.zero_()
        for p, view in zip(self.params, self.views):
            p.grad = view
        return True

    def take_back_views(self) -> None:
        """Undo ``lend_views`` where the backward reached no parameter: the gradients are None
        again, as they were (an optimizer skips a parameter whose gradient is None, not one
        whose gradient is zero)."""
        for p in self.params:
            p.grad = None

    def staged(self) -> torch.Tensor:
        """Where the bucket is averaged: its host buffer, or itself where the device is the host."""
        return self.flat if self.host is None else self.host


def bucket_layout(named: list[tuple[str, nn.Parameter]], first_cap: int,
                  cap: int) -> list[list[tuple[str, nn.Parameter]]]:
    """The parameters (``named_parameters`` order) grouped into buckets, last registered first.

    Whole modules go into buckets: the parameters one module owns directly come out of one
    backward node together (a Linear's weight and bias from its addmm), so a boundary between
    them would hold the earlier bucket back until the next layer's backward is over. Reverse
    registration order puts a layer's bias beside the next layer's weight, which DDP's
    size-only rule would bucket together: on a 25M-parameter MLP that delayed a 16 MB bucket
    past the largest layer's backward. A bucket holds one dtype and device; the first is at
    most ``first_cap`` bytes and the rest ``cap`` (a module larger than that gets its own)."""
    def kind(p: nn.Parameter) -> tuple[torch.dtype, torch.device]:
        return p.dtype, p.device

    def owner(name: str) -> str:
        return name.rpartition(".")[0]

    units: list[list[tuple[str, nn.Parameter]]] = []  # consecutive parameters of one owner and kind
    for name, p in reversed(named):
        if units and (owner(units[-1][-1][0]), kind(units[-1][-1][1])) == (owner(name), kind(p)):
            units[-1].append((name, p))
        else:
            units.append([(name, p)])
    groups: list[list[tuple[str, nn.Parameter]]] = []
    size = 0
    for unit in units:
        nbytes = sum(p.numel() * p.element_size() for _, p in unit)
        limit = first_cap if len(groups) <= 1 else cap
        if not groups or kind(groups[-1][0][1]) != kind(unit[0][1]) or size + nbytes > limit:
            groups.append([])
            size = 0
        groups[-1].extend(unit)
        size += nbytes
    return groups


@dataclass
class _Call:
    """A collective for the bucket thread to run after what was released before it (join's round)."""

    fn: Callable[[], Any]
    done: bool = False  # set under BucketThread.done, as a bucket's


class BucketThread:
    """Averages released buckets over the ring, in release order; one per process (``of``)."""

    _current: tuple[rt.Runtime, BucketThread] | None = None
    _creating = threading.Lock()

    @classmethod
    def of(cls, runtime: rt.Runtime) -> BucketThread:
        """The process's thread (a new runtime, after shutdown and init, gets a new one)."""
        with cls._creating:
            if cls._current is None or cls._current[0] is not runtime:
                cls._current = (runtime, cls(runtime))
            return cls._current[1]

    @classmethod
    def existing(cls, runtime: rt.Runtime) -> BucketThread | None:
        current = cls._current
        return current[1] if current is not None and current[0] is runtime else None

    def __init__(self, runtime: rt.Runtime) -> None:
        self.device = runtime.device
        self.collectives = runtime.collectives
        self.inbox: queue.Queue[tuple[Bucket, HostEvent, list[Bucket], str] | _Call] = queue.Queue()
        self.done = threading.Condition()
        self.released = self.finished = 0  # buckets and calls, since the start
        self.error: BaseException | None = None  # sticky: after a failed exchange no gradient is trusted
        self.thread = threading.Thread(target=self._run, name="macfleet-buckets", daemon=True)
        self.thread.start()
        if self.collectives is not None:
            self.collectives.drain = self.drain

    def hand_over(self, bucket: Bucket, ready: HostEvent, release: list[Bucket], compression: str) -> None:
        """Stage ``bucket`` to the host once ``ready`` (where the device takes copies from the
        thread that runs backward only, ``ready`` is the caller's copy done, and the copy back is
        the caller's too); then average ``release`` (in this order, after everything released
        before) with ``compression``. One message, one wake-up."""
        self.released += len(release)  # only the thread that runs backward hands over
        self.inbox.put((bucket, ready, release, compression))

    def submit(self, fn: Callable[[], Any]) -> _Call:
        """Run ``fn`` on this thread after everything released before it; ``wait`` for it."""
        request = _Call(fn)
        self.released += 1  # the threads that submit take turns: forward's, then backward's
        self.inbox.put(request)
        return request

    def drain(self) -> None:
        """Until everything released has been averaged (``Collectives.drain``): a collective of
        the script's made inside backward (SyncBatchNorm's, a custom autograd function's) would
        otherwise race this thread's for the next collective number, and ranks would pair it
        with different buckets. Only the thread that runs backward releases, and it waits here,
        so once idle nothing is in flight: the collective then runs on that thread, after the
        buckets released before it, in the same place on every rank."""
        if self.idle():
            return
        with rt.waiting():
            self._until(lambda: self.finished == self.released)

    def idle(self) -> bool:
        """Whether everything released has been averaged and every call made (then nothing
        else can be in flight)."""
        with self.done:
            return self.finished == self.released

    def wait(self, buckets: Sequence[Bucket | _Call]) -> None:
        """Until every one of ``buckets`` is averaged (collectives have deadlines and turn an
        abort into an error, which arrives here)."""
        self._until(lambda: all(b.done for b in buckets))

    def _until(self, reached: Callable[[], bool]) -> None:
        """Until ``reached()`` (read under ``done``, which each averaged bucket notifies), or
        raise the exchange's error."""
        with self.done:
            while not reached() and self.error is None:
                self.done.wait(0.1)
            if self.error is not None:
                raise self.error

    def _run(self) -> None:
        assert self.collectives is not None  # only a job of several ranks has buckets to exchange
        with self.collectives.in_background():  # overlaps backward: not time the script waits
            self._serve()

    def _serve(self) -> None:
        staged: dict[int, HostEvent] = {}  # by id(bucket): its copy to the host started
        released: deque[tuple[Bucket | _Call, str]] = deque()
        while True:
            arrived = [] if released else [self.inbox.get()]
            while True:  # start the copy of everything that is ready, so copies overlap reductions
                try:
                    arrived.append(self.inbox.get_nowait())
                except queue.Empty:
                    break
            by_caller = self.device.copies_from_training_thread  # then the copies are the training thread's
            for item in arrived:
                if isinstance(item, _Call):  # in its turn: after what was released before it
                    released.append((item, ""))
                    continue
                bucket, ready, release, compression = item
                try:
                    staged[id(bucket)] = ready if by_caller else stage(bucket, ready, self.device)
                except BaseException as exc:  # its release finds nothing staged and ends there
                    self._fail(exc)
                released.extend((b, compression) for b in release)
            if not released:
                continue
            work, compression = released.popleft()
            try:
                if isinstance(work, _Call):
                    work.fn()
                else:
                    average(work, staged.pop(id(work)), self.device, compression, copy_back=not by_caller)
            except BaseException as exc:  # surfaces in the training thread that waits for it
                self._fail(exc)
            with self.done:
                work.done = True
                self.finished += 1
                self.done.notify_all()

    def _fail(self, error: BaseException) -> None:
        with self.done:
            self.error = self.error or error  # the first error is the cause
            self.done.notify_all()


def stage(bucket: Bucket, ready: HostEvent, device: Device) -> HostEvent:
    """Start the bucket's copy to its host buffer once ``ready``; the copy is done at the returned event."""
    if bucket.host is None:  # the device is the host: the bucket is averaged where it is
        return ready
    return device.to_host(bucket.flat, bucket.host, ready)  # the GPU never waits on the network


def average(bucket: Bucket, copied: HostEvent, device: Device, compression: str, copy_back: bool = True) -> None:
    """Average the staged bucket over all ranks and queue its copy back to the device (unless
    ``copy_back`` is False: the thread that runs backward copies it back)."""
    # Where the copy was only queued (CUDA), the wait for it goes on the timeline: what was left
    # of the GPU's work on the bucket, and the copy. One made at once (MPS) is there already
    # (DataParallel._copy_here).
    waits = timeline.RECORDER.on and bucket.host is not None and not device.copies_from_training_thread
    began = time.time() if waits else 0.0
    copied.synchronize()
    if began:
        timeline.RECORDER.span(f"gradient bucket {bucket.index} to host", began, time.time())
    staged = bucket.staged()
    if bucket.scale != 1.0:
        staged.mul_(bucket.scale)
    exchange(bucket, staged, compression)
    if bucket.host is not None and copy_back:
        device.from_host(bucket.host, bucket.flat)


def exchange(bucket: Bucket, staged: torch.Tensor, compression: str) -> None:
    """The bucket's average over all ranks, in ``staged``: the one collective each bucket makes."""
    collectives = rt.runtime().collectives
    assert collectives is not None  # only a job of several ranks has buckets
    collectives.all_reduce(staged, "avg", bucket.label, compression, by="DataParallel (gradients)")
