"""Marks in time: CUDA events on a stream (device time) or the host clock (CPU-only torch).

A mark is taken at each phase edge. CUDA marks come from a pre-allocated pool, are recorded on
the stream the work runs on, and are read lazily by the resolver thread, in bulk
(``ready_count``, ``offsets_many``, ``epochs_many``): the training thread never synchronises.
Reading goes through
``cudaEventQuery`` / ``cudaEventElapsedTime`` called with ctypes on the events' raw handles
(``CudartEvents``: the GIL is released during each call, so the resolver never holds it for
the driver's time; a batch of reads is one call into the bulk event reader,
``_native/events.c``, when it can be built or was prebuilt), or through torch's event
methods when libcudart cannot be loaded (``TorchEvents``, which hold the GIL). On a machine
without CUDA, marks are host ``perf_counter_ns`` values, so the same code path runs in CI.

Device marks also have an epoch time (``epoch_ns``) on the clock of CUPTI's kernel timestamps
(CLOCK_REALTIME in CUPTI 13): an *anchor* event is recorded on an idle stream of its own,
where the device runs it as soon as the host enqueues it, so its epoch time is the host's
``time.time_ns()`` at that moment; any later mark is that plus ``elapsed_time`` between the
two events. A step's ``gpu_t_ns`` is when its work started on the device, however far the host
ran ahead. Anchors are renewed every ``anchor_every_s`` (``elapsed_time`` is a float32 of
milliseconds: ~1 us resolution over 10 s, ~60 us over 1,000 s).
"""

from __future__ import annotations

import contextlib
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

    def ready_count(self, marks: list[Any]) -> int:
        """How many of ``marks`` have completed, counted up to the first that has not."""

    def offsets(self, marks: list[Any]) -> list[float]:
        """Seconds from ``marks[0]`` to each of the completed ``marks``."""

    def offsets_many(self, groups: list[list[Any]]) -> list[list[float]]:
        """``offsets`` of each list of completed marks, read in one batch where it can."""

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

    def epochs_many(self, marks: list[Any]) -> list[int | None]:
        """``epoch_ns`` of each mark, read in one batch where it can."""


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

    def ready_count(self, marks: list[int]) -> int:
        """Host marks are complete when taken."""
        return len(marks)

    def offsets(self, marks: list[int]) -> list[float]:
        """Seconds from ``marks[0]`` to each mark."""
        first = marks[0]
        return [(mark - first) * 1e-9 for mark in marks]

    def offsets_many(self, groups: list[list[int]]) -> list[list[float]]:
        """``offsets`` of each list."""
        return [self.offsets(marks) for marks in groups]

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

    def epochs_many(self, marks: list[int]) -> list[None]:
        """Host marks have no device time."""
        return [None] * len(marks)


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

    def ready_count(self, events: list[Any]) -> int:
        """How many of ``events`` have completed, up to the first that has not."""
        return _ready_count(self.query, events)

    def elapsed_pairs(self, starts: list[Any], ends: list[Any]) -> list[float]:
        """Milliseconds from each of ``starts`` to the same place in ``ends``."""
        return [start.elapsed_time(end) for start, end in zip(starts, ends, strict=True)]


def _ready_count(query: Callable[[Any], bool], events: list[Any]) -> int:
    """How many of ``events`` ``query`` says have completed, up to the first that has not."""
    for i, event in enumerate(events):
        if not query(event):
            return i
    return len(events)


CUDA_SUCCESS = 0
CUDA_ERROR_NOT_READY = 600


