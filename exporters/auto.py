"""Zero-code activation for ``argus run``: steps, the optimizer phase and DDP models' phases.

``argus run -- torchrun ... train.py`` puts a ``sitecustomize`` on PYTHONPATH that calls
``install()`` in every Python process it starts. Only training ranks (RANK set by torchrun,
not a compile worker) are traced. Nothing is imported eagerly; right after torch's modules
load:

- ``torch.optim.optimizer``: torch's global optimizer hooks are registered, so every
  optimizer's ``step()`` is timed as the ``optimizer`` phase and closes a training step; a
  model that is no DDP (FSDP, tensor or pipeline parallel) is found in the second step (the
  outermost module holding the optimizer's parameters) and instrumented from the third;
- ``torch.nn.parallel.distributed``: every ``DistributedDataParallel`` model the script builds
  is instrumented as ``argus_exporters.instrument`` would (forward, backward, and its gradient
  all-reduce as ``dp-allreduce`` through a timed comm hook), so a straggler's slow forward is
  seen without a line of code;
- ``torch.distributed.device_mesh``: every collective is timed as ``{axis}-{op}`` and every
  named mesh names its groups (``collectives.py``).

Any failure here is logged and swallowed: a broken probe must never stop a job from starting.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable

from argus_exporters.imports import after_import

logger = logging.getLogger("argus_exporters")
_OPTIMIZER = "torch.optim.optimizer"
_DDP = "torch.nn.parallel.distributed"
_MESH = "torch.distributed.device_mesh"  # imported after c10d: collectives can be patched


def is_training_rank() -> bool:
    """True in a torchrun worker; False in the launcher and in compile workers."""
    if "RANK" not in os.environ and "LOCAL_RANK" not in os.environ:
        return False
    argv0 = sys.argv[0] if sys.argv else ""
    return "compile_worker" not in argv0 and "_inductor" not in argv0


def register_optimizer_hooks() -> None:
    """Global optimizer step hooks: optimizer phase and the step boundary."""
    import torch.optim.optimizer as optim

    import argus_exporters

    tracer = argus_exporters.start()
    if not tracer.enabled:
        return
    if not tracer.model_instrumented:
        tracer.open_at_previous_end = True
    tokens: dict[int, object] = {}

    def pre(optimizer, args, kwargs):
        tokens[id(optimizer)] = tracer.begin_phase("optimizer")

    roots: list[_RootModules] = []  # made at the first step if no DDP model was instrumented

    def post(optimizer, args, kwargs):
        tracer.end_phase(tokens.pop(id(optimizer), None))
        tracer.step()
        if not roots:
            roots.append(_RootModules(active=not tracer.model_instrumented))
        elif roots[0].watching:
            roots[0].instrument(optimizer, tracer)

    optim.register_optimizer_step_pre_hook(pre)
    optim.register_optimizer_step_post_hook(post)


class _RootModules:
    """Finds the model of a script whose model is no DDP (FSDP, DTensor, a pipeline stage):
    during the second step, global module hooks note the outermost modules called; at its
    optimizer step those holding the optimizer's parameters get ``instrument``'s hooks and
    the global hooks go (they would cost a call per submodule). A DDP job never gets them."""

    def __init__(self, active: bool):
        self.depth = 0
        self.seen: dict[int, object] = {}
        self.watching = active
        self.handles = []
        if active:
            from torch.nn.modules import module

            self.handles = [module.register_module_forward_pre_hook(self._enter),
                            module.register_module_forward_hook(self._leave)]

    def _enter(self, module, args):
        if self.depth == 0:
            self.seen.setdefault(id(module), module)
        self.depth += 1

    def _leave(self, module, args, output):
        self.depth = max(self.depth - 1, 0)

    def instrument(self, optimizer, tracer) -> None:
        from argus_exporters import hooks

        self.watching = False
        for handle in self.handles:
            handle.remove()
        if tracer.model_instrumented:  # a DDP model: already done
            return
        owned = {id(p) for group in optimizer.param_groups for p in group["params"]}
        for module in self.seen.values():
            if any(id(p) in owned for p in module.parameters()):
                hooks.instrument(module, None, tracer)
                tracer.model_instrumented = True
                tracer.open_at_previous_end = False
        self.seen.clear()


def instrument_ddp_models() -> None:
    """Instrument every DistributedDataParallel model when it is built."""
    from torch.nn.parallel import distributed

    import argus_exporters
    from argus_exporters import hooks

    ddp = distributed.DistributedDataParallel
    if getattr(ddp.__init__, "_argus", False):
        return
    original = ddp.__init__

    @functools.wraps(original)
    def init_and_instrument(self, *args, **kwargs):
        original(self, *args, **kwargs)
        try:
            tracer = argus_exporters.start()
            if tracer.enabled:
                hooks.instrument(self, None, tracer)
                # Steps now open at their first phase: host time before it is host time.
                tracer.open_at_previous_end = False
                tracer.model_instrumented = True
        except Exception:  # never break the training script
            logger.exception("argus: could not instrument the DDP model")

    init_and_instrument._argus = True  # type: ignore[attr-defined]
    ddp.__init__ = init_and_instrument


def time_collectives() -> None:
    """Time every torch.distributed collective (``collectives.py``) and learn meshes."""
    import argus_exporters
    from argus_exporters import collectives

    collectives.install(argus_exporters.start())


_AFTER_IMPORT: dict[str, Callable[[], None]] = {
    _OPTIMIZER: register_optimizer_hooks,
    _DDP: instrument_ddp_models,
    _MESH: time_collectives,
}


def install() -> None:
    """Arrange for the hooks in this process (now if torch is loaded, else on its import)."""
    if not is_training_rank():
        return
    for name, callback in _AFTER_IMPORT.items():
        after_import(name, callback)
