"""DataParallel cases against the single-process oracle: ``dp_cases.py CASE[,CASE...] OUTDIR``.

The cases run one after another in the same job, each with a model and a DataParallel of its
own (as a script that trains several models in turn); rank 0 saves each case's parameters to
OUTDIR/CASE.pt.

Cases: ``buckets`` (one bucket per module), ``single`` (default bucket sizes: the whole
model in one bucket, averaged on the thread that ran backward), ``order`` (ranks make
gradients ready in opposite orders), ``no_sync`` (two micro-batches per step), ``unused`` /
``unused-allowed`` (a parameter that gets no gradient; ``unused-single`` in one bucket),
``fp16`` / ``bf16`` (wire compression), ``buffers`` (BatchNorm statistics broadcast from rank
0; ``validate-alone``: rank 0 also runs a forward under ``torch.no_grad()`` alone after each
step, its model still in training mode, as a quick validation does), ``two-models`` (two DataParallel modules in one backward; ``two-models-one-bucket``: one
of them in a single bucket), ``backward-raises`` (rank 1 catches an error raised in the middle
of its backward and tries to go on: it must not), ``zero-in-place``
(``zero_grad(set_to_none=False)``: gradients stay the buckets' views, and backward accumulates
into them), ``wide`` (default bucket sizes, the second bucket 2.5 MB of 200 small heads'
gradients: lent for the size of its gradients, not its own), ``sparse`` (an ``nn.Embedding(sparse=True)``, trained with ``SparseAdam``: its
sparse gradient is averaged dense and must come back sparse), ``cast-after-wrap`` (the model is cast to float64 after it was wrapped: the buckets no
longer fit it, which the first forward must say), ``lazy`` (an ``nn.LazyLinear`` wrapped before
its first forward: no shapes to lay buckets out by, which the wrapping must say), ``uneven``
(rank 1 has one batch less than the others, and finishes while they wait for its gradients),
``shares`` (rank r trains on r + 1 parts of the batch, and says so to DataParallel),
``shares-differ`` (rank 1 passes DataParallel other shares than the rest), ``fine-tune`` (the
first layer starts frozen; at step 3 the script unfreezes it, freezes the middle one and gives
the model a new head, initialized differently on each rank, with the same DataParallel),
``rewrap`` (the same, but the script wraps the model again afterwards, as DDP asks),
``fine-tune-differs`` (only rank 1 makes the change), ``compiled`` (``torch.compile`` of the
DataParallel, as DDP's users write it, compiled once for every step although the script makes a
new loss module at each; Dynamo and AOTAutograd, no C compiler), ``sync-bn`` (two BatchNorms,
converted with ``nn.SyncBatchNorm.convert_sync_batchnorm`` as for DDP: against the oracle's
plain BatchNorms on the whole batch, running statistics included; one bucket per module, so
their backward collectives run while buckets are in flight), ``checkpoint`` (the last layers in a
reentrant activation checkpoint, ``use_reentrant=True`` as Hugging Face's gradient checkpointing
uses: their backward is a backward of its own, which ends before the first layer's gradient
comes; the model returns its logits in a dataclass), ``input-gradient`` (a gradient penalty:
``torch.autograd.grad`` of the output by the input, a backward that reaches the model's output but none of its parameters' ``.grad``),
``two-forwards`` (two forwards, of two views of the batch, before one backward, as a siamese or
contrastive loss makes; the model multiplies by a buffer, which the first forward's backward
needs as it was: the second forward's broadcast of the buffers must not count as changing it),
``in-backward`` (a custom autograd function that all-reduces in forward and in backward, in the
middle of the model: its backward's collective comes while buckets are in flight), ``copied``
(the script trains ``copy.deepcopy`` of the DataParallel, which lays its buckets out at its
first training forward), ``ddp-options`` (wrapped with DDP's own options, as a DDP script's
line reads: ``device_ids=[rank]``, ``output_device``, ``gradient_as_bucket_view``,
``static_graph``...; its ``register_comm_hook`` must say what to use instead), ``local-buffers``
(every rank's BatchNorm statistics start from a value of its own, wrapped with
``broadcast_buffers=False``: they stay each rank's, from the start, as with DDP),
``forward-sync-off`` (the same with ``forward_sync_buffers=False``: rank 0's at the start only),
``shared-checkpoints`` (a layer run in two reentrant checkpoints, so that it gets two gradients in
one backward, the second after the first's bucket was complete; ``shared-checkpoints-more``: in
three from the third step, one more than the first backward showed, which must be an error),
``empty-parameter`` (a parameter of no elements), ``channels-last`` (a convolution in
channels_last from the start, and at step 3 the whole model converted to it after wrapping,
its gradients included, and a 4-D buffer, which the conversion replaces: rank 0's must still
reach every rank's new one), ``grad-penalty`` (a penalty on the parameters'
gradients, taken with ``torch.autograd.grad(..., create_graph=True)``, then one backward of the
total), ``create-graph`` (``backward(create_graph=True)``, gradients with graphs of their own,
which must be an error), ``fused-optimizer-before`` / ``-after`` (an optimizer step in each
parameter's gradient hook, registered before or after wrapping, which takes the gradient away
before it is averaged: an error).
"""

