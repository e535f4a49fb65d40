"""A small training job in any parallelism, for the collective-timing tests (torchrun, gloo, CPU).

ARGUS_TEST_PARALLEL picks how the model is split across the ranks:
- ``ddp``: DistributedDataParallel (its all-reduce through DDP's comm hook);
- ``fsdp2``: ``fully_shard`` on each layer and the model (all-gathers in forward and backward,
  reduce-scatters in backward);
- ``fsdp1``: ``FullyShardedDataParallel`` wrapping each linear layer and the model (the same
  collectives through FSDP1's own code; ``device_id`` cpu, which torch 2.13 needs on a machine
  without an accelerator);
- ``tp``: DTensor tensor parallelism on a ``("tp",)`` DeviceMesh (column- then row-wise
  linear layers: an all-reduce inside forward and one inside backward);
- ``pp``: a pipeline on a ``("dp", "pp")`` mesh of 2 x 2: two stages exchanging activations
  and gradients with send/recv (two micro-batches), gradients all-reduced over dp;
- ``pp4``: a pipeline of one stage per rank on a ``("pp",)`` mesh (GPipe, four micro-batches);
- ``moe``: an expert layer on an ``("ep",)`` mesh: tokens routed with ``all_to_all_single``
  there and back, in forward and backward (a custom autograd function, as MoE libraries do).

ARGUS_TEST_INSTRUMENT=1 uses the one-line API; otherwise the script has no Argus code (for
``argus run``). ARGUS_TEST_COMPILE=1 compiles the model (``torch.compile``, eager backend)
after ``instrument``, ARGUS_TEST_COMPILE=first before it (``instrument`` is then given the
compiled model), and ARGUS_TEST_COUNTERS=PATH writes dynamo's graph breaks to
PATH.RANK.json.
One fault on rank ARGUS_TEST_SLOW_RANK from step ARGUS_TEST_FROM on, ARGUS_TEST_SLEEP_S long:
``host`` (late: a sleep before every forward), ``compute`` (slow: extra matrix products in
every forward) or ``link`` (a slow link between ranks ARGUS_TEST_SLOW_RANK and the next one:
every send between the two takes ARGUS_TEST_SLEEP_S longer to deliver its data, which both
ends see; pipelines only, with the one-line API: the delay sits inside the timed send). The
number of steps is ARGUS_TEST_STEPS, the model's width ARGUS_TEST_WIDTH.
"""

import gc
import os
import time

import torch
import torch.distributed as dist

PARALLEL = os.environ.get("ARGUS_TEST_PARALLEL", "ddp")
STEPS = int(os.environ.get("ARGUS_TEST_STEPS", "40"))
SLOW_RANK = int(os.environ.get("ARGUS_TEST_SLOW_RANK", "-1"))
SLEEP_S = float(os.environ.get("ARGUS_TEST_SLEEP_S", "0.02"))
FAULT = os.environ.get("ARGUS_TEST_FAULT", "host")
FROM = int(os.environ.get("ARGUS_TEST_FROM", "10"))
WIDTH = int(os.environ.get("ARGUS_TEST_WIDTH", "256"))
MICRO_BATCHES = 4 if PARALLEL == "pp4" else 2

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
faulty = rank == SLOW_RANK
step = 0
torch.manual_seed(0)


def _burn(seconds: float) -> None:
    """Real extra compute for about ``seconds``: matrix products until the time is up."""
    a = torch.randn(48, 48)
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        a = torch.tanh(a @ a)


def _fault(kind: str) -> None:
    if faulty and kind == FAULT and step >= FROM:
        if kind == "host":
            time.sleep(SLEEP_S)
        else:
            _burn(SLEEP_S)


def _slow_the_link() -> None:
    """A degraded link between ranks SLOW_RANK and SLOW_RANK + 1: each send between them
    delivers its data SLEEP_S late (the sender's send and the receiver's recv both last
    longer), sends to any other rank are untouched."""
    from torch._C._distributed_c10d import ProcessGroup

    send = ProcessGroup.send
    link = {SLOW_RANK, SLOW_RANK + 1}

    def send_over_the_link(group, tensors, peer, *args):
        if step >= FROM and rank in link and dist.get_global_rank(group, peer) in link:
            time.sleep(SLEEP_S)
        return send(group, tensors, peer, *args)

    ProcessGroup.send = send_over_the_link


if FAULT == "link":
    _slow_the_link()


def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(WIDTH, 2 * WIDTH), torch.nn.GELU(),
                               torch.nn.Linear(2 * WIDTH, WIDTH))


