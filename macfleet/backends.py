"""Device backends: the small interface the rest of macfleet uses to touch a GPU.

One implementation per kind (``cpu``, ``cuda``, ``mps``), chosen per process. Everything a
trainer needs from the device goes through here: the torch device, the memory share, seeding
and RNG state, events recorded on the device and waited for on the host, and copies between
device tensors and reusable host buffers (blocking on MPS; queued on a side stream on CUDA).

The MPS implementation follows shared/reference/mps-facts.md: no float64, no pinned memory,
blocking copies only, events always recorded before they are waited for (and waited for by
asking, ``PolledEvent``: torch's MPS synchronize keeps the GIL), and every ``torch.mps``
feature looked up rather than assumed from a version number. The CUDA
implementation runs the same code path on the device machine, which is how the MPS path is
exercised without a Mac.
"""

from __future__ import annotations

import random
import time
import weakref
from typing import Any, Protocol

import torch

from macfleet.errors import ConfigError


class HostEvent(Protocol):
    """A point in the device's work queue that the host can wait for."""

    def synchronize(self) -> None: ...


class _Done:
    """CPU work is finished when the Python call returns; nothing to wait for."""

    def synchronize(self) -> None:
        return None


class PolledEvent:
    """A device event the host waits for by asking, so that the waiting thread holds the GIL
    only for each question. torch's MPS binding keeps the GIL while ``synchronize`` blocks
    (``_mps_synchronizeEvent`` has no GIL release; CUDA's has one), which stops every other
    Python thread of the process until the GPU gets there: on MPS the thread that runs backward
    waits for each complete bucket's gradients (``copies_from_training_thread``), and
    DataParallel's bucket thread, averaging the buckets before it, and the heartbeats would
    stop with it. ``query`` returns at once; between questions the thread sleeps, 20 us at
    first, doubling up to 200 us: the last bucket's wait is on the step's critical path, and a
    question costs microseconds."""

    def __init__(self, event: Any) -> None:
        self.event = event

    def synchronize(self) -> None:
        pause = 20e-6
        while not self.event.query():
            time.sleep(pause)  # gives up the GIL
            pause = min(2 * pause, 200e-6)


