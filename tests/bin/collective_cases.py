"""Run collective cases from a JSON file and check each against an independent computation.

A case with ``shared`` puts its input in ``macfleet.host_tensor`` memory (reduced in place
where the ranks share memory); one with ``leaf`` (floats) makes it a tensor that requires grad,
as a parameter is (``dist.broadcast(p, 0)`` works on one, and so must ours); one with
``inference`` makes it (or allocates the shared tensor) under ``torch.inference_mode()``, as
evaluation metrics are, and calls the collective outside that mode (``made``) or inside it
(``inside``); one with ``column`` passes the middle column of a ``[numel, 3]`` tensor (a
strided view, whose neighbours must stay untouched); one with ``sparse``
(an all-reduce) keeps about a tenth of each rank's entries, at places of its own, and reduces
them as a sparse COO tensor, as an embedding's gradient is. A case with
``compression`` (an all-reduce of floats) takes random normal inputs, which half precision
cannot hold exactly: its result must be within a bound of the exact one and bit-identical on
every rank. Every rank can rebuild every rank's input from the case seed, so the expected
result is computed here in float64/int64 with plain torch, not with macfleet. Writes
``OUT/rank-R.json`` with the failures found (an empty list when all cases are exact).
"""

import json
import os
import sys

import torch

import macfleet

DTYPES = {name: getattr(torch, name) for name in
          ("float32", "float16", "bfloat16", "float64", "int8", "uint8", "int16", "int32", "int64", "bool",
           "complex64")}
TOLERANCE = {torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float32: 1e-6, torch.float64: 1e-12,
             torch.complex64: 1e-6}


WIRE_EPS = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8}  # unit roundoff of the wire dtype


def make_input(case, rank):
    g = torch.Generator().manual_seed(case["seed"] * 1000 + rank)
    if case.get("sparse"):  # the same numbers, most of them zero: a rank touches a few rows
        kept = torch.rand(case["numel"], generator=torch.Generator().manual_seed(case["seed"] * 1000 + rank + 500))
        return torch.where(kept < 0.1, make_input({**case, "sparse": False}, rank), 0)
    if case.get("compression"):
        return torch.randn(case["numel"], generator=g).to(DTYPES[case["dtype"]])
    if case["dtype"] == "bool":
        return torch.randint(0, 2, (case["numel"],), generator=g).bool()
    low = 0 if case["dtype"] == "uint8" else -8
    # small integers: exactly representable in every dtype, and so are their sums over 8 ranks
    parts = torch.randint(low, 9, (2 if case["dtype"] == "complex64" else 1, case["numel"]), generator=g)
    if case["dtype"] == "complex64":
        return torch.complex(parts[0].float(), parts[1].float())
    return parts[0].to(DTYPES[case["dtype"]])


def widen(t):
    """``t`` in a dtype that holds every exact result: float64, int64 or complex128."""
    if t.is_complex():
        return t.to(torch.complex128)
    return t.double() if t.dtype.is_floating_point else t.long()


def expected(case, world):
    inputs = torch.stack([make_input(case, r) for r in range(world)]) if case["numel"] else None
    dtype = DTYPES[case["dtype"]]
    if case["numel"] == 0:
        return torch.empty(0, dtype=dtype) if case["kind"] != "all_gather" else torch.empty(world, 0, dtype=dtype)
    wide = widen(inputs)
    kind = case["kind"]
    if kind == "broadcast":
        return inputs[case["src"]]
    if kind == "all_gather":
        return inputs
    op = case["op"]
    if op == "sum":  # of bools: nonzero is True, a logical or (as torch.distributed's)
        return wide.sum(0).to(dtype)
    if op == "avg":
        return (wide.sum(0) / world).to(dtype)
    return (wide.amax(0) if op == "max" else wide.amin(0)).to(dtype)


