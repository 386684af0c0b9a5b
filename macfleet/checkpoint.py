"""Checkpoints that survive crashes: ``save`` and ``load``, called on every rank.

A checkpoint holds the model, optimizer, learning-rate scheduler and gradient scaler state,
step, epoch, the sampler's position and the RNG state of every generator of every rank (CPU,
device, Python), so a restarted job continues exactly where it stopped. Rank 0 writes it
atomically: to a temporary file, fsync'd, then renamed over the old one, so a crash during a
save leaves the previous checkpoint whole.
``load`` reads the file on rank 0 and broadcasts it, so other hosts need no shared disk. From
torch 2.6 on it unpickles tensors and plain Python values only, as ``torch.load`` does by
default there, so that a checkpoint from elsewhere cannot run code on every rank of the job.
"""

from __future__ import annotations

import io
import os
import random
import re
import sys
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import msgpack
import torch
from torch import nn

from macfleet import runtime as rt
from macfleet.errors import ConfigError
from macfleet.objects import all_gather_bytes, broadcast_bytes, tensor_bytes
from macfleet.parallel import DataParallel

FORMAT = "macfleet-checkpoint"
VERSION = 1
# How torch names what ``torch.load(weights_only=True)`` refuses to make: "Unsupported global:
# GLOBAL argparse.Namespace was not an allowed global ...", "... unsupported GLOBAL posix.mkdir
# whose module posix is blocked", and before torch 2.4 "Unsupported class argparse.Namespace".
REFUSED_GLOBAL = re.compile(r"(?:\bGLOBAL|Unsupported class) ([\w.]+)")
TORCH_VERSION = tuple(int(part) for part in re.findall(r"\d+", torch.__version__)[:2])  # (major, minor)
# torch.load reads tensors and plain values only unless told otherwise from torch 2.6 on; before,
# its own state dicts were not all such values (OneCycleLR's held a bound method in torch 2.1).
WEIGHTS_ONLY_BY_DEFAULT = TORCH_VERSION >= (2, 6)


@dataclass
class Checkpoint:
    step: int = 0
    epoch: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def save(path: str, model: nn.Module, optimizer: torch.optim.Optimizer | None = None, *, step: int = 0,
         epoch: int = 0, sampler: Any = None, sampler_consumed: int = 0, scheduler: Any = None,
         scaler: Any = None, **extra: Any) -> None:
    """Collective: every rank must call it. ``sampler_consumed`` is how many samples of the
    current epoch this rank has already taken from ``sampler``. ``scheduler``: the script's
    learning-rate scheduler, without which a resumed run would start its schedule over;
    ``scaler``: its ``torch.amp.GradScaler`` (float16 autocast), whose scale would start over
    (anything with ``state_dict`` and ``load_state_dict`` will do for either). ``extra``:
    anything else to keep (``Checkpoint.extra`` at the load); plain values and tensors load as
    they are, anything else, from torch 2.6 on, only with ``load(..., weights_only=False)``
    (rank 0 says so)."""
    stateful = _stateful(scheduler=scheduler, scaler=scaler)
    with rt.on_behalf_of("checkpoint.save"):
        states = _gather_rng_states()
    if rt.rank() != 0:
        return
    _warn_of_code_in(extra)
    state = {
        "format": FORMAT, "version": VERSION, "world_size": rt.world_size(),
        "model": _unwrap(model).state_dict(),
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "step": step, "epoch": epoch,
        "sampler": sampler.state_dict(sampler_consumed) if sampler is not None else None,
        **{name: value.state_dict() for name, value in stateful.items()},
        # uint8 tensors, not bytes: torch 2.1's restricted unpickler refused bytes
        "rng": [torch.frombuffer(bytearray(blob), dtype=torch.uint8) for blob in states],
        "extra": extra,
    }
    atomic_save(state, path)


def atomic_save(state: dict[str, Any], path: str) -> None:
    """Write ``state`` to ``path`` so that ``path`` is always either the old or the new file."""
    directory = os.path.dirname(os.path.abspath(path))
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        os.makedirs(directory, exist_ok=True)
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:  # a full disk, a read-only one: name the checkpoint, not our temporary file
        raise OSError(exc.errno, f"cannot write checkpoint {path}: {exc.strerror or exc}") from None
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)  # the rename itself must reach the disk
    finally:
        os.close(fd)


