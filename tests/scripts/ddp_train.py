"""A small DDP training job for the exporter tests, started by torchrun (gloo, CPU).

ARGUS_TEST_INSTRUMENT=1 uses the one-line API (forward/backward/optimizer + DDP comm hook);
otherwise the script has no Argus code (for ``argus run``). ARGUS_TEST_SLOW_RANK=R makes rank
R sleep ARGUS_TEST_SLEEP_S in every forward: an injected compute straggler.
"""

import os
import time

import torch
import torch.distributed as dist

STEPS = int(os.environ.get("ARGUS_TEST_STEPS", "30"))
SLOW_RANK = int(os.environ.get("ARGUS_TEST_SLOW_RANK", "-1"))
SLEEP_S = float(os.environ.get("ARGUS_TEST_SLEEP_S", "0.03"))

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 8))
if rank == SLOW_RANK:
    net.register_forward_pre_hook(lambda module, args: time.sleep(SLEEP_S))
model = torch.nn.parallel.DistributedDataParallel(net)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
if os.environ.get("ARGUS_TEST_INSTRUMENT") == "1":
    import argus_exporters

    argus_exporters.instrument(model, optimizer)
    model.register_comm_hook(None, argus_exporters.ddp_comm_hook())
for _ in range(STEPS):
    loss = model(torch.randn(32, 64)).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
dist.destroy_process_group()
