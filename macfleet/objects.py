"""Collectives of bytes and of Python objects, for what is not a tensor: a metrics dict to
gather, a configuration chosen on rank 0, a checkpoint file read on one host.

``broadcast_object`` and ``all_gather_object`` are torch.distributed's ``broadcast_object_list``
/ ``all_gather_object`` and Horovod's ``broadcast_object`` / ``allgather_object``. Objects
travel pickled, as theirs do: unpickling can run code, so they are for the job's own ranks
(every message on the ring is signed with the job's secret). Bytes travel as a uint8 tensor,
after their length.
"""

from __future__ import annotations

import pickle
from typing import Any

import torch

from macfleet import runtime as rt


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` on every rank (what the other ranks pass is not used)."""
    blob = broadcast_bytes(pickle.dumps(obj) if rt.rank() == src else b"", src, name="object")
    assert blob is not None
    return pickle.loads(blob)


def all_gather_object(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order."""
    return [pickle.loads(blob) for blob in all_gather_bytes(pickle.dumps(obj), name="object")]


def broadcast_bytes(blob: bytes | None, src: int = 0, name: str = "bytes") -> bytes | None:
    """Rank ``src``'s ``blob`` on every rank. None from ``src`` (it could not produce the
    bytes) is None on every rank, so that every rank can fail alike."""
    size = torch.tensor([-1 if blob is None else len(blob)], dtype=torch.int64, device="cpu")
    rt.broadcast(size, src, name=f"{name} size")
    if size.item() < 0:
        return None
    data = torch.zeros(int(size.item()), dtype=torch.uint8, device="cpu")
    if rt.rank() == src and blob:
        data.copy_(torch.frombuffer(bytearray(blob), dtype=torch.uint8))
    rt.broadcast(data, src, name=name)
    return tensor_bytes(data)


def all_gather_bytes(blob: bytes, name: str = "bytes") -> list[bytes]:
    """Every rank's ``blob``, in rank order; they may differ in length."""
    if rt.world_size() == 1:
        return [blob]
    length = torch.tensor([len(blob)], dtype=torch.int64, device="cpu")
    lengths = rt.all_gather(length, name=f"{name} size").flatten().tolist()
    padded = torch.zeros(max(lengths), dtype=torch.uint8, device="cpu")
    if blob:
        padded[: len(blob)] = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
    gathered = rt.all_gather(padded, name=name)
    return [tensor_bytes(gathered[r][: lengths[r]]) for r in range(len(lengths))]


def tensor_bytes(data: torch.Tensor) -> bytes:
    """A uint8 CPU tensor's contents."""
    out = bytearray(data.numel())
    if out:
        torch.frombuffer(out, dtype=torch.uint8).copy_(data)
    return bytes(out)
