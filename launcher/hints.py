"""What to do, said under a failed job's report: the causes the launcher recognises in a
rank's exit, its error or the collectives its ranks made, each with its way out. torch's own
message names none of these (a SIGKILL has none at all), and most come of a habit from
elsewhere: a DDP or Horovod script moved to Macs, a CUDA call kept, a checkpoint saved on rank
0 alone."""

from __future__ import annotations

import re

from macfleet.protocol import FAILED_HERE, STOOD_BY, WorkerExit


def after_exit(exit_: WorkerExit) -> list[str]:
    """What the way a rank ended says."""
    return _killed_from_outside(exit_)


def after_error(error: dict, host: str) -> list[str]:
    """What the exception a rank raised (its error file, on ``host``) says."""
    return (_missing_module_hint(error, host) + _device_memory_hint(error, host) + _process_group_hint(error)
            + _no_cuda_hint(error, host) + _gloo_on_mps_hint(error) + _float64_on_mps_hint(error) + _timeout_hint(error)
            + _rendezvous_hint(error))


def after_parting(exits: dict[int, WorkerExit], in_different_collectives: bool) -> list[str]:
    """What the collectives where the ranks parted say."""
    return (_join_hint(exits) if in_different_collectives else []) + _checkpoint_hint(exits)


def _killed_from_outside(exit_: WorkerExit) -> list[str]:
    """A SIGKILL that macfleet did not send. Nothing in the rank can say why it came (no
    traceback, no error file), and the most common sender is the system, out of memory: Linux's
    OOM killer, or macOS under memory pressure. Say so, with how much memory the rank held."""
    if exit_.signal != "SIGKILL" or exit_.stopped:
        return []
    held = ""
    if exit_.peak_rss:
        held = f" At its peak this rank held {_gib(exit_.peak_rss)} of memory"
        held += f", of the {_gib(exit_.host_memory)} that {exit_.host} has." if exit_.host_memory else "."
    return [f"  Nothing in macfleet sent that SIGKILL: most often the system sends it when memory runs out (Linux's "
            f"OOM killer, which dmesg names; macOS under memory pressure).{held} A smaller batch or model, or "
            f"fewer ranks on {exit_.host}, needs less."]


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.1f} GiB"


def _missing_module_hint(error: dict, host: str) -> list[str]:
    """A package the script imports that is missing where the rank ran: on a fleet of Macs, most
    often one Mac that lacks what the others have (torch itself, where --python names another
    Python), or a module of the script's own that is not in that Mac's copy of its folder."""
    module = str(error.get("module") or "")
    if error.get("type") != "ModuleNotFoundError" or not module or "." in module:
        return []  # a missing submodule of a package that is there is another story
    python = error.get("executable") or "the ranks' Python"
    if module == "horovod":  # a Horovod script run as it is: macfleet has each of its calls
        return [f"  horovod is not installed for {python} on {host}, and a Horovod script needs it only for its hvd "
                f"calls: macfleet has one for each (hvd.init() is macfleet.init(), hvd.DistributedOptimizer is "
                f"macfleet.DataParallel around the model...: the README's Horovod table)"]
    return [f"  {module} is not installed for {python} on {host}: install it there (every host needs the script's "
            f"packages; a module of the script's own must be in its folder there too), or name the Python that has "
            f"it (--python, or python=PATH on its hostfile line; macfleet doctor checks torch and macfleet on every "
            f"host)"]