def load(path: str, model: nn.Module, optimizer: torch.optim.Optimizer | None = None, sampler: Any = None,
         scheduler: Any = None, scaler: Any = None, *, weights_only: bool | None = None) -> Checkpoint:
    """Collective: restore what ``save`` wrote; raise ``ConfigError`` (one line) if it does not fit.

    ``weights_only``: as ``torch.load``'s, whose default it takes (True from torch 2.6 on).
    False also makes what ``extra`` held that is not a tensor or a plain value (an
    ``argparse.Namespace``), which unpickling does by running code the file names: only for a
    file you trust.

    A checkpoint of a job with another number of ranks (a Mac gone, or one added) loads too:
    model, optimizer, step, epoch and the sampler's place in the epoch resume, but each rank's
    random generators keep this job's seeds, so the run is no longer bit-identical to one that
    was never interrupted (rank 0 says so)."""
    stateful = _stateful(scheduler=scheduler, scaler=scaler)
    with rt.on_behalf_of("checkpoint.load"):
        state = _read_on_rank0_and_broadcast(path, weights_only)
    saved_world = state.get("world_size")
    _load_model(path, _unwrap(model), state["model"])
    if optimizer is not None:
        if state.get("optimizer") is None:
            raise ConfigError(f"{path} holds no optimizer state")
        try:
            optimizer.load_state_dict(state["optimizer"])
        except (ValueError, KeyError, RuntimeError) as exc:
            raise ConfigError(f"{path}: optimizer state does not fit this optimizer ({exc})") from None
    if sampler is not None and state.get("sampler") is not None:
        sampler.load_state_dict(state["sampler"])
    for name, value in stateful.items():
        if state.get(name) is None:  # it would start over: say so, as for the optimizer
            raise ConfigError(f"{path} holds no {name} state (save it with checkpoint.save(..., {name}=...))")
        try:
            value.load_state_dict(state[name])
        except (ValueError, KeyError, RuntimeError, TypeError) as exc:
            raise ConfigError(f"{path}: its {name} state does not fit this {name} ({exc})") from None
    if saved_world == rt.world_size():
        _restore_rng(state["rng"][rt.rank()])
    elif rt.rank() == 0:
        print(f"macfleet: {path} was written by a job of {saved_world} ranks and this one has {rt.world_size()}: "
              f"model, optimizer, step, epoch and the sampler's place resume; each rank's random generators "
              f"start from this job's seeds, so the run is not bit-identical to an uninterrupted one",
              file=sys.stderr, flush=True)
    return Checkpoint(step=int(state["step"]), epoch=int(state["epoch"]), extra=dict(state.get("extra") or {}))


def _stateful(**given: Any) -> dict[str, Any]:
    """Those of ``given`` that are not None, each checked to have a state to save and load: a
    scheduler's ``state_dict()`` passed for the scheduler would otherwise fail only at the load,
    after the run it was to resume."""
    for name, value in given.items():
        if value is not None and not (callable(getattr(value, "state_dict", None))
                                      and callable(getattr(value, "load_state_dict", None))):
            raise ConfigError(f"{name}= takes the {name} itself (an object with state_dict and load_state_dict), "
                              f"not a {type(value).__name__}")
    return {name: value for name, value in given.items() if value is not None}


_warned: set[str] = set()  # the keys already warned of: once a run, not at every save


def _warn_of_code_in(extra: dict[str, Any]) -> None:
    """Say at the save, not at the load that resumes a crashed run, which of ``extra``'s values
    ``load`` makes only with ``weights_only=False``."""
    if not WEIGHTS_ONLY_BY_DEFAULT:
        return  # load reads anything by default, as torch.load does here
    for key, value in extra.items():
        refused = None if key in _warned else _refused_type(value)
        if refused is not None:
            _warned.add(key)
            print(f"macfleet: checkpoint.save: {key}= holds an object that only code can make ({refused}): "
                  f"checkpoint.load reads it only with weights_only=False, as torch.load does (unpickling runs the "
                  f"code that the file names); keep plain values (vars(args) for an argparse.Namespace) and it loads "
                  f"as it is", file=sys.stderr, flush=True)


CONTAINERS = (dict, OrderedDict, list, tuple, set)  # these exact types: what torch's reader makes of their items
# Values that pickle's own opcodes hold (no global to look up), which every torch's reader makes:
# a metrics history of 15 epochs is some 80 of them, 43 ms a save when each was read back alone
PLAIN = (int, float, str, bool, type(None))


def _refused_type(value: Any) -> str | None:
    """What in ``value`` ``torch.load(weights_only=True)`` refuses to make, as torch names it.
    torch's own reader judges each of the other values, pickled and read back alone; tensors and
    plain values, which it always reads, are not copied for it (an EMA's state in extra may be
    the model's size)."""
    if isinstance(value, torch.Tensor) or type(value) in PLAIN:
        return None
    if type(value) in CONTAINERS:
        items = [*value.keys(), *value.values()] if isinstance(value, dict) else value
        return next((refused for item in items if (refused := _refused_type(item)) is not None), None)
    buffer = io.BytesIO()
    try:
        torch.save(value, buffer)
    except Exception:  # nothing to read back: the save itself raises it, with torch's own words
        return None
    try:
        torch.load(io.BytesIO(buffer.getvalue()), map_location="cpu", weights_only=True)
    except Exception as exc:  # UnpicklingError, as torch raises it; a check must never fail the save
        named = REFUSED_GLOBAL.search(str(exc))
        return named.group(1) if named else "a type torch does not name"
    return None