def run(case, rank, world):
    t = make_input(case, rank)
    with torch.inference_mode(case.get("inference") is not None):
        if case.get("shared"):  # every rank allocates it, in the same order: a collective
            t = macfleet.host_tensor(t.numel(), t.dtype).copy_(t)
        elif case.get("inference"):
            t = t.clone()
    if case.get("leaf") and t.dtype.is_floating_point:
        t.requires_grad_()
    if case.get("sparse"):
        t = t.view(-1, 7).to_sparse(1) if case["numel"] % 7 == 0 else t.to_sparse()  # rows of 7, or single numbers
    base = None
    if case.get("column"):  # the middle column of [numel, 3]: strided, and its neighbours must stay as they are
        base = torch.full((t.numel(), 3), 7, dtype=t.dtype)
        base[:, 1] = t
        t = base[:, 1]
    with torch.inference_mode(case.get("inference") == "inside"):
        problem = check_compressed(case, t, world) if case.get("compression") else check(case, t, world)
    if problem is None and base is not None and not torch.equal(base[:, 0::2], torch.full_like(base[:, 0::2], 7)):
        problem = "the collective wrote outside the column it was given"
    return problem


def check(case, t, world):
    if case["kind"] == "all_reduce":
        got = macfleet.all_reduce(t, case["op"])
    elif case["kind"] == "broadcast":
        got = macfleet.broadcast(t, case["src"])
    else:
        got = macfleet.all_gather(t)
    want = expected(case, world)
    if case.get("sparse"):
        if not got.is_sparse:
            return "a sparse all-reduce returned a dense tensor"
        got = got.to_dense().view(-1)
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"shape/dtype {tuple(got.shape)}/{got.dtype} != {tuple(want.shape)}/{want.dtype}"
    if case.get("op") == "avg" and case["kind"] == "all_reduce":
        ok = torch.allclose(widen(got), widen(want), rtol=TOLERANCE[want.dtype], atol=TOLERANCE[want.dtype])
    else:
        ok = torch.equal(got, want)
    if not ok:
        bad = (widen(got) != widen(want)).nonzero()[:5].flatten().tolist()
        return f"values differ at {bad}: got {got.flatten()[bad].tolist()} want {want.flatten()[bad].tolist()}"
    return None


def check_compressed(case, t, world):
    got = macfleet.all_reduce(t, case["op"], compression=case["compression"])
    everyone = macfleet.all_gather(got)
    if not all(torch.equal(everyone[0], everyone[r]) for r in range(world)):
        worst = max((everyone[0].double() - everyone[r].double()).abs().max().item() for r in range(world))
        return f"ranks got different results (by up to {worst:.3g})"
    inputs = torch.stack([make_input(case, r).double() for r in range(world)])
    want = {"sum": inputs.sum(0), "avg": inputs.mean(0), "max": inputs.amax(0), "min": inputs.amin(0)}[case["op"]]
    if not t.numel():
        return None if got.shape == t.shape else f"shape {tuple(got.shape)} != {tuple(t.shape)}"
    # each of the world-1 hops rounds a partial result of magnitude at most sum(|x|) to the wire
    # dtype; then the result is rounded to the tensor's own dtype (a bfloat16 tensor sent as fp16)
    bound = 2 * world * WIRE_EPS[case["compression"]] * inputs.abs().sum(0).max().item() + \
        torch.finfo(t.dtype).eps * want.abs().max().item()
    err = (got.double() - want).abs().max().item()
    return None if err <= bound else f"error {err:.3g} above the bound {bound:.3g}"


def main():
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    out_dir = sys.argv[2]
    with torch.inference_mode(os.environ.get("CASES_INIT_INFERENCE") == "1"):  # a script that starts so
        macfleet.init()
    rank, world = macfleet.rank(), macfleet.world_size()
    failures = []
    for case in cases:
        problem = run(case, rank, world)
        if problem:
            failures.append({"case": case, "problem": problem})
    macfleet.barrier()
    with open(os.path.join(out_dir, f"rank-{rank}.json"), "w") as f:
        json.dump({"rank": rank, "world": world, "cases": len(cases), "failures": failures}, f)
    print(f"rank {rank}: {len(cases) - len(failures)}/{len(cases)} cases exact")
    macfleet.shutdown()


if __name__ == "__main__":
    main()