class CudartEvents:
    """Reads events with ``cudaEventQuery`` / ``cudaEventElapsedTime`` through ctypes, on the
    raw handles (``torch.cuda.Event.cuda_event``). ctypes releases the GIL for the length of
    each call, so the resolver thread holds it only for the Python around the calls and never
    for the driver's time.

    Batches (``ready_count``, ``elapsed_pairs``) go through the bulk event reader
    (``_native/events.c``) when it loads: one ctypes call for the whole batch, so the GIL is
    given up and taken back once, not once per event (each taking back waits for the training
    thread to let go of it). It is found or built on the first batch, on the reading thread;
    without it (no compiler, nothing prebuilt, a runtime that is not C) each event is one call.
    """

    releases_gil = True

    def __init__(self, library: Any, bulk: Any = "auto"):
        self.library = library
        self._bulk_choice = bulk  # "auto": located on the first batch; None: never
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
        self._bulk: Any = None
        self._query_ptr = self._elapsed_ptr = None

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

    def prepare(self) -> None:
        """Locate (or build) the bulk event reader now: the resolver thread calls this when it
        starts, so a build never falls to the training thread's first inline poll."""
        self._bulk_reader()

    def _bulk_reader(self) -> Any:
        """The bulk event reader, located (or built) on the first call; None without one."""
        choice = self._bulk_choice
        if choice is None:
            return self._bulk
        self._bulk_choice = None
        functions = (self._query, self._elapsed)
        if not all(isinstance(f, ctypes._CFuncPtr) for f in functions):
            return None  # a runtime whose functions are not C cannot be called from C
        self._bulk = load_bulk_reader() if choice == "auto" else choice
        if self._bulk is not None:
            self._query_ptr, self._elapsed_ptr = (ctypes.cast(f, ctypes.c_void_p)
                                                  for f in functions)
        return self._bulk

    def ready_count(self, events: list[Any]) -> int:
        """How many of ``events`` have completed, up to the first that has not: one call."""
        bulk = self._bulk_reader()
        if bulk is None:
            return _ready_count(self.query, events)
        self._on_device()
        n = len(events)
        handles = (ctypes.c_void_p * n)(*[event.cuda_event for event in events])
        return bulk.argus_events_ready(self._query_ptr, handles, n)

    def elapsed_pairs(self, starts: list[Any], ends: list[Any]) -> list[float]:
        """Milliseconds from each of ``starts`` to the same place in ``ends``, in one call;
        RuntimeError with CUDA's code at the first pair it refuses."""
        bulk = self._bulk_reader()
        if bulk is None:
            return [self.elapsed_ms(start, end) for start, end in zip(starts, ends,
                                                                       strict=True)]
        self._on_device()
        n = len(starts)
        handles = ctypes.c_void_p * n
        out = (ctypes.c_float * n)()
        code = ctypes.c_int()
        done = bulk.argus_events_elapsed(
            self._elapsed_ptr, handles(*[event.cuda_event for event in starts]),
            handles(*[event.cuda_event for event in ends]), n, out, ctypes.byref(code))
        if done < n:
            raise RuntimeError(f"cudaEventElapsedTime failed with CUDA error {code.value}")
        return out[:]


