"""Marks in time: CUDA events on a stream (device time) or the host clock (CPU-only torch).

A mark is taken at each phase edge. CUDA marks come from a pre-allocated pool, are recorded on
the stream the work runs on, and are read lazily by the resolver thread, in bulk
(``ready_all``, ``offsets``): the training thread never synchronises. Reading goes through
``cudaEventQuery`` / ``cudaEventElapsedTime`` called with ctypes on the events' raw handles
(``CudartEvents``: the GIL is released during each call, so the resolver never holds it for
the driver's time), or through torch's event methods when libcudart cannot be loaded
(``TorchEvents``, which hold the GIL). On a machine without CUDA, marks are host
``perf_counter_ns`` values, so the same code path runs in CI.

Device marks also have an epoch time (``epoch_ns``) on the clock of CUPTI's kernel timestamps
(CLOCK_REALTIME in CUPTI 13): an *anchor* event is recorded on an idle stream of its own,
where the device runs it as soon as the host enqueues it, so its epoch time is the host's
``time.time_ns()`` at that moment; any later mark is that plus ``elapsed_time`` between the
two events. A step's ``gpu_t_ns`` is when its work started on the device, however far the host
ran ahead. Anchors are renewed every ``anchor_every_s`` (``elapsed_time`` is a float32 of
milliseconds: ~1 us resolution over 10 s, ~60 us over 1,000 s).
"""

from __future__ import annotations

import ctypes
import ctypes.util
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

    def remark(self, mark: Any, stream: Any = None) -> Any:
        """Move ``mark`` to now (a device clock records the same event again)."""

    def ready(self, mark: Any) -> bool:
        """Whether the mark has completed (never blocks)."""

    def ready_all(self, marks: list[Any]) -> bool:
        """Whether every mark has completed (never blocks)."""

    def offsets(self, marks: list[Any]) -> list[float]:
        """Seconds from ``marks[0]`` to each of the completed ``marks``."""

    def seconds(self, start: Any, end: Any) -> float:
        """Seconds between two completed marks."""

    def release(self, mark: Any) -> None:
        """Return a mark to the pool."""

    def current_stream(self) -> Any:
        """The stream marks without one go to (None for host clocks)."""

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

    def remark(self, mark: int, stream: Any = None) -> int:
        """A new mark now (host marks are values: nothing to reuse)."""
        return self.mark(stream)

    def ready(self, mark: int) -> bool:
        """Host marks are complete when taken."""
        return True

    def ready_all(self, marks: list[int]) -> bool:
        """Host marks are complete when taken."""
        return True

    def offsets(self, marks: list[int]) -> list[float]:
        """Seconds from ``marks[0]`` to each mark."""
        first = marks[0]
        return [(mark - first) * 1e-9 for mark in marks]

    def seconds(self, start: int, end: int) -> float:
        """Difference in seconds."""
        return (end - start) * 1e-9

    def release(self, mark: int) -> None:
        """Nothing to return."""

    def release_all(self, marks: list[int]) -> None:
        """Nothing to return."""

    def current_stream(self) -> None:
        """No streams on the host."""
        return None

    def stream_key(self, stream: Any = None) -> int:
        """One host clock: every mark is on the same "stream"."""
        return 0

    def wait(self, mark: int) -> None:
        """Nothing to wait for."""

    def epoch_ns(self, mark: int) -> None:
        """Host marks have no device time."""
        return None


class TorchEvents:
    """Reads ``torch.cuda.Event`` objects through torch's own methods (they hold the GIL
    during the CUDA call): the fallback when the CUDA runtime cannot be loaded with ctypes."""

    releases_gil = False

    def query(self, event: Any) -> bool:
        """Whether the event has completed."""
        return bool(event.query())

    def elapsed_ms(self, start: Any, end: Any) -> float:
        """Milliseconds between two completed events (RuntimeError when CUDA refuses)."""
        return start.elapsed_time(end)


