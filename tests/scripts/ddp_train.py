"""A small DDP training job for the exporter tests and the real-job corpus (torchrun, gloo, CPU).

ARGUS_TEST_INSTRUMENT=1 uses the one-line API (forward/backward/optimizer + DDP comm hook);
otherwise the script has no Argus code (for ``argus run``). ARGUS_TEST_WIDTH sets the model's
hidden width (step time), ARGUS_TEST_STEPS the number of steps (or, with ARGUS_TEST_SECONDS,
as many as fit in that long).

One injected fault, on rank ARGUS_TEST_SLOW_RANK (none when unset), of ARGUS_TEST_SLEEP_S
seconds, from step ARGUS_TEST_FROM on, of kind ARGUS_TEST_FAULT:
- ``forward`` (the default): a sleep in every forward (slow compute in forward);
- ``backward``: a sleep in every backward (a hook on the first layer's gradient);
- ``host``: a sleep before every forward, outside every phase (a host stall each step);
- ``data``: a slow data loader (the sleep while the batch is made);
- ``stall``: a sleep before the forward of the steps in ARGUS_TEST_STALL_STEPS only;
- ``tail``: a sleep in the forward of a random ARGUS_TEST_TAIL_SHARE of the steps;
- ``hog``: a busy process pinned to the rank's core (ranks are pinned one per core), started
  at step ARGUS_TEST_FROM.
"""

import gc
import os
import random
import subprocess
import sys
import time

import torch
import torch.distributed as dist

STEPS = int(os.environ.get("ARGUS_TEST_STEPS", "30"))
SECONDS = float(os.environ.get("ARGUS_TEST_SECONDS", "0"))
WIDTH = int(os.environ.get("ARGUS_TEST_WIDTH", "64"))
SLOW_RANK = int(os.environ.get("ARGUS_TEST_SLOW_RANK", "-1"))
SLEEP_S = float(os.environ.get("ARGUS_TEST_SLEEP_S", "0.03"))
FAULT = os.environ.get("ARGUS_TEST_FAULT", "forward")
FROM = int(os.environ.get("ARGUS_TEST_FROM", "0"))
STALL_STEPS = {int(s) for s in os.environ.get("ARGUS_TEST_STALL_STEPS", "").split(",") if s}
TAIL_SHARE = float(os.environ.get("ARGUS_TEST_TAIL_SHARE", "0.1"))

dist.init_process_group("gloo")
rank = dist.get_rank()
faulty = rank == SLOW_RANK
torch.manual_seed(0)
tail = random.Random(rank)
step = 0


def _sleep_when(active: bool) -> None:
    if faulty and active and step >= FROM:
        time.sleep(SLEEP_S)


if os.environ.get("ARGUS_TEST_PIN") == "1" and hasattr(os, "sched_setaffinity"):
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[rank % len(cores)]})
hog = None


def _start_hog() -> subprocess.Popen:
    """A busy process on the first core this rank may run on."""
    core = sorted(os.sched_getaffinity(0))[0]
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(busy.pid, {core})
    return busy

net = torch.nn.Sequential(torch.nn.Linear(WIDTH, 2 * WIDTH), torch.nn.GELU(),
                          torch.nn.Linear(2 * WIDTH, 8))
net.register_forward_pre_hook(
    lambda module, args: _sleep_when(FAULT == "forward"
                                     or (FAULT == "tail" and tail.random() < TAIL_SHARE)))
net[0].weight.register_hook(lambda grad: _sleep_when(FAULT == "backward"))
model = torch.nn.parallel.DistributedDataParallel(net)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
if os.environ.get("ARGUS_TEST_INSTRUMENT") == "1":
    import argus_exporters

    argus_exporters.instrument(model, optimizer)
    model.register_comm_hook(None, argus_exporters.ddp_comm_hook())
started = time.monotonic()
for step in range(1 << 40 if SECONDS else STEPS):
    if SECONDS and step % 50 == 0:  # all stop at the same step: rank 0 decides (a sync
        # point once in 50 steps, as a job's periodic logging is)
        stop = torch.tensor([float(time.monotonic() - started >= SECONDS)])
        dist.broadcast(stop, 0)
        if stop.item():
            break
    if faulty and FAULT == "hog" and hog is None and step >= FROM:
        hog = _start_hog()
    _sleep_when(FAULT == "data")
    batch = torch.randn(32, WIDTH)
    _sleep_when(FAULT == "host" or (FAULT == "stall" and step in STALL_STEPS))
    loss = model(batch).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
# nothing may hold the process group past destroy_process_group (DDP's reducer): a group
# destroyed at interpreter exit can abort the process under load ("terminate called without
# an active exception")
model = optimizer = net = loss = None
gc.collect()
dist.destroy_process_group()
if hog is not None:
    hog.kill()