def _device_memory_hint(error: dict, host: str) -> list[str]:
    """A rank out of GPU memory whose GPU other ranks share: macfleet capped it at its share
    (``MACFLEET_MEMORY_FRACTION``), which torch's message does not say, and on a Mac torch's
    advice (``PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0``) cannot lift that cap, which the rank sets
    again at init (a lower one of the user's own stands: ``env.mps_cap``)."""
    fraction = error.get("memory_fraction")
    out_of_memory = error.get("type") == "OutOfMemoryError" or "MPS backend out of memory" in str(error.get("message"))
    if not out_of_memory or not fraction:
        return []  # a GPU of its own: torch's message says all there is
    return [f"  this rank may use {fraction} of its GPU's memory: the ranks that share a GPU split 0.9 of it evenly, "
            f"unless --memory-fraction gives each its share (a PYTORCH_MPS_HIGH_WATERMARK_RATIO of your own may "
            f"lower it, not raise it). A smaller batch or model, fewer ranks on {host}, or a larger "
            f"--memory-fraction gives it room (the shares of one GPU's ranks should add up to 1 at most: on a Mac "
            f"its memory is the machine's)"]


def _process_group_hint(error: dict) -> list[str]:
    """A script half moved from torch DDP: ``macfleet.init()`` in place of
    ``init_process_group``, and a torch.distributed call left (torch's DistributedSampler, most
    often), which finds no process group. torch's message says to call init_process_group."""
    if "Default process group has not been initialized" not in str(error.get("message")):
        return []
    where = str(error.get("traceback")).replace("\\", "/")
    if "torch/utils/data/distributed.py" in where:
        return ["  torch's DistributedSampler asks torch.distributed for the ranks, which macfleet.init() does not set "
                "up: use macfleet.DistributedSampler, which takes the same options and gives each rank the same "
                "samples as torch's"]
    if "torch/nn/parallel/distributed.py" in where:
        return ["  torch's DistributedDataParallel needs torch.distributed, which macfleet.init() does not set up: "
                "use macfleet.DataParallel(model), which takes DDP's options"]
    called = re.search(r'distributed_c10d\.py", line \d+, in (\w+)', where)  # the outermost: the script's call
    name = called.group(1) if called else ""
    calls = (f"in place of dist.{name}(...), {IN_PLACE_OF[name]} (the README's table has the others)"
             if name in IN_PLACE_OF else "use macfleet's calls in its place (macfleet.rank(), macfleet.world_size(), "
             "macfleet.all_reduce(t), macfleet.barrier(): the README's table has each)")
    return [f"  macfleet.init() does not set up torch.distributed: {calls}, or keep the script's own "
            f"dist.init_process_group(\"gloo\"), which works under macfleet launch as under torchrun"]


# torch.distributed's calls that macfleet has, some in another form (a call that gives one rank
# the result, such as an evaluation's reduce or gather to rank 0, is one that gives it to all).
IN_PLACE_OF = {
    "get_rank": "macfleet.rank()",
    "get_world_size": "macfleet.world_size()",
    "all_reduce": "macfleet.all_reduce(t, op), op one of \"sum\", \"avg\", \"max\", \"min\"",
    "reduce": "macfleet.all_reduce(t) gives every rank the result, and the rank dst uses it",
    "broadcast": "macfleet.broadcast(t, src)",
    "all_gather": "out = macfleet.all_gather(t), rank r's in out[r]",
    "all_gather_into_tensor": "macfleet.all_gather(t).flatten(0, 1)",
    "gather": "out = macfleet.all_gather(t) gives every rank rank r's in out[r], and the rank dst uses them",
    "barrier": "macfleet.barrier()",
    "monitored_barrier": "macfleet.barrier(), where the launcher names a rank that does not come",
    "broadcast_object_list": "obj = macfleet.broadcast_object(obj, src), one object a call",
    "all_gather_object": "out = macfleet.all_gather_object(obj)",
    "gather_object": "out = macfleet.all_gather_object(obj) gives every rank them, and the rank dst uses them",
    "destroy_process_group": "macfleet.shutdown()",
}