import copy
import os
import sys
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import macfleet
from macfleet.buckets import LEND_BYTES
from macfleet.runtime import runtime

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import oracle  # noqa: E402

STEPS = 6
NORM_CASES = ("buffers", "validate-alone", "local-buffers", "forward-sync-off")  # WithNorm's, which check their buffers


class TwoBranches(nn.Module):
    """Rank-dependent forward order, so backward makes gradients ready in a rank-dependent order."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(7)
        self.a = nn.Sequential(nn.Linear(10, 16), nn.Tanh(), nn.Linear(16, 3))
        self.b = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 3))
        self.first = "a"

    def forward(self, x):
        if self.first == "a":
            ya = self.a(x)
            return ya + self.b(x)
        yb = self.b(x)
        return self.a(x) + yb


class WithUnused(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = oracle.make_model()
        self.spare = nn.Linear(3, 3)  # never used in forward

    def forward(self, x):
        return self.net(x)


class TwoNorms(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.net = nn.Sequential(nn.Linear(10, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 32),
                                 nn.BatchNorm1d(32, momentum=None), nn.Tanh(), nn.Linear(32, 3))

    def forward(self, x):
        return self.net(x)


class WithNorm(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.net = nn.Sequential(nn.Linear(10, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))

    def forward(self, x):
        return self.net(x)


class Chained(nn.Module):
    """A generator and a critic trained through one loss (a GAN's generator step): each is
    wrapped in its own DataParallel, so one backward fills the buckets of both."""

    def __init__(self):
        super().__init__()
        self.g = oracle.make_model()
        torch.manual_seed(5)
        self.d = nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, 3))  # last layer: as large as g's

    def forward(self, x):
        return self.d(self.g(x))


class SparseEmbedding(nn.Module):
    """The batch's features read as indices into an embedding with sparse gradients."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(11)
        self.embed = nn.Embedding(40, 4, sparse=True)
        self.head = nn.Linear(40, 3)

    def forward(self, x):
        return self.head(self.embed((x.abs() * 10).long() % 40).flatten(1))


class Wide(nn.Module):
    """200 small heads side by side: 3.5 MB of gradients, 16 KB weights and 1.6 KB biases, so
    that with the default sizes the second bucket (2.5 MB) is over ``buckets.LEND_BYTES`` and
    lends its views by the size of its gradients alone."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(11)
        self.heads = nn.ModuleList(nn.Linear(10, 400) for _ in range(200))
        self.out = nn.Linear(400, 3)

    def forward(self, x):
        return self.out(torch.stack([torch.tanh(head(x)) for head in self.heads]).mean(0))


class RaiseInBackward(torch.autograd.Function):
    """Identity whose backward raises while ``armed`` (an out-of-memory error, say)."""

    armed = False

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        if RaiseInBackward.armed:
            raise RuntimeError("out of memory (raised by the test)")
        return grad


class RaisesMidBackward(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = oracle.make_model()

    def forward(self, x):
        return self.net[2:](RaiseInBackward.apply(self.net[:2](x)))


@dataclass
class Output:
    """A model's output as an object of its own (DataParallel must find the tensor inside)."""

    logits: torch.Tensor


class Checkpointed(nn.Module):
    """The oracle's model with its last layers recomputed in backward (a reentrant checkpoint),
    so that backward's first gradients come in the checkpoint's own backward."""

    def __init__(self):
        super().__init__()
        self.net = oracle.make_model()

    def forward(self, x):
        return Output(checkpoint(self.net[2:], self.net[:2](x), use_reentrant=True))


class SharedInCheckpoints(nn.Module):
    """The oracle's model with one more layer between its first two, run ``runs`` times, each
    in a reentrant checkpoint of its own (weights shared across depth, as ALBERT's, with Hugging
    Face's gradient checkpointing): each checkpoint's backward brings that layer a gradient of
    its own. Its bucket, registered last, is the first to be averaged."""

    def __init__(self):
        super().__init__()
        self.net = oracle.make_model()
        torch.manual_seed(5)
        self.shared = nn.Linear(32, 32)
        self.runs = 2

    def forward(self, x):
        h = self.net[:2](x)
        for _ in range(self.runs):
            h = checkpoint(self._shared, h, use_reentrant=True)
        return self.net[2:](h)

    def _shared(self, h):
        return torch.tanh(self.shared(h))


class WithEmpty(nn.Module):
    """The oracle's model plus a parameter of no elements (a layer of width 0, as a configuration
    can make): autograd gives it an empty gradient of its own, not its bucket's view."""

    def __init__(self):
        super().__init__()
        self.net = oracle.make_model()
        self.empty = nn.Parameter(torch.zeros(0, 3))

    def forward(self, x):
        return self.net(x) + self.empty.sum(0)


class Convolutional(nn.Module):
    """Two convolutions over the oracle's 10 features read as a 2x1x5 image, the first in
    channels_last from the start (``channels-last``): gradients in the layout of their
    parameters, which is not the buckets' plain one."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1234)
        self.conv1 = nn.Conv2d(2, 6, (1, 2)).to(memory_format=torch.channels_last)
        self.conv2 = nn.Conv2d(6, 4, (1, 2))
        self.head = nn.Linear(4 * 3, 3)
        self.register_buffer("mask", torch.ones(1, 2, 1, 5))  # 4-D: a conversion makes a new one

    def forward(self, x):
        x = torch.tanh(self.conv1(x.view(-1, 2, 1, 5) * self.mask))
        return self.head(torch.tanh(self.conv2(x)).flatten(1))


class Masked(nn.Module):
    """The oracle's model with its first layer's output multiplied by a buffer."""

    def __init__(self):
        super().__init__()
        self.net = oracle.make_model()
        self.register_buffer("mask", (torch.arange(32) % 4 != 0).float())

    def forward(self, x):
        return self.net[1:](self.net[0](x) * self.mask)


def global_mean(t):
    """The mean over the whole global batch of ``t``'s rows (one all-reduce of sums and count)."""
    sums = torch.cat([t.sum(0), torch.tensor([float(t.shape[0])], device=t.device)])
    macfleet.all_reduce(sums)
    return sums[:-1] / sums[-1]


class GlobalCentre(torch.autograd.Function):
    """Rows minus their mean over the global batch, by hand, as a custom layer across ranks does:
    a collective in forward and one in backward."""

    @staticmethod
    def forward(ctx, x):
        return x - global_mean(x)

    @staticmethod
    def backward(ctx, grad):
        return grad - global_mean(grad)


class Centred(nn.Module):
    """The oracle's model with its hidden rows centred on their mean over the batch; the ranks'
    (``distributed``) over the global batch, with ``GlobalCentre``: its backward's all-reduce comes
    while the buckets of the layers after it are averaged."""

    def __init__(self):
        super().__init__()
        self.net = oracle.make_model()
        self.distributed = False

    def forward(self, x):
        h = self.net[:2](x)
        return self.net[2:](GlobalCentre.apply(h) if self.distributed else h - h.mean(0))


def fused_step(p):
    """An optimizer step fused into backward, as torch's tutorial on it makes: the parameter
    steps in its gradient's hook, and the gradient is dropped."""
    with torch.no_grad():
        p.add_(p.grad, alpha=-0.1)
    p.grad = None


def loss(case, model, x, y):
    """The step's loss on the batch ``x, y``; ``input-gradient`` adds a penalty on the gradient
    of the output by the input, per sample (so it averages over shards as over the whole batch);
    ``grad-penalty`` one on the parameters' gradients, per 8 samples; ``two-forwards`` is the
    mean of the losses on the batch and on its negative."""
    if case == "two-forwards":
        return (nn.functional.cross_entropy(model(x), y) + nn.functional.cross_entropy(model(-x), y)) / 2
    if case == "checkpoint":
        return nn.functional.cross_entropy(model(x).logits, y)
    if case == "grad-penalty":  # per 8 samples, a rank's shard of 3: the mean over ranks is the oracle's
        losses = []
        for part, want in zip(x.split(8), y.split(8)):
            ce = nn.functional.cross_entropy(model(part), want)
            grads = torch.autograd.grad(ce, list(model.parameters()), create_graph=True)
            losses.append(ce + 0.05 * sum(g.pow(2).sum() for g in grads))
        return sum(losses) / len(losses)
    if case == "input-gradient":
        x = x.clone().requires_grad_(True)
        out = model(x)
        grad, = torch.autograd.grad(out.sum(), x, create_graph=True)
        # a backward that reached no parameter: DataParallel gave back the gradients it lent it
        # (``Bucket.lend_views``) and they are None, as zero_grad left them and the oracle has them
        assert all(p.grad is None for p in model.parameters()), "a backward of no parameter left gradients"
        return nn.functional.cross_entropy(out, y) + 0.1 * grad.pow(2).sum(1).mean()
    return nn.functional.cross_entropy(model(x), y)


def make(case):
    if case == "checkpoint":
        return Checkpointed()
    if case == "in-backward":
        return Centred()
    if case.startswith("shared-checkpoints"):
        return SharedInCheckpoints()
    if case == "empty-parameter":
        return WithEmpty()
    if case == "channels-last":
        return Convolutional()
    if case == "two-forwards":
        return Masked()
    if case == "backward-raises":
        return RaisesMidBackward()
    if case.startswith("two-models"):
        return Chained()
    if case == "order":
        return TwoBranches()
    if case.startswith("unused"):
        return WithUnused()
    if case in NORM_CASES:
        return WithNorm()
    if case == "sync-bn":  # plain BatchNorms: the oracle's; the ranks convert them
        return TwoNorms()
    if case == "sparse":
        return SparseEmbedding()
    if case == "wide":
        return Wide()
    if case == "lazy":
        return nn.Sequential(nn.LazyLinear(16), nn.Tanh(), nn.Linear(16, 3))
    model = oracle.make_model()
    if case.startswith("fine-tune") or case == "rewrap":
        model[0].requires_grad_(False)
    return model


def for_ranks(case, module):
    """``make(case)``'s module as the ranks train it (the oracle trains the plain one)."""
    if case == "sync-bn":
        return nn.SyncBatchNorm.convert_sync_batchnorm(module)
    if case == "in-backward":
        module.distributed = True
    return module


CHANGE_STEP = 3


def change(case, module, step, rank):
    """What ``fine-tune``, ``rewrap`` and ``channels-last`` do to the model before ``step``;
    whether it has new parameters, for which the optimizer is made again."""
    if case == "channels-last" and step == CHANGE_STEP:
        module.to(memory_format=torch.channels_last)  # with the gradients it finds: DataParallel's views
        return False
    if case not in ("fine-tune", "rewrap", "fine-tune-differs") or step != CHANGE_STEP:
        return False
    if case == "fine-tune-differs" and rank != 1:
        return False
    module[0].requires_grad_(True)
    module[2].requires_grad_(False)
    torch.manual_seed(50 + rank)  # every rank a different head: rank 0's must win
    module[4] = nn.Linear(16, 3)
    return True


class SparseAndDense:
    """SparseAdam for the parameters whose gradients are sparse, the oracle's SGD for the rest."""

    def __init__(self, model):
        sparse = [p for name, p in model.named_parameters() if "embed" in name]
        self.parts = [torch.optim.SparseAdam(sparse, lr=0.05),
                      torch.optim.SGD([p for p in model.parameters() if all(p is not q for q in sparse)], lr=0.1,
                                      momentum=0.9)]

    def zero_grad(self, set_to_none=True):
        for part in self.parts:
            part.zero_grad(set_to_none=set_to_none)

    def step(self):
        for part in self.parts:
            part.step()


def make_optimizer(case, model):
    return SparseAndDense(model) if case == "sparse" else oracle.make_optimizer(model)


def main():
    cases, out = sys.argv[1].split(","), sys.argv[2]
    macfleet.init()
    for case in cases:
        run(case, out)
    macfleet.shutdown()


def run(case, out):
    rank, world = macfleet.rank(), macfleet.world_size()
    module = make(case)
    module = for_ranks(case, module)
    if case == "model-differs" and rank == world - 1:  # a class count read from a file that differs on its Mac
        module[4] = nn.Linear(16, 4)
    if case == "order":
        module.first = "a" if rank % 2 == 0 else "b"
    single = case.endswith("single")
    options = {} if single or case == "wide" else {"bucket_cap_mb": 1e-4, "first_bucket_mb": 1e-4}  # one bucket per module
    if case in ("fp16", "bf16"):
        options["compression"] = case
    if case == "unused-allowed":
        options["find_unused_parameters"] = True
    if case == "local-buffers":
        options["broadcast_buffers"] = False
    if case == "forward-sync-off":
        options["forward_sync_buffers"] = False
    if case in ("local-buffers", "forward-sync-off"):
        module.net[1].running_mean.fill_(rank)  # a rank's own (a statistic restored from its own checkpoint, say)
    if case.startswith("shares"):
        options["shares"] = [r + 1 for r in range(world)]
        if case == "shares-differ" and rank == 1:
            options["shares"] = [1] * world
    if case == "ddp-options":  # every rank names its own device, as DDP scripts do
        options.update(device_ids=[rank], output_device=rank, dim=0, init_sync=True, check_reduction=False,
                       gradient_as_bucket_view=True, static_graph=True, broadcast_buffers=None,
                       forward_sync_buffers=True)
    if case == "options-differ" and rank == 1:  # its buckets laid out with another cap
        options["bucket_cap_mb"] = 1.0
    if case == "fused-optimizer-before":
        for p in module.parameters():
            p.register_post_accumulate_grad_hook(fused_step)
    if case.startswith("two-models"):  # -one-bucket: the critic's single bucket is averaged after the generator's
        g = macfleet.DataParallel(module.g, **options)
        d = macfleet.DataParallel(module.d, **({} if case.endswith("one-bucket") else options))
        model = nn.Sequential(g, d)
    else:
        model = macfleet.DataParallel(module, **options)
        if case == "compiled":
            model = torch.compile(model, backend="aot_eager")
            torch._dynamo.config.error_on_recompile = True  # a graph compiled once serves every step
        modules = {name.rpartition(".")[0] for name, p in module.named_parameters() if p.requires_grad}
        if case == "wide":  # the first bucket (1 MiB) and the rest, lent only by the size of their gradients
            assert len(model.buckets) == 2 and model.buckets[1].flat.numel() * 4 > LEND_BYTES, model.buckets
        else:
            assert len(model.buckets) == (1 if single else len(modules)), len(model.buckets)
    if case == "fused-optimizer-after":
        for p in module.parameters():
            p.register_post_accumulate_grad_hook(fused_step)
    if case == "copied":
        model = copy.deepcopy(model)
        module = model.module
    if case == "ddp-options":
        assert model.broadcast_buffers is True and model.device_ids == [rank]
        try:
            model.register_comm_hook(None, lambda state, bucket: None)
        except macfleet.ConfigError as exc:
            assert "compression='fp16'" in str(exc), exc
        else:
            raise AssertionError("register_comm_hook was taken")
    lent = []  # per gradient, whether it came to its bucket's view (``single`` and ``wide`` only)
    if case in ("single", "wide") and world > 1:
        for b in model.buckets:
            for k, p in enumerate(b.params):  # a tensor hook runs before the gradient is accumulated
                p.register_hook(lambda grad, p=p, view=b.view(k): lent.append(p.grad is view))
    if case in ("local-buffers", "forward-sync-off"):  # the start's sync: none, or rank 0's
        started = macfleet.all_gather(module.net[1].running_mean)[:, 0].tolist()
        assert started == ([float(r) for r in range(world)] if case == "local-buffers" else [0.0] * world), started
    if case == "cast-after-wrap":
        model.double()
    opt = make_optimizer(case, model)
    x, y = oracle.make_batch()
    shard = slice(rank * oracle.BATCH // world, (rank + 1) * oracle.BATCH // world)
    if case == "shares":
        shares = options["shares"]
        part = oracle.BATCH // sum(shares)
        shard = slice(part * sum(shares[:rank]), part * sum(shares[:rank + 1]))
    xs, ys = x[shard], y[shard]
    for step in range(STEPS - 1 if case == "uneven" and rank == 1 else STEPS):
        if change(case, module, step, rank):
            opt = make_optimizer(case, model)  # the new head's parameters
            if case == "rewrap":
                old, model = model, macfleet.DataParallel(module, **options)
                try:
                    old(xs)
                except macfleet.ConfigError as exc:
                    assert "wrapped again" in str(exc), exc
                else:
                    raise AssertionError("the replaced DataParallel still trains")
        opt.zero_grad(set_to_none=case != "zero-in-place")
        if case == "shared-checkpoints-more" and step == 2:  # its layer in one more checkpoint than before
            module.runs = 3
        if case == "no_sync":
            half = len(xs) // 2
            with model.no_sync():
                (nn.functional.cross_entropy(model(xs[:half]), ys[:half]) / 2).backward()
            (nn.functional.cross_entropy(model(xs[half:]), ys[half:]) / 2).backward()
        elif case == "backward-raises":  # rank 1 catches the error of step 2 and tries to go on
            RaiseInBackward.armed = rank == 1 and step == 2
            try:
                nn.functional.cross_entropy(model(xs), ys).backward()
            except RuntimeError as exc:
                if "out of memory" not in str(exc):
                    raise
                print(f"caught {exc}", flush=True)
                continue
        elif case == "create-graph":  # for a second derivative through the gradients (AdaHessian's)
            nn.functional.cross_entropy(model(xs), ys).backward(create_graph=True)
        elif case == "compiled":  # a loss module made at every step, as scripts do: registers a buffer
            nn.CrossEntropyLoss()(model(xs), ys).backward()
        else:
            loss(case, model, xs, ys).backward()
        opt.step()
        if case == "validate-alone" and rank == 0:
            with torch.no_grad():
                model(x)
    if world > 1 and case not in NORM_CASES and os.environ.get("MACFLEET_SHM") != "0":
        # one host's ranks keep their buckets in memory they share and reduce them where they are;
        # these models' buckets are all small enough for the one-barrier path (wide's last is not), unless it is off
        one_barrier = os.environ.get("MACFLEET_SHM_GATHER_BYTES") != "1" and case != "wide"
        assert runtime().collectives.last_algorithm == \
            ("shared memory, one barrier" if one_barrier else "shared memory, in place")
    if lent:  # zero_grad(set_to_none=True) left no gradient: from the second step on (every gradient dense
        # in the first), the bucket lent its views at backward's start, and autograd added into them
        count = sum(len(b.params) for b in model.buckets)
        assert lent == [False] * count + [True] * (len(lent) - count) and len(lent) == STEPS * count, \
            (len(lent), count, [k for k, was in enumerate(lent) if was != (k >= count)][:10])  # the first wrong
    if case == "zero-in-place":  # nothing replaced the views, so nothing was copied into the buckets
        assert all(p.grad.data_ptr() == b.view(k).data_ptr() for b in model.buckets for k, p in enumerate(b.params))
    if case == "channels-last":  # the buffer the conversion made is the one rank 0's goes into
        module.mask.fill_(rank)
        model(xs).sum().backward()
        gathered = macfleet.all_gather(module.mask)
        assert all(torch.equal(g, gathered[0]) for g in gathered) and gathered[0].sum() == 0, gathered
        module.mask.fill_(1.0)  # as the oracle's, for the comparison of the saved state
    if case in ("buffers", "validate-alone"):  # the same input everywhere after rank 0's buffers arrive: identical buffers
        model(x)
        mean = model.module.net[1].running_mean
        gathered = macfleet.all_gather(mean)
        assert all(torch.equal(gathered[0], g) for g in gathered), "buffers differ between ranks"
    if case in ("local-buffers", "forward-sync-off"):  # each rank's statistics of its own shards alone
        gathered = macfleet.all_gather(module.net[1].running_mean)
        assert not any(torch.equal(gathered[i], gathered[j]) for i in range(world) for j in range(i)), gathered
    if rank == 0:
        torch.save(module.state_dict(), f"{out}/{case}.pt")


if __name__ == "__main__":
    main()
