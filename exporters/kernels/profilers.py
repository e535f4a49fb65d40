"""Other CUPTI clients in this process: nsys/ncu, torch.profiler (kineto), torch's CUPTI monitor.

CUPTI has one set of activity-buffer callbacks per process. When another client takes CUPTI
the probe steps aside for the rest of the process (``busy``) instead of fighting over it.
torch.profiler registers kineto's callbacks when it *prepares* (the warm-up of a schedule),
before ``_profiler_enabled()`` turns true, so the probe also watches ``_prepare_profiler``:
``watch_profiler_prepare`` wraps torch's module-level function once per process and tells
every live probe first, which then stops toggling and flushing while kineto owns CUPTI.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any, Protocol


class _Yielding(Protocol):
    def yield_to_profiler(self, reason: str) -> None:
        """Stop touching CUPTI for the rest of the process."""


_watchers: weakref.WeakSet = weakref.WeakSet()
_wrap_lock = threading.Lock()
PREPARE_REASON = "torch.profiler is preparing (warm-up): kineto owns CUPTI now"


def profiler_enabled_check() -> Callable[[], bool] | None:
    """torch's "is the autograd/kineto profiler recording" function, if torch is loaded."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        return torch._C._autograd._profiler_enabled
    except AttributeError:
        return None


def torch_cupti_monitor_running() -> bool:
    """Whether torch's experimental CUPTI monitor (``torch.profiler._cupti_monitor``) runs."""
    module = sys.modules.get("torch.profiler._cupti_monitor")
    if module is None:
        return False
    try:
        return module.get_monitor() is not None
    except Exception:
        return False


def foreign_profiler(env: Mapping[str, str]) -> str | None:
    """Why another CUPTI client holds CUPTI right now (nsys/ncu injected, torch.profiler on)."""
    injected = env.get("CUDA_INJECTION64_PATH")
    if injected:
        return f"another CUPTI tool is injected (CUDA_INJECTION64_PATH={injected}: nsys/ncu)"
    check = profiler_enabled_check()
    if check is not None:
        try:
            if check():
                return "torch.profiler is recording (kineto owns CUPTI's activity buffers)"
        except Exception:
            return None
    if torch_cupti_monitor_running():
        return "torch's CUPTI monitor (torch.profiler._cupti_monitor) is running"
    return None


def watch_profiler_prepare(probe: _Yielding) -> bool:
    """Call ``probe.yield_to_profiler`` before torch.profiler prepares kineto; False without
    torch.autograd.profiler (nothing to watch)."""
    module = sys.modules.get("torch.autograd.profiler")
    if module is None or not hasattr(module, "_prepare_profiler"):
        return False
    with _wrap_lock:
        _watchers.add(probe)
        original = module._prepare_profiler
        if getattr(original, "__argus_wrapped__", False):
            return True

        def _prepare_profiler(*args: Any, **kwargs: Any) -> Any:
            for watcher in list(_watchers):
                with contextlib.suppress(Exception):  # never break the profiler
                    watcher.yield_to_profiler(PREPARE_REASON)
            return original(*args, **kwargs)

        _prepare_profiler.__argus_wrapped__ = True  # type: ignore[attr-defined]
        _prepare_profiler.__wrapped__ = original  # type: ignore[attr-defined]
        module._prepare_profiler = _prepare_profiler
    return True