def _timeout_hint(error: dict) -> list[str]:
    """A collective that waited out its timeout. A stuck rank is aborted by the stall check long
    before (two minutes), so what remains is most often a rank that worked on for longer than
    the timeout while the others waited: rank 0 downloading or preparing the data before a
    barrier, which torch's gloo lets run for 30 minutes. The error names neither the timeout's
    setting nor that it can be raised."""
    if error.get("type") != "CollectiveTimeout":
        return []
    return ["  A rank waits for the others in a collective for at most the collective timeout (MACFLEET_TIMEOUT, "
            "600 s unless set, or macfleet.init(timeout_s=...)), as torch's init_process_group(timeout=...). If the "
            "rank it waited for was working on something long of its own (rank 0 downloading or preparing the data "
            "while the others wait at a barrier), give the timeout above that work's length: macfleet launch --env "
            "MACFLEET_TIMEOUT=3600 ..."]


def _rendezvous_hint(error: dict) -> list[str]:
    """Ranks that waited in ``macfleet.init()`` for one that never got there: the launcher
    named it, and where it was, once a stall timeout before. A rank that does long work before
    its init (rank 0 downloading the data first) is the common case."""
    if error.get("type") != "RendezvousError" or "not every rank registered" not in str(error.get("message")):
        return []
    return ["  macfleet.init() waits for every rank for at most the rendezvous timeout (MACFLEET_RENDEZVOUS_TIMEOUT, "
            "600 s unless set). If a rank does long work before it (downloading the data), give the timeout above "
            "that work's length: macfleet launch --env MACFLEET_RENDEZVOUS_TIMEOUT=3600 ... (work after "
            "macfleet.init(), while the others wait at a barrier, is bounded by MACFLEET_TIMEOUT instead)"]


# What torch raises for a CUDA call where there is no CUDA: a Mac's torch (or a CPU build), and
# a CUDA build on a machine without NVIDIA's driver.
NO_CUDA = ("Torch not compiled with CUDA enabled", "module 'torch._C' has no attribute '_cuda_",
           "Found no NVIDIA driver")
# ... and for NCCL: a torch without it (a Mac's), and a CUDA build on a machine without GPUs (in
# ProcessGroupNCCL up to torch 2.14; from 2.15 init_process_group says it first, in _nccl2_device).
NO_NCCL = ("doesn't have NCCL built in", "ProcessGroupNCCL is only supported with GPUs",
           "nccl2 requires at least one CUDA device")


def _no_cuda_hint(error: dict, host: str) -> list[str]:
    """A CUDA script moved to Macs that kept its ``.cuda()``, ``device="cuda"`` or
    ``torch.cuda.set_device(local_rank)``, or its DDP on NCCL: a Mac has no CUDA, and torch's
    message does not say what to write instead."""
    message = str(error.get("message"))
    if any(said in message for said in NO_NCCL):
        return [f"  NCCL needs NVIDIA GPUs, which {host} does not have: a DDP script runs under macfleet launch with "
                f"init_process_group(\"gloo\"), its tensors on the CPU, or trains on the Mac's GPU with "
                f"macfleet.init() and macfleet.DataParallel (the README's table)"]
    if not any(said in message for said in NO_CUDA):
        return []
    return [f"  {host} has no CUDA (a Mac's GPU is mps): put the model and tensors on macfleet.device(), the GPU this "
            f"rank drives (mps, cuda or cpu, whichever its host has), in place of .cuda(), device=\"cuda\" and "
            f"torch.cuda.set_device(local_rank)"]


# What torch raises for a Mac's GPU tensor given to torch.distributed, which has no backend for
# mps: gloo's check of a tensor's device (torch 2.4's DDP on mps: "ProcessGroupGloo::allgather:
# invalid tensor type at index 0 (expected ... device=cpu ..., got ... device=mps:0 ..."), or
# c10d's lookup of a backend for the device, where init_process_group("gloo") registered cpu and
# cuda only; and init_process_group() without a backend on a Mac, in the torch releases before
# mps was mapped to gloo (torch issue 149537, on torch 2.6).
GLOO_ON_MPS = (re.compile(r"ProcessGroupGloo::\w+: .*(device=mps|device type mps)"),
               re.compile(r"No backend type associated with device type mps\b"),
               re.compile(r"We detected accelerator mps on your machine"))


