"""The training oracle: N ranks on shards of a batch == one process on the whole batch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from torch import nn

from conftest import BIN, MNIST, run_launch, small_mnist

sys.path.insert(0, str(BIN))
import oracle  # noqa: E402

STEPS = 6


def reference_parameters() -> dict[str, torch.Tensor]:
    model = oracle.make_model()
    optimizer = oracle.make_optimizer(model)
    x, y = oracle.make_batch()
    for _ in range(STEPS):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    return model.state_dict()


# Two ranks and four; three is test_data_parallel's world, where every case is held to this
# same oracle.
@pytest.mark.parametrize("world", [2, 4])
def test_sharded_training_matches_one_process_on_the_whole_batch(tmp_path, world: int) -> None:
    out = tmp_path / "params.pt"
    job = run_launch("--nproc", str(world), str(BIN / "oracle.py"), str(STEPS), str(out))
    assert job.code == 0, job.output
    got, want = torch.load(out), reference_parameters()
    initial = oracle.make_model().state_dict()
    for name, value in want.items():
        assert not torch.allclose(value, initial[name])  # training moved it, so the comparison means something
        assert torch.allclose(got[name], value, atol=1e-5, rtol=0), name


@pytest.mark.parametrize("more", [[], ["--shares", "3,1", "--compression", "fp16"]])
def test_mnist_example_learns_in_one_epoch_on_two_processes(tmp_path, more: list[str]) -> None:
    """With --shares 3,1 rank 0 takes three batches' worth of every step (a faster Mac). With
    --compression the gradients cross the sockets in fp16 (through shared memory they stay
    float32, so that case runs without it). The two are independent, and one job (a few
    seconds of the suite) checks both."""
    env = {"MACFLEET_SHM": "0"} if "--compression" in more else None
    job = run_launch("--nproc", "2", str(MNIST), "--epochs", "1", "--train-url", str(tmp_path), *more, env=env,
                     timeout=300)
    assert job.code == 0, job.output
    assert "no --data-url; using generated digits" in job.stdout  # says which data it used
    assert f"global batch {64 * (4 if '--shares' in more else 2)}" in job.stdout
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["world_size"] == 2
    assert metrics["final_test_accuracy"] >= 0.9
    assert (tmp_path / "model.pt").exists()


def test_mnist_example_refuses_what_it_cannot_do(tmp_path) -> None:
    """A mistyped --data-url trained on generated digits instead, with one log line to say so;
    a batch larger than a rank's shard (drop_last) trained on nothing and reported accuracy 0.10;
    --resume without --train-url started afresh; --checkpoint-every -1 checkpointed every step;
    --lr nan stopped in a traceback from Adam.
    The first case runs under the launcher (the refusal is the report's root cause); the rest
    as a job of one, under plain python."""
    job = run_launch("--nproc", "2", str(MNIST), "--epochs", "1", "--data-url", str(tmp_path / "nothere"), timeout=120)
    assert job.code == 2, job.output
    assert f"--data-url {tmp_path / 'nothere'} does not exist" in job.stderr[job.stderr.index("root cause"):]
    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(b"")
    cases = ((["--data-url", str(tmp_path)], "lacks train-labels-idx1-ubyte, t10k-images-idx3-ubyte, "
                                             "t10k-labels-idx1-ubyte"),
             (["--batch-size", "13000"], "rank 0's 12000 samples per epoch make no full batch of 13000"),
             (["--resume"], "give --train-url too"),
             (["--checkpoint-every", "-1"], "must be 0 or more, not -1"),
             (["--lr", "nan"], "--lr: must be a number, 0 or more, not nan"))  # was a traceback from Adam
    # side by side: each is a process of one thread that mostly imports torch
    runs = [subprocess.Popen([sys.executable, str(MNIST), "--epochs", "1", *args], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for args, _ in cases]
    try:
        outputs = [run.communicate(timeout=120) for run in runs]
    finally:
        for run in runs:
            run.kill()
    for run, (out, err), (args, wanted) in zip(runs, outputs, cases, strict=True):
        assert run.returncode == 2 and wanted in err, (args, err)
        assert "epoch 1/1" not in out


def test_mnist_example_refuses_a_train_url_it_cannot_write_before_training(tmp_path) -> None:
    """Rank 0 alone writes --train-url, at the end of the first epoch: a bad one used to cost
    that epoch, then a traceback from checkpoint.save."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    job = run_launch("--nproc", "2", str(MNIST), "--epochs", "1", "--train-url", str(blocker / "out"), timeout=120)
    assert job.code == 2, job.output
    assert "--train-url" in job.stderr and "Not a directory" in job.stderr, job.stderr
    assert "epoch 1/1" not in job.stdout


def test_the_example_given_more_epochs_on_resume_runs_its_cosine_over_them(tmp_path) -> None:
    """A finished run of 1 epoch, resumed with --epochs 2, kept its schedule's length: the rate
    had reached 0 at the end of epoch 1, so epoch 2 trained at 0 (nothing moved), and the
    cosine, past its end, climbed back to the full rate for whatever came after. Now the
    cosine runs over the 2 epochs from there: epoch 2 trains at half the rate, and the run ends
    at 0. As a job of one, under plain python."""
    data = small_mnist(tmp_path / "data", 1200, 200)

    def run(*args: str) -> dict:
        done = subprocess.run([sys.executable, str(MNIST), "--device", "cpu", "--data-url", str(data),
                               "--train-url", str(tmp_path / "out"), *args], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"epoch {args[1]}/{args[1]}" in done.stdout, done.stdout
        return {"said": done.stdout, **torch.load(tmp_path / "out" / "model.pt")}

    first, more = run("--epochs", "1"), run("--epochs", "2", "--resume")
    assert "the learning rate's cosine runs over 2 epochs now, not 1" in more["said"], more["said"]
    assert [g["lr"] for g in more["optimizer"]["param_groups"]] == [0.0]
    assert any(not torch.equal(first["model"][k], more["model"][k]) for k in first["model"])  # epoch 2 trained
