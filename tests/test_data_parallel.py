"""DataParallel with buckets, overlap, accumulation, unused parameters and compression, each
against the oracle: one process training on the whole batch."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest
import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel

import macfleet
from conftest import BIN, Job, run_launch

sys.path.insert(0, str(BIN))
import copies  # noqa: E402
import dp_cases  # noqa: E402
import join_cases  # noqa: E402
import oracle  # noqa: E402
import sync_bn  # noqa: E402

# Compressed modes round every partial sum to 16 bits on the wire; after six SGD steps the
# parameters stay within these absolute tolerances of the float32 oracle.
TOLERANCE = {"fp16": 2e-3, "bf16": 2e-2}


def reference(case: str) -> dict[str, torch.Tensor]:
    model = dp_cases.make(case)
    opt = dp_cases.make_optimizer(case, model)
    x, y = oracle.make_batch()
    for step in range(dp_cases.STEPS):
        if dp_cases.change(case, model, step, rank=0):
            opt = dp_cases.make_optimizer(case, model)
        opt.zero_grad()
        dp_cases.loss(case, model, x, y).backward()
        opt.step()
    return model.state_dict()


# The cases run in three jobs, by the environment they need, each case with a model and a
# DataParallel of its own: one start of 3 ranks per job rather than one per case (about 2.5 s
# of a 2-core machine each).
JOBS = {
    # compression casts what crosses the network; ranks of one host share float32 memory
    "ring": ({"MACFLEET_SHM": "0"}, ["fp16", "bf16"]),
    # buckets in POSIX shared-memory objects, as on macOS, reduced where they are (small ones
    # otherwise take the one-barrier path through the slots, as in the default job)
    "shm-objects": ({"MACFLEET_SHM_OBJECTS": "1", "MACFLEET_SHM_GATHER_BYTES": "1"}, ["buckets", "fine-tune"]),
    # with the timeline on (launch --timeline), which every case must leave as it is
    "default": ({"MACFLEET_LAUNCH_TIMELINE": "{out}/timeline.json"}, ["single", "wide", "order", "no_sync", "unused-allowed", "zero-in-place", "two-models",
                     "two-models-one-bucket", "sparse", "shares", "rewrap", "compiled", "sync-bn", "checkpoint",
                     "input-gradient", "two-forwards", "in-backward", "copied", "ddp-options", "buffers",
                     "validate-alone", "local-buffers", "forward-sync-off", "shared-checkpoints", "grad-penalty", "empty-parameter",
                     "channels-last"]),
}
CHECKED_IN_THE_JOB = dp_cases.NORM_CASES  # they compare the ranks' buffers themselves


def jobs_by_environment(tmp_path_factory, script: str, jobs: dict) -> Callable[[str], tuple[Job, Path]]:
    """The job of ``script`` that ran ``case``, and the directory it saved to: one job for the
    cases of each environment in ``jobs`` (name -> (environment, cases); ``{out}`` in a value is
    that directory), started when a test first needs it."""
    done: dict[str, tuple[Job, Path]] = {}

    def job_of(case: str) -> tuple[Job, Path]:
        name = next(name for name, (_, cases) in jobs.items() if case in cases)
        if name not in done:
            env, cases = jobs[name]
            out = tmp_path_factory.mktemp(f"{script}-{name}")
            env = {key: value.format(out=out) for key, value in env.items()}
            done[name] = run_launch("--nproc", "3", str(BIN / script), ",".join(cases), str(out), env=env,
                                    timeout=300), out
        return done[name]

    return job_of


@pytest.fixture(scope="module")
def dp_job(tmp_path_factory) -> Callable[[str], tuple[Job, Path]]:
    return jobs_by_environment(tmp_path_factory, "dp_cases.py", JOBS)


def test_the_timeline_of_every_case_is_whole(dp_job) -> None:
    """The default job's timeline: each rank's training steps (forward, and the wait at the end
    of each backward that averaged) in all those cases, compiled and checkpointed ones included."""
    job, out = dp_job("single")
    assert job.code == 0, job.output
    events = json.loads((out / "timeline.json").read_text())
    for rank in range(3):
        mine = [e["name"] for e in events if e.get("pid") == rank]
        assert mine.count("forward") > 10 and mine.count("waiting for gradients") > 10, mine
        assert any(name.startswith("all_reduce gradient bucket") for name in mine)


@pytest.mark.parametrize("case", [c for _, cases in JOBS.values() for c in cases if c not in CHECKED_IN_THE_JOB])
def test_data_parallel_matches_the_whole_batch(dp_job, case: str) -> None:
    job, out = dp_job(case)
    assert job.code == 0, job.output
    assert "Dynamo" not in job.output, job.output  # compiled: DataParallel's bookkeeping is left untraced
    # channels_last: the gradients' views are in their parameters' layout, as autograd's own
    assert "gradient layout contract" not in job.output, job.output
    got, want = torch.load(out / f"{case}.pt"), reference(case)
    tolerance = TOLERANCE.get(case, 1e-5)
    for name, value in want.items():
        assert torch.allclose(got[name], value, atol=tolerance, rtol=0), (name, (got[name] - value).abs().max())
    if case in TOLERANCE:  # and compression does change something, so the bound means something.
        # Uncompressed, only the order of float32 sums differs from the oracle (under 1e-7 here);
        # the wire's half precision leaves fp16 1.8e-5 and bf16 1.6e-4 away.
        assert max((got[n] - want[n]).abs().max().item() for n in want) > 1e-6


def failed(case: str) -> tuple[Job, str]:
    """Run a dp case that must fail, on two ranks; the job and its report from the root cause on."""
    job = run_launch("--nproc", "2", str(BIN / "dp_cases.py"), case, "/dev/null", timeout=60)
    assert job.code != 0
    return job, job.stderr[job.stderr.index("root cause"):]


@pytest.mark.parametrize("case", ["unused", "unused-single"])
def test_a_parameter_without_gradient_is_named_not_a_hang(case: str) -> None:
    job, report = failed(case)
    assert "spare.weight" in report and "find_unused_parameters=True" in report
    assert job.seconds < 30


def test_a_gradient_that_comes_once_more_than_in_the_first_backward_is_an_error() -> None:
    """Its bucket was complete, and went to be averaged, before autograd added the extra
    gradient into it: the step is lost, and the error says so instead of training on it."""
    job, report = failed("shared-checkpoints-more")
    assert "'shared.weight' came 3 times in this backward, and 2 times" in report or \
        "'shared.bias' came 3 times in this backward, and 2 times" in report, report
    assert "use_reentrant=False" in report
    assert job.seconds < 30


def test_a_gradient_with_a_graph_of_its_own_is_an_error() -> None:
    """backward(create_graph=True): the ranks' gradients are averaged as values, so a second
    derivative through them would be each rank's own. An error that says what to do instead,
    not torch's in-place error from inside DataParallel's hook."""
    job, report = failed("create-graph")
    assert "backward(create_graph=True) gave '4.weight'" in report or \
        "backward(create_graph=True) gave '4.bias'" in report, report  # the last layer's, the first to come
    assert "ConfigError" in report and "torch.autograd.grad(loss" in report
    assert job.seconds < 30


@pytest.mark.parametrize("when", ["before", "after"])
def test_an_optimizer_step_in_a_gradient_hook_is_an_error(when: str) -> None:
    """A hook that steps with the gradient and drops it, registered before or after
    DataParallel's own: each rank would step with its own gradient, and the ranks part
    silently. The first backward says so."""
    job, report = failed(f"fused-optimizer-{when}")
    assert f"was taken away in backward by a hook that ran {when} DataParallel's" in report, report
    assert "Step the optimizer after loss.backward()" in report
    assert job.seconds < 30


def test_a_model_cast_after_wrapping_is_named_at_the_first_forward() -> None:
    job, report = failed("cast-after-wrap")
    assert "ConfigError" in report and "float64" in report and "before wrapping" in report, report
    # from the model's call, not from inside backward (the traceback ends at the script's last
    # frame, here torch's call of the module: not at autograd's)
    assert "in _call_impl" in report and "autograd" not in report, report
    assert job.seconds < 30


def test_a_lazy_module_is_named_when_wrapped() -> None:
    """Its parameters have no shape yet; torch's own error came from inside our broadcast."""
    _, report = failed("lazy")
    assert "ConfigError" in report and "'0.weight'" in report and "forward pass" in report, report


