"""Models from Hugging Face transformers and torchvision under DataParallel, against one process
on the whole batch (trained on rank 0 beside the job): ``macfleet launch --nproc 2 libraries.py
[CASE,...]``. Needs ``pip install transformers torchvision`` (not macfleet's dependencies).

Cases: ``gpt2`` (GPT2LMHeadModel: tied input and output embeddings, the loss computed inside the
model, a ``ModelOutput``), ``gpt2-checkpointed`` (``gradient_checkpointing_enable()``, reentrant),
``resnet18`` (torchvision's, converted with ``nn.SyncBatchNorm.convert_sync_batchnorm``; the
reference keeps plain BatchNorms). ``DTYPE=float64`` trains in float64; ``OPTIMIZER=sgd`` with
SGD instead of AdamW. Prints each case's largest difference, and which tensors differ most."""

import copy
import os
import sys

import torch
from torch import nn

import macfleet

BATCH = 8
STEPS = int(os.environ.get("STEPS", "3"))
DTYPE = getattr(torch, os.environ.get("DTYPE", "float32"))


def optimizer(params):
    if os.environ.get("OPTIMIZER") == "sgd":
        return torch.optim.SGD(params, lr=0.1)
    return torch.optim.AdamW(params, lr=1e-3)


def gpt2(checkpointed: bool) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(3)
    config = GPT2Config(vocab_size=100, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)  # no dropout: comparable
    model = GPT2LMHeadModel(config)
    if checkpointed:
        model.gradient_checkpointing_enable()
    return model.train().to(DTYPE)


def resnet18() -> nn.Module:
    import torchvision
    torch.manual_seed(3)
    return torchvision.models.resnet18(num_classes=5).to(DTYPE)


def loss_fn(case: str):
    g = torch.Generator().manual_seed(9)
    if case.startswith("gpt2"):
        ids = torch.randint(0, 100, (BATCH, 16), generator=g)
        return lambda model, part: model(input_ids=ids[part], labels=ids[part]).loss
    x = torch.randn(BATCH, 3, 32, 32, generator=g, dtype=DTYPE)
    y = torch.randint(0, 5, (BATCH,), generator=g)
    return lambda model, part: nn.functional.cross_entropy(model(x[part]), y[part])


def train(model: nn.Module, loss, part: slice) -> None:
    opt = optimizer(model.parameters())
    for _ in range(STEPS):
        opt.zero_grad()
        loss(model, part).backward()
        opt.step()


def run(case: str, rank: int, world: int) -> None:
    reference = gpt2(case == "gpt2-checkpointed") if case.startswith("gpt2") else resnet18()
    ranks_model = copy.deepcopy(reference)
    if case == "resnet18":
        ranks_model = nn.SyncBatchNorm.convert_sync_batchnorm(ranks_model)
    loss = loss_fn(case)
    model = macfleet.DataParallel(ranks_model)
    train(model, loss, slice(rank * BATCH // world, (rank + 1) * BATCH // world))
    if rank == 0:
        train(reference, loss, slice(None))
        got, want = model.module.state_dict(), reference.state_dict()
        diffs = sorted(((float((got[k].double() - want[k].double()).abs().max()), k)
                        for k in want if want[k].is_floating_point()), reverse=True)
        print(f"{case} ({str(DTYPE)[6:]}, {STEPS} steps): largest difference {diffs[0][0]:.3g}; {diffs[:3]}", flush=True)


def main() -> None:
    macfleet.init()
    for case in (sys.argv[1].split(",") if len(sys.argv) > 1 else ["gpt2", "gpt2-checkpointed", "resnet18"]):
        run(case, macfleet.rank(), macfleet.world_size())
    macfleet.shutdown()


main()