class Device:
    """CPU backend, and the base of the GPU ones."""

    kind = "cpu"
    unsupported_dtypes: frozenset[torch.dtype] = frozenset()
    # Whether device copies must be issued from the thread that runs backward, never from
    # DataParallel's bucket thread while backward runs (see MpsDevice).
    copies_from_training_thread = False
    # A gradient bucket whose gradients average at most this many bytes lends them its views at
    # backward's start (``Bucket.lend_views``): autograd adds each into the bucket, two more
    # passes over memory than copying it in from Python, a call per gradient. On the device
    # machine's CPU (1, 2 and 4 threads a rank) lending shortened the step (or left it level) for
    # gradients of 16 to 512 KiB and lengthened it at 1 MiB; on the 2-core machine it lost from
    # 64 KiB, by 2-3% of the step at 512 KiB (benchmarks/results/2026-12-02-session68).
    lend_grad_bytes: float = 512 << 10
    # Whether a gradient's view in its bucket takes its parameter's dense layout (channels_last)
    # where that is not the plain one, as autograd's own gradients and DDP's bucket views do.
    strided_grad_views = True

    def __init__(self, index: int = 0) -> None:
        self.index = index

    @property
    def torch_device(self) -> torch.device:
        return torch.device("cpu")

    def apply_memory_fraction(self, fraction: float | None) -> None:
        return None  # host memory is not partitioned

    def processes_on_it(self, local_world_size: int) -> int:
        """How many of this host's ``local_world_size`` ranks share this device's memory: all
        of them (a Mac has one GPU, and the host one memory)."""
        return local_world_size

    def seed(self, seed: int) -> None:
        # torch.manual_seed seeds the CPU generator and every device generator (CUDA and MPS).
        torch.manual_seed(seed)
        random.seed(seed)

    def rng_state(self) -> dict[str, Any]:
        return {"torch": torch.get_rng_state(), "python": random.getstate()}

    def set_rng_state(self, state: dict[str, Any]) -> None:
        torch.set_rng_state(state["torch"])
        random.setstate(state["python"])

    def record_event(self) -> HostEvent:
        return _Done()

    def memory(self) -> dict[str, int]:
        """Bytes of device memory: ``allocated`` (held by tensors) and ``reserved`` (what the
        allocator holds from the driver, its cache included). Empty on the CPU."""
        return {}

    def empty_cache(self) -> None:
        """Give the allocator's cached blocks back to the driver. On MPS the cache keeps blocks
        of every shape seen, and the ranks of one Mac share its memory (mps-facts.md checklist 5)."""
        return None

    # Staging: device tensors to and from reusable host buffers, for the communication thread.
    def host_buffer(self, numel: int, dtype: torch.dtype, memory: torch.Tensor | None = None) -> torch.Tensor:
        """A host buffer to stage this device's tensors through: ``memory`` (a host tensor of
        ``numel`` elements, e.g. shared memory) where given, else a new one. Plain memory: MPS
        gains nothing from pinning, and older torch refuses it there (mps-facts.md section 3)."""
        return memory if memory is not None else torch.zeros(numel, dtype=dtype, device="cpu")

    def to_host(self, src: torch.Tensor, dst: torch.Tensor, ready: HostEvent) -> HostEvent:
        """Copy ``src`` into host buffer ``dst`` once ``ready``; ``dst`` holds the data when the
        returned event is synchronized. Here (and on MPS) the copy is done when this returns."""
        ready.synchronize()
        dst.copy_(src)  # non_blocking=False: complete when it returns (mps-facts.md checklist 6)
        return _Done()

    def from_host(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy host buffer ``src`` back to the device; ``src`` stays untouched until the next
        ``to_host`` into it, which is ordered after this copy."""
        dst.copy_(src)

    def staged(self) -> None:
        """Make the work queue of the training thread see every ``from_host`` copy so far."""
        return None

    def check_dtype(self, tensor: torch.Tensor, name: str) -> None:
        if tensor.dtype in self.unsupported_dtypes:
            raise ConfigError(
                f"{name} is {tensor.dtype}, which {self.kind} does not support; use torch.float32 instead"
            )


class CudaDevice(Device):
    kind = "cuda"
    # Passes over GPU memory cost less than the copies' calls at any size. On an H200, lending
    # shortened the step for gradients of 64 KiB to 16 MiB, and backward by 0.4-1 ms on models
    # of 8-64 MiB gradients, whose step (most of it the exchange through the host) moved by
    # -4% to +3% (benchmarks/results/2026-12-02-session68).
    lend_grad_bytes = float("inf")

    @property
    def torch_device(self) -> torch.device:
        return torch.device("cuda", self.index)

    def apply_memory_fraction(self, fraction: float | None) -> None:
        torch.cuda.set_device(self.index)
        if fraction:
            torch.cuda.set_per_process_memory_fraction(float(fraction), self.index)

    def processes_on_it(self, local_world_size: int) -> int:
        # local ranks take the GPUs in turn (``select``): this one has ranks index, index + count, ...
        return len(range(self.index, local_world_size, torch.cuda.device_count()))

    def rng_state(self) -> dict[str, Any]:
        return {**super().rng_state(), "device": torch.cuda.get_rng_state(self.index)}

    def set_rng_state(self, state: dict[str, Any]) -> None:
        super().set_rng_state(state)
        if "device" in state:
            torch.cuda.set_rng_state(state["device"], self.index)

    def memory(self) -> dict[str, int]:
        return {"allocated": torch.cuda.memory_allocated(self.index), "reserved": torch.cuda.memory_reserved(self.index)}

    def empty_cache(self) -> None:
        torch.cuda.empty_cache()

    def record_event(self) -> HostEvent:
        event = torch.cuda.Event()
        event.record()  # always record before anyone synchronizes (an unrecorded event never blocks)
        return event

    # A side stream for staging: a copy on the training stream would queue behind every kernel
    # backward launched after the bucket's event. The side stream waits for that event only (a
    # wait on our own computation, never on the network). Copies are queued there and the host
    # waits for each only when it needs the data, so copies overlap the host's reductions.
    def _side_stream(self) -> torch.cuda.Stream:
        stream = getattr(self, "_side", None)
        if stream is None:
            stream = self._side = torch.cuda.Stream(self.index)
        return stream

    def host_buffer(self, numel: int, dtype: torch.dtype, memory: torch.Tensor | None = None) -> torch.Tensor:
        if memory is None:
            # DMA-able: copies run at full PCIe speed
            return torch.zeros(numel, dtype=dtype, device="cpu", pin_memory=True)
        # Page-lock memory we did not allocate (shared memory), so copies to it are DMA and stay
        # asynchronous; if the driver refuses, copies still work, staged through the driver.
        # Unlocked again when the tensor goes; the finalizer holds a view, so the memory stays
        # mapped until then.
        torch.cuda.cudart().cudaHostRegister(memory.data_ptr(), memory.numel() * memory.element_size(), 0)
        weakref.finalize(memory, _unregister, memory.view(-1)).atexit = False  # at exit the driver cleans up
        return memory

    def to_host(self, src: torch.Tensor, dst: torch.Tensor, ready: HostEvent) -> HostEvent:
        stream = self._side_stream()
        stream.wait_event(ready)  # type: ignore[arg-type]
        with torch.cuda.stream(stream):
            dst.copy_(src, non_blocking=True)  # queued: the next bucket's copy overlaps this one's reduction
        copied = torch.cuda.Event()
        copied.record(stream)
        return copied

    def from_host(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        with torch.cuda.stream(self._side_stream()):
            dst.copy_(src, non_blocking=True)  # staged() orders the training stream after it

    def staged(self) -> None:
        torch.cuda.current_stream(self.index).wait_stream(self._side_stream())


def _unregister(memory: torch.Tensor) -> None:
    torch.cuda.cudart().cudaHostUnregister(memory.data_ptr())


class MpsDevice(Device):
    kind = "mps"
    # Metal has no float64 (mps-facts.md section 4): refuse it by name rather than fail deep in torch.
    unsupported_dtypes = frozenset({torch.float64, torch.complex128})
    # A process has one MPS stream, whose command buffer and encoders Metal does not let two
    # threads use at once, and torch does not guard every op against it: MPS ops from two
    # Python threads at once crash the process inside Metal (SIGSEGV/SIGABRT in
    # blitCommandEncoderCommon) on torch 2.8 to 2.15 (pytorch#197805; its fix was reverted).
    # A bucket's copies to and from its host buffer are blits, so they stay on backward's thread.
    copies_from_training_thread = True
    # Plain views here: a channels_last view at an offset into its bucket is the case MPS kernels
    # have got wrong in silence (the offset ignored: pytorch#175235, fixed in February 2026; a
    # copy_ between strided views: pytorch#189961, on 2.13). A channels_last model's gradients
    # are then added into plain views, more slowly, and torch warns once a rank.
    strided_grad_views = False
    # ``lend_grad_bytes`` stays the CPU's, unmeasured on Metal: the two passes over 512 KiB that
    # lending adds take about 10 us of a 100 GB/s Mac's GPU, under the 10-30 us copy call it saves.

    @property
    def torch_device(self) -> torch.device:
        return torch.device("mps")

    def apply_memory_fraction(self, fraction: float | None) -> None:
        # The agent already set PYTORCH_MPS_{HIGH,LOW}_WATERMARK_RATIO before torch was imported;
        # this call makes the cap exact for processes started without the agent.
        setter = getattr(torch.mps, "set_per_process_memory_fraction", None)
        if fraction and setter is not None:
            setter(float(fraction))

    def rng_state(self) -> dict[str, Any]:
        state = super().rng_state()
        getter = getattr(torch.mps, "get_rng_state", None)
        if getter is not None:
            state["device"] = getter()
        return state

    def set_rng_state(self, state: dict[str, Any]) -> None:
        super().set_rng_state(state)
        setter = getattr(torch.mps, "set_rng_state", None)
        if setter is not None and "device" in state:
            setter(state["device"])

    def memory(self) -> dict[str, int]:
        allocated = getattr(torch.mps, "current_allocated_memory", None)  # torch >= 2.1
        driver = getattr(torch.mps, "driver_allocated_memory", None)
        return {"allocated": allocated(), "reserved": driver()} if allocated and driver else {}

    def empty_cache(self) -> None:
        release = getattr(torch.mps, "empty_cache", None)
        if release is not None:
            release()

    def record_event(self) -> HostEvent:
        event_cls = getattr(getattr(torch.mps, "event", None), "Event", None) or getattr(torch.mps, "Event", None)
        if event_cls is None:  # torch < 2.1: a full device sync is the only host-side wait
            torch.mps.synchronize()
            return _Done()
        event = event_cls()
        event.record()  # commits the command buffer: the event will signal without further help
        return PolledEvent(event)


def mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def select(kind: str, local_rank: int = 0) -> Device:
    """The backend for ``kind`` (``auto``: mps, then cuda, then cpu) for this process."""
    if kind == "auto":
        kind = "mps" if mps_available() else "cuda" if torch.cuda.is_available() else "cpu"
    if kind == "mps":
        if not mps_available():
            raise ConfigError("--device mps asked for, but this machine has no usable MPS device")
        return MpsDevice()
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("--device cuda asked for, but torch sees no CUDA device")
        return CudaDevice(local_rank % torch.cuda.device_count())
    if kind == "cpu":
        return Device()
    raise ConfigError(f"unknown device {kind!r}: choose auto, mps, cuda or cpu")


def check_tensor(tensor: torch.Tensor, name: str) -> None:
    """Refuse a dtype the tensor's own device cannot hold (float64 on MPS), naming the tensor."""
    if tensor.device.type == "mps" and tensor.dtype in MpsDevice.unsupported_dtypes:
        raise ConfigError(
            f"{name} is {tensor.dtype} on mps, and Metal has no 64-bit floats; "
            f"cast it on the CPU first (tensor.float()) and keep float32/bfloat16/float16 on MPS"
        )