@pytest.mark.parametrize("shm", ["1", "0"])
def test_a_gan_s_discriminator_frozen_while_the_generator_trains_keeps_its_buckets(shm: str) -> None:
    """Frozen whole for the generator's step and thawed for its own, the discriminator was laid
    out anew twice a step (its parameters broadcast, new buckets made). Against the oracle: one
    process training copies of both on the whole batch."""
    job = run_launch("--nproc", "2", str(BIN / "freeze_thaw.py"), "5", env={"MACFLEET_SHM": shm}, timeout=90)
    assert job.code == 0, job.output
    said = [json.loads(line.split("] ", 1)[1]) for line in job.stdout.splitlines() if '"max_diff"' in line]
    assert sorted(r["rank"] for r in said) == [0, 1], job.output
    assert all(r["max_diff"] < 1e-5 and r["kept_buckets"] for r in said), said


def test_a_rank_with_fewer_batches_is_named_with_the_reason() -> None:
    """Rank 1 runs out of batches a step early (data split unevenly by hand): rank 0 waits for
    its gradients, and the report must say what that means in a training loop."""
    job, report = failed("uneven")
    report = report.split("other ranks")[0]
    assert "for rank 1 (localhost), which finished" in report and "fewer training steps" in report, report
    assert job.seconds < 20


