"""Marks in time: CUDA events on a stream (device time) or the host clock (CPU-only torch).

A mark is taken at each phase edge. CUDA marks come from a pre-allocated pool, are recorded on
the stream the work runs on, and are read lazily with ``query()``: the training thread never
synchronises. On a machine without CUDA, marks are host ``perf_counter_ns`` values, so the
same code path runs in CI.

Device marks also have an epoch time (``epoch_ns``) on the clock of CUPTI's kernel timestamps
(CLOCK_REALTIME in CUPTI 13): an *anchor* event is recorded on an idle stream of its own,
where the device runs it as soon as the host enqueues it, so its epoch time is the host's
``time.time_ns()`` at that moment; any later mark is that plus ``elapsed_time`` between the
two events. A step's ``gpu_t_ns`` is when its work started on the device, however far the host
ran ahead. Anchors are renewed every ``anchor_every_s`` (``elapsed_time`` is a float32 of
milliseconds: ~1 us resolution over 10 s, ~60 us over 1,000 s).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
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

    def stream_key(self, stream: Any = None) -> int:
        """Which stream marks on ``stream`` (None: the current one) are taken on."""

    def wait(self, mark: Any) -> None:
        """Block until the mark completes (shutdown only)."""

    def epoch_ns(self, mark: Any) -> int | None:
        """Epoch ns at which a completed device mark ran; None for host marks."""


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

    def stream_key(self, stream: Any = None) -> int:
        """One host clock: every mark is on the same "stream"."""
        return 0

    def wait(self, mark: int) -> None:
        """Nothing to wait for."""

    def epoch_ns(self, mark: int) -> None:
        """Host marks have no device time."""
        return None


class CudaClock:
    """CUDA events with timing, recycled through a pool (no allocation per phase)."""

    device = True

    def __init__(self, torch_module, pool_size: int = 256, *,
                 now_ns: Callable[[], int] = time.time_ns, anchor_every_s: float = 10.0,
                 keep_anchors: int = 32):
        self.torch = torch_module
        self._pool = [torch_module.cuda.Event(enable_timing=True) for _ in range(pool_size)]
        self._now_ns = now_ns
        self._anchor_every_ns = int(anchor_every_s * 1e9)
        self._anchor_stream = None
        self._anchors: deque[tuple[Any, int]] = deque(maxlen=keep_anchors)
        self._anchor_lock = threading.Lock()

    def mark(self, stream: Any = None):
        """Record a pooled event on ``stream`` (the current stream by default)."""
        stream = stream if stream is not None else self.torch.cuda.current_stream()
        if self._anchor_stream is None:  # the first mark: anchor on its device, before it
            self.anchor(getattr(stream, "device", None))
        try:  # pop, not check-then-pop: the resolver thread shares the pool
            event = self._pool.pop()
        except IndexError:
            event = self.torch.cuda.Event(enable_timing=True)
        event.record(stream)
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

    def stream_key(self, stream: Any = None) -> int:
        """The CUDA stream handle marks on ``stream`` (default: the current one) go to."""
        stream = stream if stream is not None else self.torch.cuda.current_stream()
        return int(getattr(stream, "cuda_stream", id(stream)))

    def wait(self, mark) -> None:
        """Synchronise on one event (shutdown only)."""
        mark.synchronize()

    def anchor(self, device: Any = None) -> None:
        """Tie device time to epoch time: an event on an idle stream, and ``time.time_ns()``.

        The stream is made on ``device`` (the first mark's; default: the current device) once.
        """
        with self._anchor_lock:
            if self._anchor_stream is None:
                if device is None:
                    device = self.torch.cuda.current_device()
                self._anchor_stream = self.torch.cuda.Stream(device=device)
            event = self.torch.cuda.Event(enable_timing=True)
            event.record(self._anchor_stream)
            self._anchors.append((event, self._now_ns()))

    def epoch_ns(self, mark) -> int | None:
        """Epoch ns (CUPTI's clock) at which a completed ``mark`` ran on the device: the newest
        anchor before it plus ``elapsed_time``; None when no anchor precedes it."""
        anchors = list(self._anchors)
        if anchors and self._now_ns() - anchors[-1][1] > self._anchor_every_ns:
            self.anchor()  # for later marks; this one is placed by the anchors it follows
        for event, epoch in reversed(anchors):
            try:
                if not event.query():
                    continue
                elapsed_ms = event.elapsed_time(mark)
            except RuntimeError:  # e.g. a mark on another device: no device time for it
                continue
            if elapsed_ms >= 0:
                return epoch + round(elapsed_ms * 1e6)
        return None


def default_clock() -> Clock:
    """CUDA events when torch sees a GPU, else the host clock."""
    try:
        import torch
    except ImportError:
        return HostClock()
    if torch.cuda.is_available():
        return CudaClock(torch)
    return HostClock()
