"""What a collective's arguments must be: checked before anything is sent, by every rank, and
alike in a job of one (plain ``python train.py``), so that a script refused under the launcher
is refused without it too. An argument a collective cannot take is a ``ConfigError`` naming it
and the way out, never an error from deep inside a collective that the other ranks wait in."""

from __future__ import annotations

import operator

import torch

from macfleet.backends import check_tensor
from macfleet.errors import ConfigError

REDUCE_OPS = ("sum", "avg", "max", "min")
SUPPORTED = frozenset({
    torch.float32, torch.float16, torch.bfloat16, torch.float64,
    torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64,
})
# Wire compression: what crosses the network; the reduction stays in the working dtype.
WIRE_DTYPES: dict[str, torch.dtype | None] = {"none": None, "fp16": torch.float16, "bf16": torch.bfloat16}


def check_all_reduce(tensor: torch.Tensor, op: str, name: str, compression: str) -> None:
    if isinstance(tensor, torch.Tensor) and tensor.layout == torch.sparse_coo:
        numbers = _sparse_numbers_to_check(tensor, op, name, compression)
    else:
        numbers, op = _numbers_to_check(tensor, name, op)
        _check_writable(tensor, name, "all_reduce")
    if compression not in WIRE_DTYPES:
        raise ConfigError(f"compression {compression!r}: choose one of {', '.join(WIRE_DTYPES)}")
    if op not in REDUCE_OPS:
        # torch.distributed's ReduceOp.SUM, as a ported dist.all_reduce line passes it
        ours = str(getattr(op, "name", "")).lower()
        if ours in REDUCE_OPS:
            raise ConfigError(f"all_reduce op {op!r} is torch.distributed's: give {ours!r} (macfleet's ops are "
                              f"{', '.join(REDUCE_OPS)})")
        raise ConfigError(f"all_reduce op {op!r}: choose one of {', '.join(REDUCE_OPS)}")
    if op == "avg" and not numbers.dtype.is_floating_point:
        raise ConfigError(f"all_reduce op 'avg' needs a floating-point tensor; {name} is {tensor.dtype}")


def check_broadcast(tensor: torch.Tensor, src: int, world: int, name: str) -> int:
    """``src`` as the int it names (numpy's integers and 0-d integer tensors are taken too)."""
    _numbers_to_check(tensor, name)
    _check_writable(tensor, name, "broadcast")  # on the source too: every rank is refused alike
    try:
        index = None if isinstance(src, bool) else operator.index(src)
    except TypeError:  # 1.0 failed inside, at a shift of the source's bits
        index = None
    if index is None:
        raise ConfigError(f"broadcast src={src!r} must be a rank's number, an int")
    src = index
    if not 0 <= src < world:
        raise ConfigError(f"broadcast src={src} is not a rank of this job (world size {world})")
    return src


def check_all_gather(tensor: torch.Tensor, name: str) -> None:
    _numbers_to_check(tensor, name)


def _numbers_to_check(tensor: object, name: str, op: str = "sum") -> tuple[torch.Tensor, str]:
    """The numbers a collective would move for ``tensor`` (a bool or complex tensor's are a view
    of another dtype) and the op it would reduce them with, once ``tensor`` has been found a
    dense tensor that a collective takes."""
    if not isinstance(tensor, torch.Tensor):
        raise ConfigError(f"{name} must be a torch.Tensor, not {type(tensor).__name__}")
    if tensor.layout != torch.strided:  # torch's own error came from deep inside: "reshape is not implemented"
        raise ConfigError(f"{name} is a {tensor.layout} tensor, and macfleet collectives take dense ones (all_reduce "
                          f"a sparse COO one too): give {name}.to_dense()")
    if tensor.is_nested:  # its layout is torch.strided, and torch's error came from inside the collective
        raise ConfigError(f"{name} is a nested tensor, and macfleet collectives take dense ones: give "
                          f"{name}.to_padded_tensor(0), or each of {name}.unbind()")
    if tensor.device.type == "meta":
        raise ConfigError(f"{name} is on the meta device, which holds no data")
    check_tensor(tensor, name)
    numbers, op = as_numbers(tensor, name, op) if made_of_numbers(tensor) else (tensor, op)
    if numbers.dtype not in SUPPORTED:
        raise ConfigError(f"{name} has dtype {tensor.dtype}, which macfleet collectives do not support")
    return numbers, op


def _sparse_numbers_to_check(tensor: torch.Tensor, op: str, name: str, compression: str) -> torch.Tensor:
    """A sparse COO tensor's values, once found a sparse tensor that all_reduce sums (or
    averages), as gloo reduces one: its entries are gathered whole, so there is nothing to
    compress, and a max of entries some ranks lack has no meaning torch.distributed gives it."""
    if op in REDUCE_OPS and op not in ("sum", "avg"):
        raise ConfigError(f"all_reduce op {op!r} of a sparse tensor: sparse tensors are summed or averaged "
                          f"(op 'sum' or 'avg'); give {name}.to_dense() for {op!r}")
    if compression in WIRE_DTYPES and compression != "none":
        raise ConfigError(f"compression {compression!r} of a sparse tensor: its entries are sent as they are "
                          f"(compression='none')")
    values = tensor._values()  # uncoalesced is fine: only its dtype and device are looked at
    if values.dtype == torch.bool or values.is_complex():
        raise ConfigError(f"{name} is a sparse tensor of {tensor.dtype}, which macfleet collectives do not sum; "
                          f"sparse tensors of floats and integers are summed")
    return _numbers_to_check(values, name)[0]  # the device and dtype checks of a dense one


def _check_writable(tensor: torch.Tensor, name: str, collective: str) -> None:
    """all_reduce and broadcast write their result into the tensor. An expanded view (a stride of
    0) has several elements in one memory location and cannot hold it: torch refused the write
    from inside the collective, once the others were waiting in it."""
    strides = tensor.stride()
    if 0 in strides and any(stride == 0 and size > 1 for stride, size in zip(strides, tensor.shape, strict=True)):
        raise ConfigError(f"{name} is an expanded view (several of its elements are one memory location), and "
                          f"{collective} writes its result into it: give {name}.clone()")


def made_of_numbers(tensor: object) -> bool:
    """A bool or complex tensor, which the collectives take as the numbers it is made of."""
    return isinstance(tensor, torch.Tensor) and (tensor.dtype == torch.bool or tensor.is_complex())


def as_numbers(tensor: torch.Tensor, name: str, op: str = "sum") -> tuple[torch.Tensor, str]:
    """A bool or complex tensor as a view of the numbers it is made of, and the op to reduce
    them with, as torch.distributed takes them: a bool's sum or max is a logical or (as NCCL
    maps it), its min an and; a complex number's sum is its parts' sums."""
    if tensor.dtype == torch.bool:
        if op == "avg":
            raise ConfigError(f"all_reduce op 'avg' needs a floating-point tensor; {name} is {tensor.dtype}")
        return tensor.view(torch.uint8), "max" if op == "sum" else op
    if op in ("max", "min"):
        raise ConfigError(f"all_reduce op {op!r}: complex numbers have no order; {name} is {tensor.dtype}")
    if tensor.is_conj():  # a lazily conjugated view has no real view of its own
        raise ConfigError(f"{name} is a conjugated view: give tensor.resolve_conj()")
    return torch.view_as_real(tensor), op