def test_ranks_that_weight_their_gradients_differently_are_stopped() -> None:
    """Rank 1 is given other shares than rank 0: every average would be wrong."""
    _, report = failed("shares-differ")
    assert "rank 1" in report and "ConfigError" in report and "differ from rank 0's [1.0, 2.0]" in report, report


def test_ranks_that_change_their_models_differently_are_stopped() -> None:
    """Rank 1 alone unfreezes a layer and gives its model a new head: its buckets no longer
    match the others', which must be an error naming the change, not an average of unlike things."""
    job, report = failed("fine-tune-differs")
    assert "rank 1" in report and "DataParallel (parameters changed)" in report, report
    assert job.seconds < 30


def test_ranks_that_pass_different_options_are_told_which() -> None:
    """Rank 1 lays its gradient buckets out with another cap: the ranks met in collectives of
    different sizes ("rank 1 is in shared_tensor of 880 float32 ... while rank 0 is in
    shared_tensor of 528 float32"), an error that named no option."""
    _, report = failed("options-differ")
    assert "rank 1" in report and "ConfigError: this rank's DataParallel bucket_cap_mb=1.0 differs from rank 0's " \
                                  "bucket_cap_mb=0.0001: every rank must pass the same options" in report, report


def test_ranks_that_build_different_models_are_told_which_layer_differs() -> None:
    """The last rank's model has a class more (a class count read from a file that differs on its
    Mac). That was found as a broadcast of another size ("rank 2 is in broadcast of 948 float32
    ... while rank 0 is in broadcast of 931 float32"), which names no layer; DDP names it."""
    job, report = failed("model-differs")
    assert "ConfigError: rank 1 wraps a different model from rank 0's in DataParallel: parameter '4.weight' is " \
           "[4, 16] float32 on rank 1 and [3, 16] float32 on rank 0" in report, report
    # both ranks say so, not only rank 1: the root cause, and the other rank in the list below it
    assert report.split("other ranks:")[1].count("exited with code 1 [ConfigError]") == 1, report
    assert job.seconds < 30


def test_shares_that_do_not_fit_the_job_are_refused() -> None:
    with pytest.raises(macfleet.ConfigError, match="1 numbers above 0"):
        macfleet.DataParallel(nn.Linear(2, 2), shares=[1, 2])  # a job of one: one share
    with pytest.raises(macfleet.ConfigError, match="above 0"):
        macfleet.DataParallel(nn.Linear(2, 2), shares=[0])


def test_ddp_s_none_defaults_and_new_buffer_option_mean_what_they_mean_there() -> None:
    """torch 2.13's DDP defaults bucket_cap_mb and broadcast_buffers to None, and names the
    latter forward_sync_buffers; a DDP line that passes them on ports too."""
    model = macfleet.DataParallel(nn.Linear(2, 2), bucket_cap_mb=None, broadcast_buffers=None)
    assert model._caps == (1 << 20, 25 << 20) and model.broadcast_buffers is True
    assert macfleet.DataParallel(nn.Linear(2, 2), forward_sync_buffers=False).broadcast_buffers is False
    assert macfleet.DataParallel(nn.Linear(2, 2), broadcast_buffers=False, forward_sync_buffers=True).broadcast_buffers
    assert macfleet.DataParallel(nn.Linear(2, 2), bucket_cap_mb=0, first_bucket_mb=0.5)._caps == (1 << 19, 0)


