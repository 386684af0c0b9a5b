"""Host buffers that the collectives reuse from call to call, by name: the steady state of a
training loop (the same collectives on the same sizes every step) allocates nothing big."""

from __future__ import annotations

import torch


class HostBuffers:
    """Buffers by name, each grown to the largest size asked of it; ``get`` gives a tensor of it and its bytes."""

    def __init__(self) -> None:
        self._raw: dict[str, bytearray] = {}

    def get(self, name: str, numel: int, dtype: torch.dtype) -> tuple[torch.Tensor, memoryview]:
        if torch.is_inference_mode_enabled():  # checked first: the context costs more than the rest of get
            # Never an inference tensor, though a collective called under torch.inference_mode()
            # asks for it: the ring's pool threads, outside that mode, add into it.
            with torch.inference_mode(False):
                return self.get(name, numel, dtype)
        nbytes = numel * dtype.itemsize
        raw = self._raw.get(name)
        if raw is None or len(raw) < nbytes:
            raw = self._raw[name] = bytearray(max(nbytes, 64))
        view = memoryview(raw)[:nbytes]
        tensor = torch.frombuffer(raw, dtype=dtype, count=numel) if numel else torch.empty(0, dtype=dtype, device="cpu")
        return tensor, view