class _AllToAll(torch.autograd.Function):
    """Tokens to their experts and back: all-to-all in forward, all-to-all in backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out = torch.empty_like(grad)
        dist.all_to_all_single(out, grad.contiguous(), group=ctx.group)
        return out, None


class _Moe(torch.nn.Module):
    def __init__(self, group):
        super().__init__()
        self.group = group
        self.router = torch.nn.Linear(WIDTH, WIDTH)
        self.expert = _mlp()

    def forward(self, x):
        routed = _AllToAll.apply(self.router(x), self.group)
        return _AllToAll.apply(self.expert(routed), self.group)


def _mesh(shape, names):
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", shape, mesh_dim_names=names)


pipeline = mesh = ep_mesh = None
if PARALLEL == "ddp":
    model = torch.nn.parallel.DistributedDataParallel(_mlp())
elif PARALLEL == "fsdp2":
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch before 2.6
        from torch.distributed._composable.fsdp import fully_shard
    model = _mlp()
    for layer in (model[0], model[2]):
        fully_shard(layer)
    fully_shard(model)
elif PARALLEL == "fsdp1":
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    model = FullyShardedDataParallel(_mlp(), device_id=torch.device("cpu"), use_orig_params=True,
                                     auto_wrap_policy=ModuleWrapPolicy({torch.nn.Linear}))
elif PARALLEL == "tp":
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    model = parallelize_module(_mlp(), _mesh((world,), ("tp",)),
                               {"0": ColwiseParallel(), "2": RowwiseParallel()})
elif PARALLEL == "pp":
    mesh = _mesh((world // 2, 2), ("dp", "pp"))
    stage = mesh.get_coordinate()[1]
    pipeline = (mesh.get_group("pp"), mesh.get_group("dp"), stage)
    model = _mlp()
elif PARALLEL == "pp4":
    mesh = _mesh((world,), ("pp",))
    pipeline = (mesh.get_group("pp"), None, mesh.get_coordinate()[0])
    model = _mlp()
elif PARALLEL == "moe":
    ep_mesh = _mesh((world,), ("ep",))
    model = _Moe(ep_mesh.get_group("ep"))
else:
    raise SystemExit(f"ARGUS_TEST_PARALLEL={PARALLEL!r}: expected ddp, fsdp1, fsdp2, tp, pp, "
                     "pp4 or moe")
first = {"ddp": lambda: model.module[0], "fsdp1": lambda: model.module[0],
         "moe": lambda: model.router}.get(PARALLEL, lambda: model[0])()
first.register_forward_pre_hook(lambda module, args: _fault("compute"))  # inside forward
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
COMPILE = os.environ.get("ARGUS_TEST_COMPILE", "")
if COMPILE == "first":
    model = torch.compile(model, backend="eager")
if os.environ.get("ARGUS_TEST_INSTRUMENT") == "1":
    import argus_exporters

    argus_exporters.instrument(model, optimizer)
if COMPILE == "1":
    model = torch.compile(model, backend="eager")


def _pipeline_step(batch: torch.Tensor) -> None:
    """GPipe: every micro-batch's forward (activations received from the previous stage and
    sent to the next), then every backward (gradients the other way); grads over dp."""
    pp_group, dp_group, stage = pipeline
    stages = pp_group.size()
    before = dist.get_global_rank(pp_group, stage - 1) if stage > 0 else None
    after = dist.get_global_rank(pp_group, stage + 1) if stage < stages - 1 else None
    outputs, inputs = [], []
    for micro in batch.chunk(MICRO_BATCHES):
        if before is not None:
            micro = torch.empty_like(micro)
            dist.recv(micro, before, group=pp_group)
            micro.requires_grad_(True)
            inputs.append(micro)
        out = model(micro)
        if after is not None:
            dist.send(out.detach(), after, group=pp_group)
        outputs.append(out)
    for i, out in enumerate(outputs):
        if after is None:
            out.pow(2).mean().backward()
        else:
            grad = torch.empty_like(out)
            dist.recv(grad, after, group=pp_group)
            out.backward(grad)
        if before is not None:
            dist.send(inputs[i].grad, before, group=pp_group)
    if dp_group is not None:
        for param in model.parameters():
            dist.all_reduce(param.grad, group=dp_group)


for step in range(STEPS):
    torch.manual_seed(1000 + step if PARALLEL == "tp" else 1000 * rank + step)
    batch = torch.randn(32, WIDTH)
    _fault("host")
    if pipeline is not None:
        _pipeline_step(batch)
    else:
        model(batch).pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad()
if os.environ.get("ARGUS_TEST_COUNTERS"):  # dynamo's graph breaks, for the compile checks
    import json

    from torch._dynamo.utils import counters

    with open(f"{os.environ['ARGUS_TEST_COUNTERS']}.{rank}.json", "w") as out:
        json.dump({"graph_breaks": sum(counters["graph_break"].values()),
                   "reasons": sorted(counters["graph_break"])}, out)
# nothing may hold a process group past destroy_process_group (the model and its compiled
# code, the meshes, the pipeline): a group destroyed at interpreter exit can abort the
# process under load ("terminate called without an active exception")
model = optimizer = first = pipeline = mesh = ep_mesh = None
if COMPILE:
    torch._dynamo.reset()
gc.collect()
dist.destroy_process_group()