@pytest.mark.parametrize("option, value", [("bucket_cap_mb", float("nan")), ("bucket_cap_mb", float("inf")),
                                           ("bucket_cap_mb", -1), ("bucket_cap_mb", "25"), ("first_bucket_mb", True)])
def test_a_bucket_cap_that_is_no_size_is_named(option: str, value: object) -> None:
    """nan and inf failed with bare ValueError and OverflowError, a negative passed for 0, and
    "25" (a string from argparse) with "Exceeds the limit (4300 digits) for integer string
    conversion"."""
    with pytest.raises(macfleet.ConfigError, match=rf"^{option}={value!r}: give a number of MiB, 0 or more$"):
        macfleet.DataParallel(nn.Linear(2, 2), **{option: value})


def test_ddp_s_positional_device_ids_and_a_model_that_is_no_module_are_named() -> None:
    """``DDP(model, [local_rank])`` ported as it stood gave our second argument, the bucket cap,
    a list, and the error named the cap alone; a model that is no module (None from a builder
    that forgot to return it) was an AttributeError from inside the wrapping."""
    with pytest.raises(macfleet.ConfigError, match=r"^bucket_cap_mb=\[0\]: give a number of MiB, 0 or more \(Data"
                                                   r"Parallel's second argument is bucket_cap_mb, where DDP's is "
                                                   r"device_ids: give device_ids=\[0\] by name\)$"):
        macfleet.DataParallel(nn.Linear(2, 2), [0])
    for wrong, named in ((None, "NoneType"), (nn.Linear(2, 2).forward, "method")):
        with pytest.raises(macfleet.ConfigError, match=rf"^DataParallel wraps a torch.nn.Module \(the model\), not "
                                                       rf"{named}$"):
            macfleet.DataParallel(wrong)


def test_buffers_are_broadcast_from_rank_0(dp_job) -> None:
    """The case ends with a forward on one input everywhere and compares the ranks' buffers."""
    job, out = dp_job("buffers")
    assert job.code == 0 and (out / "buffers.pt").exists(), job.output


@pytest.mark.parametrize("case", ["local-buffers", "forward-sync-off"])
def test_broadcast_buffers_false_keeps_each_rank_s_buffers_from_the_start_as_ddp_does(dp_job, case) -> None:
    """DDP's ``broadcast_buffers=False`` leaves the buffers out of its sync at the start too,
    where torch 2.13's ``forward_sync_buffers=False`` keeps that one (a script with rank-local
    statistics relies on the former): each rank's running mean starts at its rank number, and
    the case checks it is its own after wrapping, or rank 0's; after training, the ranks'
    statistics differ (each of its own shard)."""
    job, out = dp_job(case)
    assert job.code == 0 and (out / f"{case}.pt").exists(), job.output


def test_a_forward_without_autograd_on_rank_0_alone_needs_no_other_rank(dp_job) -> None:
    """Validation on rank 0 under torch.no_grad(), the model left in training mode: its forward
    broadcast the buffers, a collective the other ranks never joined, and the job failed with
    ranks in different collectives. The statistics it changed reach the others at the next
    training forward (the case checks that the ranks end with the same buffers)."""
    job, out = dp_job("validate-alone")
    assert job.code == 0 and (out / "validate-alone.pt").exists(), job.output


# Each case: the images of each rank, and the dtype. Those on one host run in one job (a 3-rank
# job each was about 8 s of CPU, most of it importing torch).
SYNC_BN_CASES = {"one host": ((1, 2, 3), torch.float32), "two hosts": ((1, 2, 3), torch.float32),
                 "a rank without images": ((0, 2, 3), torch.float32), "float64": ((1, 2, 3), torch.float64)}


def sync_bn_job(out: Path, layout: list[str], cases: list[str]) -> Job:
    specs = []
    for case in cases:
        sizes, dtype = SYNC_BN_CASES[case]
        specs.append(f"{case}={','.join(map(str, sizes))}:{str(dtype).removeprefix('torch.')}")
    return run_launch(*layout, str(BIN / "sync_bn.py"), str(out), *specs, timeout=60)