def _read_on_rank0_and_broadcast(path: str, weights_only: bool | None) -> dict[str, Any]:
    blob: bytes | None = b""
    error = ""
    if rt.rank() == 0:
        try:
            with open(path, "rb") as f:
                blob = f.read()
        except OSError as exc:
            blob, error = None, f"rank 0 cannot read checkpoint {path}: {exc.strerror}"
    data = broadcast_bytes(blob, 0, name="checkpoint")
    if data is None:  # every rank, each with rank 0's reason: the first to raise is the job's root cause
        reason = broadcast_bytes(error.encode(), 0, name="checkpoint error")
        assert reason is not None  # bytes from rank 0, never None
        raise ConfigError(reason.decode(errors="replace"))
    # None is torch's default, with its TORCH_FORCE_(NO_)WEIGHTS_ONLY_LOAD; before torch 2.6 that is
    # False, said here, since torch 2.4 and 2.5 warn of a None at every load
    chosen = False if weights_only is None and not WEIGHTS_ONLY_BY_DEFAULT else weights_only
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=chosen)
    except Exception as exc:  # torch raises many kinds for a truncated or foreign file
        refused = REFUSED_GLOBAL.search(str(exc))  # named only by torch's restricted reader
        if refused:
            raise ConfigError(f"{path} holds an object that only code can make ({refused.group(1)}), and unpickling "
                              f"runs the code that the file names: checkpoint.load(..., weights_only=False) reads it, "
                              f"as torch.load does, for a file you trust (your own run's)") from None
        raise ConfigError(f"{path} is not a readable checkpoint (corrupt or truncated?): {type(exc).__name__}") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ConfigError(f"{path} is not a macfleet checkpoint")
    if state.get("version") != VERSION:
        raise ConfigError(f"{path} is a version {state.get('version')} checkpoint; this macfleet reads {VERSION}")
    return state


def _load_model(path: str, model: nn.Module, saved: dict[str, torch.Tensor]) -> None:
    own = model.state_dict()
    missing = [k for k in own if k not in saved]
    unexpected = [k for k in saved if k not in own]
    shapes = [k for k in own if k in saved and tuple(own[k].shape) != tuple(saved[k].shape)]
    if missing or unexpected or shapes:
        parts = []
        for label, keys in (("missing", missing), ("unexpected", unexpected), ("different shape", shapes)):
            if keys:
                parts.append(f"{label}: {', '.join(keys[:3])}{' ...' if len(keys) > 3 else ''}")
        raise ConfigError(f"{path} is a checkpoint of a different model ({'; '.join(parts)})")
    model.load_state_dict(saved)


def _unwrap(model: nn.Module) -> nn.Module:
    """The script's own model inside the wrappers around it: DataParallel (ours, torch's) and
    DDP, and torch.compile's, in any order. A checkpoint's keys are then the same however the
    model was wrapped, so a run resumed with compile switched on or off still loads. Only these
    wrappers are opened: a model of the script's own may have a submodule called ``module``."""
    compiled = sys.modules.get("torch._dynamo.eval_frame")  # a compiled model means it is imported
    while True:
        if isinstance(model, (DataParallel, nn.parallel.DistributedDataParallel, nn.DataParallel)):
            model = model.module
        elif compiled is not None and isinstance(model, compiled.OptimizedModule):
            model = model._orig_mod
        else:
            return model


# -- RNG state of every rank --------------------------------------------------------------
def _rng_blob() -> bytes:
    state = rt.runtime().device.rng_state()
    version, internal, gauss = random.getstate()
    return msgpack.packb({
        "torch": tensor_bytes(state["torch"]),
        "device": tensor_bytes(state["device"]) if "device" in state else None,
        "python": [version, list(internal), gauss],
    })


def _gather_rng_states() -> list[bytes]:
    return all_gather_bytes(_rng_blob(), name="checkpoint RNG states")


def _restore_rng(blob: torch.Tensor | bytes) -> None:
    """From a checkpoint's uint8 tensor, or the bytes that checkpoints held before."""
    fields = msgpack.unpackb(bytes(blob.tolist()) if isinstance(blob, torch.Tensor) else blob)
    state: dict[str, Any] = {
        "torch": torch.frombuffer(bytearray(fields["torch"]), dtype=torch.uint8),
        "python": (fields["python"][0], tuple(fields["python"][1]), fields["python"][2]),
    }
    if fields.get("device") is not None:
        state["device"] = torch.frombuffer(bytearray(fields["device"]), dtype=torch.uint8)
    rt.runtime().device.set_rng_state(state)
