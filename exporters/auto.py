"""Zero-code activation for ``argus run``: steps and the optimizer phase from global hooks.

``argus run -- torchrun ... train.py`` puts a ``sitecustomize`` on PYTHONPATH that calls
``install()`` in every Python process it starts. Only training ranks (RANK set by torchrun,
not a compile worker) are traced. Nothing is imported eagerly: when ``torch.optim`` is first
imported, torch's global optimizer hooks are registered, so every optimizer's ``step()`` is
timed as the ``optimizer`` phase and closes a training step. Any failure here is logged and
swallowed: a broken probe must never stop a job from starting.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import os
import sys

logger = logging.getLogger("argus_exporters")
_TARGET = "torch.optim.optimizer"


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
    tracer.open_at_previous_end = True
    tokens: dict[int, object] = {}

    def pre(optimizer, args, kwargs):
        tokens[id(optimizer)] = tracer.begin_phase("optimizer")

    def post(optimizer, args, kwargs):
        tracer.end_phase(tokens.pop(id(optimizer), None))
        tracer.step()

    optim.register_optimizer_step_pre_hook(pre)
    optim.register_optimizer_step_post_hook(post)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``register_optimizer_hooks`` right after ``torch.optim.optimizer`` executes."""

    def find_spec(self, name, path, target=None):
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module):
            original(module)
            try:
                register_optimizer_hooks()
            except Exception:  # never break the import of torch
                logger.exception("argus: could not register optimizer hooks")

        loader.exec_module = exec_module
        return spec


def install() -> None:
    """Arrange for the hooks in this process (now if torch.optim is loaded, else on import)."""
    if not is_training_rank():
        return
    if _TARGET in sys.modules:
        register_optimizer_hooks()
    else:
        sys.meta_path.insert(0, _AfterImport())