def _gloo_on_mps_hint(error: dict) -> list[str]:
    """A DDP script moved to Macs that kept torch.distributed and put its model on the Mac's
    GPU: the first thing most try, and torch's message names gloo's tensor types, not what runs
    on mps instead."""
    message = str(error.get("message"))
    if not any(pattern.search(message) for pattern in GLOO_ON_MPS):
        return []
    return ["  torch.distributed has no backend for a Mac's GPU (gloo takes CPU tensors only): train on mps with "
            "macfleet.init() and macfleet.DataParallel(model), which takes DDP's options (the README's table has "
            "each call), or keep DDP on init_process_group(\"gloo\") with the model and tensors on the CPU"]


# torch's words for a float64 tensor on a Mac's GPU (mps-facts.md section 4): Metal has no float64.
NO_FLOAT64 = "MPS framework doesn't support float64"


def _float64_on_mps_hint(error: dict) -> list[str]:
    """A float64 tensor met a Mac's GPU. torch says to use float32, but not where the float64
    came from, and on a Mac it most often came from one of two places: NumPy, whose arrays are
    float64 by default (``torch.from_numpy(a).to("mps")``), or, with torch before MPS had its
    kernels (torch pull request 150255), a GradScaler, whose ``unscale_`` computed in float64
    (torch issue 142397)."""
    if NO_FLOAT64 not in str(error.get("message")):
        return []
    if "grad_scaler.py" in str(error.get("traceback")):
        return ["  this torch's GradScaler keeps its scale in float64, which a Mac's GPU does not have: train with "
                "torch.autocast(\"mps\", dtype=torch.bfloat16) and no GradScaler (bf16 needs no loss scaling; the "
                "MNIST example's --amp does so), or install a newer torch, whose GradScaler runs on mps"]
    return ["  a Mac's GPU has no float64: make the tensor float32 on the CPU before it moves to mps. NumPy's arrays "
            "are float64 unless made otherwise (torch.from_numpy(a).float().to(macfleet.device())), as is a tensor "
            "made with dtype=torch.float64 or by .double()"]


def _join_hint(exits: dict[int, WorkerExit]) -> list[str]:
    """What it means when a rank failed while it stood by inside ``join()``: it had run out of
    batches and shadows only DataParallel's collectives, and the others made one of their own."""
    if not any(STOOD_BY in collectives_of(e) for e in exits.values()):
        return []
    return ["a rank that has run out of batches inside model.join() takes part only in DataParallel's own collectives "
            "(its round, the buffers, the gradients): make the script's other collectives (a metric, a checkpoint) "
            "after the join() block, or give every rank the same number of batches"]


def _checkpoint_hint(exits: dict[int, WorkerExit]) -> list[str]:
    """Ranks that parted at a checkpoint some of them made and the others did not (they were
    in another collective, or had finished): a DDP script guards its ``torch.save`` with ``if
    rank == 0``, and kept in front of macfleet's ``checkpoint.save``, a collective, that guard
    leaves the other ranks out of it."""
    failed_in = {rank: line.split(FAILED_HERE)[0] for rank, e in exits.items()
                 for line in collectives_of(e).splitlines() if FAILED_HERE in line}
    at_checkpoint = {rank for rank, line in failed_in.items() if line.endswith(CHECKPOINT_CALLERS)}
    elsewhere = {rank for rank, e in exits.items() if rank not in at_checkpoint and (rank in failed_in or e.code == 0)}
    if not (at_checkpoint and elsewhere):
        return []
    return ["checkpoint.save and checkpoint.load are collectives: every rank calls them, and rank 0 alone writes "
            "or reads the file (where a DDP script saves under `if rank == 0:`, call macfleet.checkpoint.save on "
            "every rank)"]


CHECKPOINT_CALLERS = ("from checkpoint.save", "from checkpoint.load")


def collectives_of(e: WorkerExit) -> str:
    """The rank's last collectives, as its error report gave them ("" if it gave none)."""
    return str((e.error or {}).get("collectives") or "")
