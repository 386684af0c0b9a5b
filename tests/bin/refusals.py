"""Collectives called with arguments they refuse, one line each: ``CASE: ErrorClass: message``
or ``CASE: returned``. Run alone (a job of one) and under the launcher, the lines must agree."""

import warnings

import macfleet
import torch
import torch.distributed as dist

warnings.filterwarnings("ignore", "The PyTorch API of nested tensors is in prototype stage")

macfleet.init(device="cpu")
CASES = {
    "sparse": lambda: macfleet.broadcast(torch.eye(3).to_sparse(), 0),
    "sparse-max": lambda: macfleet.all_reduce(torch.eye(3).to_sparse(), op="max"),
    "sparse-csr": lambda: macfleet.all_gather(torch.eye(3).to_sparse_csr()),
    "meta": lambda: macfleet.broadcast(torch.empty(3, device="meta"), 0),
    "op": lambda: macfleet.all_reduce(torch.ones(3), op="prod"),
    "torch-op": lambda: macfleet.all_reduce(torch.ones(3), op=dist.ReduceOp.SUM),  # a ported dist.all_reduce line
    "avg-of-ints": lambda: macfleet.all_reduce(torch.ones(3, dtype=torch.int64), op="avg"),
    "avg-of-bools": lambda: macfleet.all_reduce(torch.ones(3, dtype=torch.bool), op="avg"),
    "max-of-complex": lambda: macfleet.all_reduce(torch.ones(3, dtype=torch.complex64), op="max"),
    "dtype": lambda: macfleet.all_reduce(torch.ones(3).to(torch.float8_e4m3fn)),
    "compression": lambda: macfleet.all_reduce(torch.ones(3), compression="zip"),
    "not-a-tensor": lambda: macfleet.all_gather([1.0, 2.0]),
    "src": lambda: macfleet.broadcast(torch.ones(3), src=-1),
    "src-float": lambda: macfleet.broadcast(torch.ones(3), src=1.0),
    "nested": lambda: macfleet.all_reduce(torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])),
    "expanded": lambda: macfleet.all_reduce(torch.ones(1).expand(4)),
    "expanded-broadcast": lambda: macfleet.broadcast(torch.zeros(3, 1).expand(3, 4), 0),
    # last: a job of one ran a collective after shutdown (and so a script refused under the launcher)
    "after-shutdown": lambda: (macfleet.shutdown(), macfleet.all_reduce(torch.ones(3))),
}
for case, call in CASES.items():
    try:
        call()
        print(f"{case}: returned", flush=True)
    except Exception as exc:
        print(f"{case}: {type(exc).__name__}: {exc}", flush=True)
print(f"all {len(CASES)} done", flush=True)