@pytest.fixture(scope="module")
def sync_bn_one_host(tmp_path_factory) -> tuple[Job, Path]:
    out = tmp_path_factory.mktemp("sync-bn")
    return sync_bn_job(out, ["--nproc", "3"], [case for case in SYNC_BN_CASES if case != "two hosts"]), out


@pytest.mark.parametrize("case", list(SYNC_BN_CASES))
def test_sync_batch_norm_normalizes_with_the_whole_global_batch(request, tmp_path, case: str) -> None:
    """A DDP script converted with ``nn.SyncBatchNorm.convert_sync_batchnorm``: torch's runs as a
    plain BatchNorm without a torch.distributed process group, so each rank normalized its own
    batch alone (only a warning said so). Ranks of 1, 2 and 3 images of different statistics
    must get what one BatchNorm2d gets on all 6: running statistics, the input's gradient of
    the sum of every rank's loss, and (averaged by DataParallel) the parameters' gradients.
    Across hosts of 2 ranks and 1 the statistics are gathered through each host's shared
    memory and the hosts' ring, in runs of blocks of different lengths. A rank whose batch is
    empty adds nothing to the statistics, and its gradient of the input is empty. A float64
    model is normalized in float64, as torch's BatchNorm does (it was in float32: 1e-7 off)."""
    if case == "two hosts":
        layout = ["--hosts", "127.0.0.2:2,127.0.0.3:1", *request.getfixturevalue("sshd").launch_options()]
        job, out = sync_bn_job(tmp_path, layout, [case]), tmp_path
    else:
        job, out = request.getfixturevalue("sync_bn_one_host")
    assert job.code == 0, job.output
    sizes, dtype = SYNC_BN_CASES[case]
    norm = sync_bn.make_norm(dtype)
    batches = [sync_bn.batch(r, n, dtype) for r, n in enumerate(sizes)]
    tolerance = 1e-5 if dtype == torch.float32 else 1e-12
    x = torch.cat([b[0] for b in batches]).requires_grad_(True)
    (norm(x) * torch.cat([b[1] for b in batches])).sum().backward()
    want_x = x.grad.split(list(sizes))
    for rank in range(3):
        got = torch.load(out / f"{case}-{rank}.pt")
        assert got["x.grad"].dtype == dtype, rank
        assert torch.allclose(got["x.grad"], want_x[rank], atol=tolerance, rtol=0), rank
        assert torch.allclose(got["weight.grad"], norm.weight.grad / 3, atol=tolerance, rtol=0), rank
        assert torch.allclose(got["bias.grad"], norm.bias.grad / 3, atol=tolerance, rtol=0), rank
        assert torch.allclose(got["running_mean"], norm.running_mean, atol=tolerance / 10, rtol=0), rank
        assert torch.allclose(got["running_var"], norm.running_var, atol=tolerance, rtol=0), rank


def test_a_ddp_script_ported_by_the_readme_s_table_trains_as_ddp_does(tmp_path) -> None:
    """README's table of DDP's lines and macfleet's: a torchrun script with DDP (on gloo), and
    the same script with those lines swapped, the port keeping ``device_ids=[local_rank]``,
    which DataParallel used to refuse. Two epochs on 2 ranks with a DistributedSampler each:
    the same parameters, the same losses averaged over the ranks, the same collectives."""
    results = {}
    for mode in ("ddp", "macfleet"):
        job = run_launch("--nproc", "2", str(BIN / "ddp_port.py"), mode, str(tmp_path / mode), timeout=90)
        assert job.code == 0, job.output
        assert "reads the whole dataset" not in job.output  # its loader has a DistributedSampler
        results[mode] = torch.load(tmp_path / mode)
    ddp, ported = results["ddp"], results["macfleet"]
    assert len(ported["losses"]) == len(ddp["losses"]) == 12  # 96 samples, 2 ranks, batches of 8, two epochs
    assert max(abs(a - b) for a, b in zip(ported["losses"], ddp["losses"], strict=True)) < 1e-5
    for name, value in ddp["params"].items():
        assert torch.allclose(ported["params"][name], value, atol=1e-5, rtol=0), name
    for key in ("broadcast", "gathered"):
        assert ported[key] == ddp[key], key


