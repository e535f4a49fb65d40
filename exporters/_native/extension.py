"""The collective hooks' extension module (``hooks.c``): built for this interpreter on first
use (``build.open_library``: ``ARGUS_HOOKS_LIB``, else the cache, else a compile of about
0.3 s; a damaged cached one is built again), loaded once per process."""

from __future__ import annotations

import importlib.util
import logging
import threading
from pathlib import Path
from types import ModuleType

from argus_exporters._native.build import (
    HOOKS_ABI,
    HOOKS_SOURCE,
    ShimUnavailableError,
    open_library,
)

logger = logging.getLogger("argus_exporters")
MODULE = "_argus_hooks"  # the name hooks.c's PyInit function gives the module

_lock = threading.Lock()
_tried = False
_module: ModuleType | None = None


def load_hooks() -> ModuleType | None:
    """``_argus_hooks`` (``TimedMethod``, ``TimedWait``, ``TimedOperator``,
    ``HostRecorder``), or None where it cannot be built or loaded here (no compiler, no
    Python.h, another ABI: said once in the log; the hooks' Python wrappers do the same work a
    few microseconds slower per collective)."""
    global _tried, _module
    with _lock:
        if not _tried:
            _tried = True
            _module = _load()
        return _module


def _load() -> ModuleType | None:
    try:
        module = open_library(HOOKS_SOURCE, _import)
        if module.abi() != HOOKS_ABI:
            raise ImportError(f"{module.__file__} has hooks ABI {module.abi()}, this Argus "
                              f"needs {HOOKS_ABI}")
    except (ShimUnavailableError, ImportError, OSError, AttributeError) as exc:
        logger.info("argus: the collective hooks run as Python (%s)", exc)
        return None
    return module


def _import(path: Path) -> ModuleType:
    """The extension module at ``path`` (ImportError where it does not load)."""
    spec = importlib.util.spec_from_file_location(MODULE, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} is not an extension module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
