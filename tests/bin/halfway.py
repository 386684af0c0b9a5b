"""Rank 0 leaves a broadcast it is the source of by an exception that it catches: a device
error while its tensor is staged (raised here by a tensor subclass). Rank 1 waits in that
broadcast for good. Then, by MODE, rank 0 calls another collective, catches what it raises and
works on (``went-on``), works on with no collective (``works-on``), or ends its script well
(``finished``)."""

import sys
import time

import macfleet
import torch


class FailsToStage(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.Tensor.reshape:
            raise RuntimeError("the device lost this tensor while it was staged")
        return super().__torch_function__(func, types, args, kwargs or {})


mode = sys.argv[1]
macfleet.init(device="cpu")
tensor = torch.ones(4)
if macfleet.rank() == 0:
    tensor = tensor.as_subclass(FailsToStage)
try:
    macfleet.broadcast(tensor, 0)
except RuntimeError as exc:
    print(f"caught {type(exc).__name__}: {exc}", flush=True)
if mode == "went-on":
    try:
        macfleet.all_reduce(torch.ones(2))
    except macfleet.ProtocolError as exc:
        print(f"refused: {exc}", flush=True)
    time.sleep(60)  # working on with no collective: the launcher stops it, or the test times out
if mode == "works-on":
    end = time.monotonic() + 60
    while time.monotonic() < end:  # using the processor, as a rank that validates alone does
        sum(range(10_000))
print("finished", flush=True)