def load_bulk_reader(env: Any = None) -> Any | None:
    """The bulk event reader (``_native/events.c``) as a ``ctypes.CDLL`` with its functions
    typed: ``ARGUS_EVENTS_LIB``, else the cache, else built now; None when it cannot be had
    (no compiler, an unwritable cache, another ABI)."""
    from argus_exporters._native.build import (
        EVENTS_ABI,
        EVENTS_SOURCE,
        ShimUnavailableError,
        open_library,
    )

    try:
        library = open_library(EVENTS_SOURCE, lambda path: ctypes.CDLL(str(path)), env)
        if library.argus_events_abi() != EVENTS_ABI:
            return None
    except (ShimUnavailableError, OSError, AttributeError):
        return None
    pointer, size = ctypes.c_void_p, ctypes.c_long
    library.argus_events_ready.argtypes = [pointer, ctypes.POINTER(pointer), size]
    library.argus_events_ready.restype = size
    library.argus_events_elapsed.argtypes = [pointer, ctypes.POINTER(pointer),
                                             ctypes.POINTER(pointer), size,
                                             ctypes.POINTER(ctypes.c_float),
                                             ctypes.POINTER(ctypes.c_int)]
    library.argus_events_elapsed.restype = size
    return library


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
        # torch.cuda.current_stream() builds a Stream object in Python on every call; the
        # runtime's raw current stream and device are two cheap C calls, which say whether
        # the stream last built is still the current one
        native = getattr(torch_module, "_C", None)
        self._raw_stream = getattr(native, "_cuda_getCurrentRawStream", None)
        self._raw_device = getattr(native, "_cuda_getDevice", None)
        self._current: tuple[int, int, Any] | None = None  # (device, raw handle, Stream)

    def mark(self, stream: Any = None):
        """Record a pooled event on ``stream`` (the current stream by default)."""
        stream = stream if stream is not None else self.current_stream()
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
        mark.record(stream if stream is not None else self.current_stream())
        return mark

    def prepare(self) -> None:
        """Ready the reader (the bulk event reader found or built) off the training thread."""
        prepare = getattr(self.reader, "prepare", None)
        if prepare is not None:
            prepare()

    def ready(self, mark) -> bool:
        """Whether the event has completed: never blocks."""
        return self.reader.query(mark)

    def ready_all(self, marks) -> bool:
        """Whether every event of ``marks`` has completed (stops at the first that has not)."""
        return self.ready_count(marks) == len(marks)

    def ready_count(self, marks) -> int:
        """How many of ``marks`` have completed, up to the first that has not (one batch)."""
        count = getattr(self.reader, "ready_count", None)
        return count(marks) if count is not None else _ready_count(self.reader.query, marks)

    def seconds(self, start, end) -> float:
        """``elapsed_time`` is in milliseconds."""
        return self.reader.elapsed_ms(start, end) * 1e-3

    def offsets(self, marks) -> list[float]:
        """Seconds from ``marks[0]`` to each of ``marks`` (completed)."""
        return self.offsets_many([marks])[0]

    def offsets_many(self, groups) -> list[list[float]]:
        """``offsets`` of each list of completed marks: every elapsed time of the batch read
        in one call where the reader can (``elapsed_pairs``)."""
        starts: list[Any] = []
        ends: list[Any] = []
        for marks in groups:
            rest = marks[1:]
            starts += [marks[0]] * len(rest)
            ends += rest
        pairs = getattr(self.reader, "elapsed_pairs", None)
        if pairs is not None:
            ms = pairs(starts, ends)
        else:
            elapsed = self.reader.elapsed_ms
            ms = [elapsed(start, end) for start, end in zip(starts, ends, strict=True)]
        out, at = [], 0
        for marks in groups:
            n = len(marks) - 1
            out.append([0.0, *(value * 1e-3 for value in ms[at:at + n])])
            at += n
        return out

    def release(self, mark) -> None:
        """Back to the pool."""
        self._pool.append(mark)

    def release_all(self, marks) -> None:
        """Every one of ``marks`` back to the pool."""
        self._pool.extend(marks)

    def current_stream(self) -> Any:
        """The current CUDA stream (resolved once per mark by the tracer): the Stream object
        built last while the calling thread's current device and raw stream are still its
        own, else a new one from ``torch.cuda.current_stream()``."""
        raw_stream, raw_device = self._raw_stream, self._raw_device
        if raw_stream is None or raw_device is None:
            return self.torch.cuda.current_stream()
        device = raw_device()
        handle = raw_stream(device)
        current = self._current
        if current is not None and current[0] == device and current[1] == handle:
            return current[2]
        stream = self.torch.cuda.current_stream()
        self._current = (device, handle, stream)
        return stream

    def stream_key(self, stream: Any = None) -> int:
        """The CUDA stream handle marks on ``stream`` (default: the current one) go to."""
        if stream is None:
            stream = self.current_stream()
        try:  # torch's streams: their raw handle, an int
            return stream.cuda_stream
        except AttributeError:
            return id(stream)

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

    def epochs_many(self, marks) -> list[int | None]:
        """``epoch_ns`` of each completed mark: in one batch of reads (``elapsed_pairs``)
        when the newest anchor is known complete and precedes them all, else mark by mark."""
        anchors = list(self._anchors)
        pairs = getattr(self.reader, "elapsed_pairs", None)
        if pairs is not None and marks and anchors and anchors[-1] is not self._anchor_done:
            with contextlib.suppress(RuntimeError):
                if self.reader.query(anchors[-1][0]):
                    self._anchor_done = anchors[-1]
        if pairs is not None and marks and anchors and anchors[-1] is self._anchor_done:
            event, epoch = anchors[-1]
            try:
                ms = pairs([event] * len(marks), marks)
            except RuntimeError:  # e.g. a mark on another device: each alone below
                ms = []
            if ms and min(ms) >= 0:
                if self._now_ns() - epoch > self._anchor_every_ns:
                    self.anchor()  # for later marks, as epoch_ns renews it
                return [epoch + round(value * 1e6) for value in ms]
        return [self.epoch_ns(mark) for mark in marks]

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
