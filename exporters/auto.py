"""Zero-code activation for ``argus run``: steps, the optimizer phase and DDP models' phases.

``argus run -- torchrun ... train.py`` puts a ``sitecustomize`` on PYTHONPATH that calls
``install()`` in every Python process it starts. Only training ranks (RANK set by torchrun,
not a compile worker) are traced. Nothing is imported eagerly; right after torch's modules
load:

- ``torch.optim.optimizer``: torch's global optimizer hooks are registered, so every
  optimizer's ``step()`` is timed as the ``optimizer`` phase and closes a training step;
- ``torch.nn.parallel.distributed``: every ``DistributedDataParallel`` model the script builds
  is instrumented as ``argus_exporters.instrument`` would (forward, backward, and its gradient
  all-reduce as ``dp-allreduce`` through a timed comm hook), so a straggler's slow forward is
  seen without a line of code.

Any failure here is logged and swallowed: a broken probe must never stop a job from starting.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import logging
import os
import sys
from collections.abc import Callable

logger = logging.getLogger("argus_exporters")
_OPTIMIZER = "torch.optim.optimizer"
_DDP = "torch.nn.parallel.distributed"


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

    def post(optimizer, args, kwargs):
        tracer.end_phase(tokens.pop(id(optimizer), None))
        tracer.step()

    optim.register_optimizer_step_pre_hook(pre)
    optim.register_optimizer_step_post_hook(post)


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


_AFTER_IMPORT: dict[str, Callable[[], None]] = {
    _OPTIMIZER: register_optimizer_hooks,
    _DDP: instrument_ddp_models,
}


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a callback right after a watched module executes (see ``_AFTER_IMPORT``)."""

    def __init__(self, callbacks: dict[str, Callable[[], None]]):
        self.callbacks = dict(callbacks)

    def find_spec(self, name, path, target=None):
        callback = self.callbacks.pop(name, None)
        if callback is None:
            return None
        if not self.callbacks:
            sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module):
            original(module)
            try:
                callback()
            except Exception:  # never break the import of torch
                logger.exception("argus: could not set up hooks after importing %s", name)

        loader.exec_module = exec_module
        return spec


def install() -> None:
    """Arrange for the hooks in this process (now if torch is loaded, else on its import)."""
    if not is_training_rank():
        return
    pending = {}
    for name, callback in _AFTER_IMPORT.items():
        if name in sys.modules:
            callback()
        else:
            pending[name] = callback
    if pending:
        sys.meta_path.insert(0, _AfterImport(pending))