def test_a_data_loader_that_every_rank_reads_whole_is_pointed_out_once() -> None:
    """A script ported from one process keeps DataLoader(dataset, shuffle=True): it trains, and
    every rank goes through the whole dataset each epoch, so two Macs were no faster than one,
    without a word. Rank 0 now says so once, at the script's line, past a warm-up step taken
    before the loop; the job still runs as written. Two ranks, as on two Macs, the usual cluster."""
    job = run_launch("--nproc", "2", str(BIN / "whole_loader.py"), timeout=60)
    assert job.code == 0, job.output
    assert all(f"rank {r} took 12 steps" in job.stdout for r in range(2))  # 96 samples in batches of 8: all of them
    said = [line for line in job.output.splitlines() if "reads the whole dataset" in line]
    assert len(said) == 1 and said[0].startswith("[rank 0]"), job.output
    script = BIN / "whole_loader.py"
    line = next(n for n, text in enumerate(script.read_text().splitlines(), 1) if "the line the warning names" in text)
    assert f"{script}:{line}: UserWarning: rank 0 trains from a DataLoader whose RandomSampler" in said[0]
    assert "both ranks go through all of it every epoch" in said[0], said[0]  # not "all 2 ranks"


@pytest.mark.parametrize("mode, said", [
    ("stream", "the ranks train on the same batches: the first 3 training forwards of every rank got the same "
               "inputs as every other rank's, so the 2 ranks together go no faster than one"),
    ("split", None),
    ("in-order", None),
])
def test_ranks_that_train_on_the_same_batches_are_named(mode: str, said: str | None) -> None:
    """An IterableDataset that does not split itself among the ranks trains without an error,
    and the loaders check cannot see it: every rank goes through all of it. The launcher names
    the ranks once, from digests of their first training forwards' inputs, past a warm-up step
    on a dummy batch that is alike everywhere. A stream split by the job's rank is let be, and
    so is a loader that rank 0 names already (``shuffle=False`` over the whole dataset), which
    is the same mistake. (One split by the rank on its Mac: ``test_multihost``.)"""
    job = run_launch("--nproc", "2", str(BIN / "same_batches.py"), mode, timeout=60)
    assert job.code == 0 and job.stdout.count(" trained") == 2, job.output
    warned = [line for line in job.stderr.splitlines() if "train on the same batches" in line]
    if said is None:
        assert not warned, job.stderr
    else:
        assert len(warned) == 1 and warned[0].startswith(f"macfleet: warning: {said}"), job.stderr
    whole = [line for line in job.output.splitlines() if "reads the whole dataset" in line]
    assert len(whole) == (mode == "in-order"), job.output


# Through shared memory two ranks take the path three would; over sockets three make a ring
@pytest.mark.parametrize("shm, nproc", [("1", 2), ("0", 3)], ids=["shared memory", "sockets"])
def test_copies_of_a_data_parallel_train_as_its_own(tmp_path, shm: str, nproc: int) -> None:
    """``AveragedModel(model)``, ``copy.deepcopy(model)`` and ``torch.save(model)`` of a
    DataParallel failed with "cannot pickle '_thread.lock' object" (DDP's can be copied). A copy
    keeps the module and the options; it joins the job at its first training forward, so rank 0
    can copy and evaluate one alone, and a student copied from the model is averaged as a model
    of its own (copied inside the model's no_sync() block, it took the block's flag and trained
    apart on every rank). The model, the EMA, the student and the snapshot must be what one process makes
    on the whole batch; the pickle loads here, outside any job, and evaluates as the model did."""
    job = run_launch("--nproc", str(nproc), "--env", f"MACFLEET_SHM={shm}", str(BIN / "copies.py"), str(tmp_path),
                     timeout=60)
    assert job.code == 0, job.output
    model = oracle.make_model()
    optimizer = oracle.make_optimizer(model)
    x, y = oracle.make_batch()
    copies.step(model, optimizer, x, y)
    ema, student, snapshot = AveragedModel(model), copy.deepcopy(model), copy.deepcopy(model)
    student_optimizer = oracle.make_optimizer(student)
    for _ in range(copies.STEPS):
        copies.step(model, optimizer, x, y)
        ema.update_parameters(model)
        copies.step(student, student_optimizer, x, y)
    got = torch.load(tmp_path / "copies.pt")
    for what, want in [("model", model), ("ema", ema.module), ("student", student), ("snapshot", snapshot)]:
        for name, value in want.state_dict().items():
            assert torch.allclose(got[what][name], value, atol=1e-5, rtol=0), (what, name)
    assert not torch.allclose(got["student"]["0.weight"], got["snapshot"]["0.weight"], atol=1e-3)  # it trained
    whole = torch.load(tmp_path / "whole.pt", weights_only=False)
    assert type(whole) is macfleet.DataParallel
    with torch.no_grad():
        assert torch.allclose(whole.eval()(x), snapshot(x), atol=1e-6, rtol=0)


