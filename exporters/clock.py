"""Marks in time: CUDA events on a stream (device time) or the host clock (CPU-only torch).

A mark is taken at each phase edge. CUDA marks come from a pre-allocated pool, are recorded on
the stream the work runs on, and are read lazily with ``query()``: the training thread never
synchronises. On a machine without CUDA, marks are host ``perf_counter_ns`` values, so the
same code path runs in CI.
"""

from __future__ import annotations

import time
from typing import Any, Protocol


class Clock(Protocol):
    """Takes marks and turns pairs of completed marks into seconds."""

    device: bool  # True when marks measure device time

    def mark(self, stream: Any = None) -> Any:
        """Record a mark now (on ``stream`` for device clocks)."""

    def ready(self, mark: Any) -> bool:
        """Whether the mark has completed (never blocks)."""

    def seconds(self, start: Any, end: Any) -> float:
        """Seconds between two completed marks."""

    def release(self, mark: Any) -> None:
        """Return a mark to the pool."""

    def wait(self, mark: Any) -> None:
        """Block until the mark completes (shutdown only)."""


class HostClock:
    """Host monotonic clock: marks are nanosecond integers."""

    device = False

    def mark(self, stream: Any = None) -> int:
        """Current ``perf_counter_ns``."""
        return time.perf_counter_ns()

    def ready(self, mark: int) -> bool:
        """Host marks are complete when taken."""
        return True

    def seconds(self, start: int, end: int) -> float:
        """Difference in seconds."""
        return (end - start) * 1e-9

    def release(self, mark: int) -> None:
        """Nothing to return."""

    def wait(self, mark: int) -> None:
        """Nothing to wait for."""


class CudaClock:
    """CUDA events with timing, recycled through a pool (no allocation per phase)."""

    device = True

    def __init__(self, torch_module, pool_size: int = 256):
        self.torch = torch_module
        self._pool = [torch_module.cuda.Event(enable_timing=True) for _ in range(pool_size)]

    def mark(self, stream: Any = None):
        """Record a pooled event on ``stream`` (the current stream by default)."""
        event = self._pool.pop() if self._pool else self.torch.cuda.Event(enable_timing=True)
        event.record(stream if stream is not None else self.torch.cuda.current_stream())
        return event

    def ready(self, mark) -> bool:
        """``event.query()``: never blocks."""
        return bool(mark.query())

    def seconds(self, start, end) -> float:
        """``elapsed_time`` is in milliseconds."""
        return start.elapsed_time(end) * 1e-3

    def release(self, mark) -> None:
        """Back to the pool."""
        self._pool.append(mark)

    def wait(self, mark) -> None:
        """Synchronise on one event (shutdown only)."""
        mark.synchronize()


def default_clock() -> Clock:
    """CUDA events when torch sees a GPU, else the host clock."""
    try:
        import torch
    except ImportError:
        return HostClock()
    if torch.cuda.is_available():
        return CudaClock(torch)
    return HostClock()
