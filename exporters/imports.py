"""Run a callback right after a module is imported (now, if it already is).

Hooks that patch torch must not import torch's modules while torch itself is importing (a
circular import); they wait for the module they patch instead.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
from collections.abc import Callable

logger = logging.getLogger("argus_exporters")


def after_import(name: str, callback: Callable[[], None]) -> None:
    """Call ``callback`` once module ``name`` has executed: now if it is loaded, else then."""
    if name in sys.modules:
        callback()
    else:
        sys.meta_path.insert(0, _AfterImport({name: callback}))


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a callback right after a watched module executes."""

    def __init__(self, callbacks: dict[str, Callable[[], None]]):
        self.callbacks = dict(callbacks)

    def find_spec(self, name, path, target=None):
        callback = self.callbacks.pop(name, None)
        if callback is None:
            return None
        if not self.callbacks and self in sys.meta_path:
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