CUDA_SUCCESS = 0
CUDA_ERROR_NOT_READY = 600


class CudartEvents:
    """Reads events with ``cudaEventQuery`` / ``cudaEventElapsedTime`` through ctypes, on the
    raw handles (``torch.cuda.Event.cuda_event``). ctypes releases the GIL for the length of
    each call, so the resolver thread holds it only for the Python around the calls (well
    under a microsecond each) and never for the driver's time."""

    releases_gil = True

    def __init__(self, library: Any):
        self.library = library
        self._query = library.cudaEventQuery
        self._query.argtypes = [ctypes.c_void_p]
        self._query.restype = ctypes.c_int
        self._elapsed = library.cudaEventElapsedTime
        self._elapsed.argtypes = [ctypes.POINTER(ctypes.c_float), ctypes.c_void_p,
                                  ctypes.c_void_p]
        self._elapsed.restype = ctypes.c_int
        self._ms = ctypes.c_float()
        self._ms_ref = ctypes.byref(self._ms)
        self._lock = threading.Lock()  # one output float: one caller at a time
        self._set_device = getattr(library, "cudaSetDevice", None)
        self._device: int | None = None
        self._bound = threading.local()  # the device each calling thread was set to

    def bind(self, device: int) -> None:
        """The device the events live on: each reading thread is set to it once
        (``cudaSetDevice``), so the runtime never makes a context on device 0 for a rank
        that trains on another one."""
        self._device = device

    def _on_device(self) -> None:
        device = self._device
        if device is not None and self._set_device is not None and getattr(
                self._bound, "device", None) != device:
            self._set_device(device)
            self._bound.device = device

    def query(self, event: Any) -> bool:
        """``cudaEventQuery``: complete (0), not yet (600); any other code counts as complete
        (an event never recorded, or an error that ``elapsed_ms`` then reports)."""
        self._on_device()
        return self._query(event.cuda_event) != CUDA_ERROR_NOT_READY

    def elapsed_ms(self, start: Any, end: Any) -> float:
        """``cudaEventElapsedTime``; RuntimeError with CUDA's code when it fails."""
        self._on_device()
        with self._lock:
            code = self._elapsed(self._ms_ref, start.cuda_event, end.cuda_event)
            if code != CUDA_SUCCESS:
                raise RuntimeError(f"cudaEventElapsedTime failed with CUDA error {code}")
            return self._ms.value


CUDART_NAMES = ("libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so")