def test_sync_batch_norm_alone_is_a_plain_batch_norm_even_beside_a_process_group(tmp_path) -> None:
    """A job of one, or a forward without autograd, shares nothing: macfleet's SyncBatchNorm
    then normalizes as BatchNorm2d does. It used to fall back to torch's SyncBatchNorm forward,
    which raised "expected input tensor to be on GPU" for a CPU (or MPS) tensor in training
    mode whenever the script also had a torch.distributed process group (the benchmark found it)."""
    script = f"""
import torch, torch.distributed as dist, macfleet
from torch import nn
macfleet.init()
dist.init_process_group("gloo", init_method="file://{tmp_path}/store", rank=0, world_size=1)
torch.manual_seed(0)
x = torch.randn(4, 3, 5, 5) * 3 + 1
ours, plain = macfleet.SyncBatchNorm(3), nn.BatchNorm2d(3)
for grad in (True, False):
    with torch.set_grad_enabled(grad):
        assert torch.allclose(ours(x), plain(x), atol=1e-6)
assert torch.allclose(ours.running_var, plain.running_var) and int(ours.num_batches_tracked) == 2
dist.destroy_process_group()
print("same")
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if not k.startswith("MACFLEET_")})
    assert proc.returncode == 0 and proc.stdout.strip() == "same", proc.stderr


@pytest.mark.parametrize("nproc, env", [(2, {}), (3, {"MACFLEET_SHM": "0"})], ids=["shared memory", "sockets"])
def test_a_script_that_sets_a_default_device_trains(tmp_path, nproc: int, env: dict[str, str]) -> None:
    """``torch.set_default_device("mps")``, as Mac scripts often begin, put what macfleet made
    for itself on the GPU: DataParallel's check of its options (a float64 tensor, which MPS
    refuses), host buffers, the sampler's shuffle (a CPU generator). ``meta`` stands in for the
    GPU: a tensor of ours made there has no data. Training with join and no_sync, SyncBatchNorm,
    every collective, the objects, a checkpoint saved and loaded."""
    job = run_launch("--nproc", str(nproc), str(BIN / "default_device.py"), "meta", str(tmp_path), env=env,
                     timeout=120)
    assert job.code == 0, job.output
    assert job.stdout.count("default device ok") == nproc, job.output


def test_training_on_after_an_exception_in_backward_is_refused() -> None:
    """An out-of-memory error caught mid-backward (the skip-the-batch pattern) leaves the rank's
    buckets half released: the next step must be an error, not gradients never averaged."""
    job, report = failed("backward-raises")
    assert "caught out of memory" in job.stdout, job.output
    assert "rank 1" in report and "the previous backward raised" in report, report
    assert job.seconds < 30


def join_reference(case: str, world: int = 3) -> tuple[dict[str, torch.Tensor], list[dict[str, torch.Tensor]], list]:
    """What ``join_cases`` must end with, trained in one process: the parameters and momentum
    (the same on every rank), and each rank's buffers. A step's gradient is the sum over the
    ranks still training, divided by the job (or by those ranks); the buffers each forward
    starts from are those of the lowest rank still training, as that rank left them (each
    rank's own with ``broadcast_buffers=False``)."""
    model = join_cases.make_model()
    opt = join_cases.make_optimizer(model)
    counts = [join_cases.batches(case, r) for r in range(world)]
    own = case in ("own-buffers", "metric-even")
    halves = [slice(0, 4), slice(4, 8)] if case in ("accumulate", "own-buffers") else [slice(0, 8)]
    after: dict[int, dict[str, torch.Tensor]] = {r: {k: b.clone() for k, b in model.named_buffers()} for r in range(world)}
    training: list[int] = []
    for step in range(min(counts) if case == "throw" else max(counts)):
        training = [r for r in range(world) if counts[r] > step]
        opt.zero_grad()
        for part in halves:
            start = after[training[0]]
            for r in training:
                model.load_state_dict(after[r] if own else start, strict=False)
                x, y = join_cases.batch(r, step)
                divisor = len(training) if case == "divide-by-training" else world
                (nn.functional.cross_entropy(model(x[part]), y[part]) / len(halves) / divisor).backward()
                after[r] = {k: b.clone() for k, b in model.named_buffers()}
        opt.step()
    final = range(world) if len(training) in (0, world) or own else [training[0]] * world  # 0: no step taken
    params = dict(model.named_parameters())
    return {k: v.detach() for k, v in params.items()}, [after[r] for r in final], \
        [opt.state[p].get("momentum_buffer", torch.zeros_like(p)) for p in params.values()]


JOIN_JOBS = {"default": ({}, ["even", "metric-even", "uneven", "accumulate", "own-buffers", "divide-by-training",
                             "throw"]),
             "ring": ({"MACFLEET_SHM": "0"}, ["fp16"])}


@pytest.fixture(scope="module")
def join_job(tmp_path_factory) -> Callable[[str], tuple[Job, Path]]:
    return jobs_by_environment(tmp_path_factory, "join_cases.py", JOIN_JOBS)


@pytest.mark.parametrize("case", [c for _, cases in JOIN_JOBS.values() for c in cases])
def test_ranks_with_fewer_batches_shadow_the_others_inside_join(join_job, case: str) -> None:
    """Rank 0 has 2 batches, rank 1 has 5 and rank 2 has 3. Inside ``model.join()`` the job
    ends, and every rank ends with the model and optimizer state of one process that trained
    every rank's batches (with ``throw_on_early_termination``: every rank stops after 2)."""
    job, out = join_job(case)
    assert job.code == 0, job.output
    if case == "uneven":  # the launcher says which ranks stood by, ran out of batches, and for how much of the job
        assert "stood by inside join() while the others trained: rank 0 " in job.stderr + job.stdout, job.output
    params, buffers, momentum = join_reference(case)
    tolerance = TOLERANCE.get(case, 1e-5)
    for rank in range(3):
        got = torch.load(out / case / f"rank{rank}.pt")
        for name, value in params.items():
            assert torch.allclose(got["model"][name], value, atol=tolerance, rtol=0), (rank, name)
        for name, value in buffers[rank].items():
            assert torch.allclose(got["model"][name], value, atol=tolerance, rtol=0), (rank, name)
        for value, want in zip(got["momentum"], momentum, strict=True):
            assert torch.allclose(value, want, atol=tolerance, rtol=0), rank
        if case == "uneven" and rank == 0:
            # Standing by for rank 1's three slower steps is neither work nor waiting for a slower
            # rank: the launcher's pace line would otherwise name rank 1 as the slow one.
            assert got["stood_by_s"] >= 3 * join_cases.SLOW_STEP_S, got
            assert got["waited_s"] < got["stood_by_s"] / 2, got
        if case == "throw":
            assert got["steps"] == 2, got["steps"]
            assert f"rank {rank} stopped after 2 steps: rank 0 ran out of inputs" in job.stdout, job.output


@pytest.mark.parametrize("case, expected", [
    ("sync-bn", "join() cannot shadow SyncBatchNorm '1'"),
    # the script averages its loss each step: rank 0, out of batches, cannot shadow that
    ("metric", "takes part only in DataParallel's own collectives"),
    ("no-sync-differs", "2 of the 3 training ranks average gradients in this step and the others are in no_sync()"),
    ("two-forwards", "inside join() each training forward must be followed by its backward"),
])
def test_what_join_cannot_shadow_is_named(tmp_path, case: str, expected: str) -> None:
    job = run_launch("--nproc", "3", str(BIN / "join_cases.py"), case, str(tmp_path), timeout=60)
    assert job.code != 0
    report = job.stderr[job.stderr.index("root cause"):]
    assert expected in report, report
    assert job.seconds < 30