def _loaded_cudart() -> list[str]:
    """Paths of the CUDA runtimes already mapped into this process (torch's own first)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libcudart" in line}
    except OSError:
        return []
    return sorted(p for p in paths if p.startswith("/"))


def load_cudart(candidates: list[str] | None = None) -> Any | None:
    """The CUDA runtime as a ``ctypes.CDLL`` (the copy torch loaded when there is one), or
    None when none can be loaded or it lacks the event functions."""
    if candidates is None:
        found = ctypes.util.find_library("cudart")
        candidates = [*_loaded_cudart(), *CUDART_NAMES, *([found] if found else [])]
    for name in candidates:
        try:
            library = ctypes.CDLL(name)
            library.cudaEventQuery  # noqa: B018  (both must exist)
            library.cudaEventElapsedTime  # noqa: B018
        except (OSError, AttributeError):
            continue
        return library
    return None


def event_reader(events: str | Any = "auto") -> TorchEvents | CudartEvents:
    """How a CudaClock reads its events: ``"auto"`` (ctypes when libcudart loads, else
    torch's methods), ``"torch"``, or a reader object."""
    if events == "torch":
        return TorchEvents()
    if events == "auto":
        library = load_cudart()
        return CudartEvents(library) if library is not None else TorchEvents()
    return events


class CudaClock:
    """CUDA events with timing, recycled through a pool (no allocation per phase).

    The training thread only records events (``mark``); the resolver thread reads them in
    bulk (``ready_all``, ``offsets``) through ``reader``: the CUDA runtime via ctypes, which
    releases the GIL during each call, or torch's methods when libcudart cannot be loaded.
    """

    device = True

    def __init__(self, torch_module, pool_size: int = 256, *,
                 now_ns: Callable[[], int] = time.time_ns, anchor_every_s: float = 10.0,
                 keep_anchors: int = 32, events: str | Any = "auto"):
        self.torch = torch_module
        self._pool = [torch_module.cuda.Event(enable_timing=True) for _ in range(pool_size)]
        if events == "auto" and not hasattr(type(self._pool[0] if self._pool else
                                                 torch_module.cuda.Event(enable_timing=True)),
                                            "cuda_event"):
            events = "torch"  # events without raw handles (a stand-in torch): its methods
        self.reader = event_reader(events)
        self._now_ns = now_ns
        self._anchor_every_ns = int(anchor_every_s * 1e9)
        self._anchor_stream = None
        self._anchors: deque[tuple[Any, int]] = deque(maxlen=keep_anchors)
        self._anchor_lock = threading.Lock()
        self._anchor_done: tuple[Any, int] | None = None  # the newest anchor seen complete

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

    def remark(self, mark, stream: Any = None):
        """Record ``mark`` again, now (a span's end moving to its latest part): no new event."""
        mark.record(stream if stream is not None else self.torch.cuda.current_stream())
        return mark

    def ready(self, mark) -> bool:
        """Whether the event has completed: never blocks."""
        return self.reader.query(mark)

    def ready_all(self, marks) -> bool:
        """Whether every event of ``marks`` has completed (stops at the first that has not)."""
        query = self.reader.query
        for mark in marks:  # noqa: SIM110  (no generator for the one or two marks it gets)
            if not query(mark):
                return False
        return True

    def seconds(self, start, end) -> float:
        """``elapsed_time`` is in milliseconds."""
        return self.reader.elapsed_ms(start, end) * 1e-3

    def offsets(self, marks) -> list[float]:
        """Seconds from ``marks[0]`` to each of ``marks`` (completed), one call per mark."""
        elapsed, first = self.reader.elapsed_ms, marks[0]
        return [0.0, *(elapsed(first, mark) * 1e-3 for mark in marks[1:])]

    def release(self, mark) -> None:
        """Back to the pool."""
        self._pool.append(mark)

    def release_all(self, marks) -> None:
        """Every one of ``marks`` back to the pool."""
        self._pool.extend(marks)

    def current_stream(self) -> Any:
        """The current CUDA stream (resolved once per mark by the tracer)."""
        return self.torch.cuda.current_stream()

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
                bind = getattr(self.reader, "bind", None)
                index = getattr(device, "index", device)
                if bind is not None and isinstance(index, int):
                    bind(index)
            event = self.torch.cuda.Event(enable_timing=True)
            event.record(self._anchor_stream)
            self._anchors.append((event, self._now_ns()))

    def epoch_ns(self, mark) -> int | None:
        """Epoch ns (CUPTI's clock) at which a completed ``mark`` ran on the device: the newest
        anchor before it plus ``elapsed_time``; None when no anchor precedes it."""
        anchors = list(self._anchors)
        if anchors and self._now_ns() - anchors[-1][1] > self._anchor_every_ns:
            self.anchor()  # for later marks; this one is placed by the anchors it follows
        reader = self.reader
        if anchors and anchors[-1] is self._anchor_done:  # known complete: one call
            event, epoch = anchors[-1]
            try:
                elapsed_ms = reader.elapsed_ms(event, mark)
            except RuntimeError:
                elapsed_ms = -1.0
            if elapsed_ms >= 0:
                return epoch + round(elapsed_ms * 1e6)
        for event, epoch in reversed(anchors):
            try:
                if not reader.query(event):
                    continue
                if (event, epoch) == anchors[-1]:
                    self._anchor_done = anchors[-1]
                elapsed_ms = reader.elapsed_ms(event, mark)
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
