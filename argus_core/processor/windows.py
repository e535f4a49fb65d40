"""Time windows per (job, rank), on record time, with a grace period for late records.

A kernel batch is split across windows by its kernels' start times (vectorised); steps and
stack samples go by ``t_ns``. Kernels are held only until a window has ``chunk_events`` of them
(:meth:`WindowStore.chunks`): the processor then writes them into the window's Perfetto file
and duration sketch, so memory follows the chunk size, not the window length. A window closes
once the rank's newest record time passes its end plus the grace period, or when the rank has
been silent for that long in wall time (a finished or hung job still gets its last window
written). Records for a window that has already closed are counted as late and dropped.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from argus_core.schema import KernelBatch, RankRecord, Record, StackRecord, StepRecord
from argus_core.trace import SymbolTable


@dataclass
class KernelChunk:
    """Kernel columns of one window; ``name`` holds ids of the store's symbol table."""

    name: np.ndarray
    stream: np.ndarray
    start_ns: np.ndarray
    dur_ns: np.ndarray

    def __len__(self) -> int:
        return len(self.start_ns)

    @classmethod
    def concat(cls, parts: list[KernelChunk]) -> KernelChunk:
        """One chunk of all the parts' kernels, in order."""
        if len(parts) == 1:
            return parts[0]
        if not parts:
            empty = np.zeros(0, dtype=np.int64)
            return cls(np.zeros(0, dtype=np.int32), empty, empty, empty)
        return cls(*(np.concatenate([getattr(p, f) for p in parts])
                     for f in ("name", "stream", "start_ns", "dur_ns")))


@dataclass
class Window:
    """One (job, rank, window): its kernels not yet handed over, its steps and stack samples."""

    job: str
    rank: int
    index: int  # window start = index * window_ns
    window_ns: int
    parts: list[KernelChunk] = field(default_factory=list)
    held: int = 0  # kernel events in ``parts``
    events: int = 0  # kernel events accepted into this window
    steps: list[StepRecord] = field(default_factory=list)
    stacks: list[StackRecord] = field(default_factory=list)
    touched: float = 0.0  # monotonic time of the last record
    output: Any = None  # the writer's state for this window (created by the processor)
    failed: bool = False  # writing it failed: later chunks are dropped (and counted)

    @property
    def start_ns(self) -> int:
        """Start of the window, ns since the epoch."""
        return self.index * self.window_ns

    def take(self) -> KernelChunk:
        """Hand over the kernels held so far."""
        chunk = KernelChunk.concat(self.parts)
        self.parts, self.held = [], 0
        return chunk


class WindowStore:
    """Open windows of every (job, rank), and the rules that close them."""

    def __init__(self, window_s: float, grace_s: float):
        self.window_ns = int(window_s * 1e9)
        self.grace_ns = int(grace_s * 1e9)
        self.idle_s = window_s + grace_s
        self.names = SymbolTable()
        self.open: dict[tuple[str, int, int], Window] = {}
        self.identity: dict[tuple[str, int], RankRecord] = {}
        self.watermark: dict[tuple[str, int], int] = {}
        self.closed_below: dict[tuple[str, int], int] = {}  # windows < this index are closed
        self.buffered_events = 0  # kernel events held in open windows' parts
        self.late = 0
        self._filled: set[tuple[str, int, int]] = set()  # windows that got kernels lately

    def host(self, job: str, rank: int) -> str:
        """The host a rank reported in its identity record ("" until one arrives)."""
        identity = self.identity.get((job, rank))
        return identity.host if identity else ""

    def _window(self, job: str, rank: int, index: int) -> Window | None:
        if index < self.closed_below.get((job, rank), -(2**62)):
            return None
        key = (job, rank, index)
        window = self.open.get(key)
        if window is None:
            window = self.open[key] = Window(job, rank, index, self.window_ns)
        window.touched = time.monotonic()
        return window

    def add(self, record: Record) -> int:
        """Buffer one record; returns how many of its items arrived too late (dropped)."""
        key = (record.job, record.rank)
        if isinstance(record, RankRecord):
            self.identity[key] = record
            return 0
        if isinstance(record, KernelBatch):
            return self._add_kernels(record)
        window = self._window(record.job, record.rank, record.t_ns // self.window_ns)
        self._advance(key, record.t_ns)
        if window is None:
            self.late += 1
            return 1
        (window.steps if isinstance(record, StepRecord) else window.stacks).append(record)
        return 0

    def _add_kernels(self, batch: KernelBatch) -> int:
        n = len(batch.name)
        if n == 0:
            return 0
        ids = self.names.ids(batch.names)[batch.name]
        first = int(batch.start_ns.min()) // self.window_ns
        last = int(batch.start_ns.max()) // self.window_ns
        # Most batches sit inside one window: only a straddling one pays a per-kernel divide.
        index = None if first == last else batch.start_ns // self.window_ns
        late = 0
        for win in range(first, last + 1):
            sel = slice(None) if index is None else index == win
            window = self._window(batch.job, batch.rank, win)
            count = n if first == last else int(np.count_nonzero(sel))
            if count == 0:
                continue
            if window is None:
                late += count
                continue
            window.parts.append(KernelChunk(ids[sel], batch.stream[sel], batch.start_ns[sel],
                                            batch.dur_ns[sel]))
            window.held += count
            window.events += count
            self.buffered_events += count
            self._filled.add((batch.job, batch.rank, win))
        self._advance((batch.job, batch.rank), int(batch.start_ns.max()))
        self.late += late
        return late

    def _advance(self, key: tuple[str, int], t_ns: int) -> None:
        if t_ns > self.watermark.get(key, -(2**62)):
            self.watermark[key] = t_ns

    def chunks(self, min_events: int) -> list[tuple[Window, KernelChunk]]:
        """Take the kernels of every open window holding at least ``min_events`` of them."""
        ready = []
        for key in self._filled:
            window = self.open.get(key)
            if window is not None and window.held >= min_events:
                self.buffered_events -= window.held
                ready.append((window, window.take()))
        self._filled = {key for key in self._filled if key in self.open
                        and self.open[key].held > 0}
        return ready

    def due(self, now: float | None = None) -> list[tuple[Window, KernelChunk]]:
        """Close the windows whose time has passed (watermark or idleness); each comes with
        the kernels it still holds."""
        now = time.monotonic() if now is None else now
        ready = []
        for key, window in self.open.items():
            end = (window.index + 1) * self.window_ns
            passed = self.watermark.get((window.job, window.rank), 0) >= end + self.grace_ns
            if passed or now - window.touched >= self.idle_s:
                ready.append(key)
        return [self._close(key) for key in sorted(ready)]

    def close_all(self) -> list[tuple[Window, KernelChunk]]:
        """Close every open window (shutdown)."""
        return [self._close(key) for key in sorted(self.open)]

    def _close(self, key: tuple[str, int, int]) -> tuple[Window, KernelChunk]:
        window = self.open.pop(key)
        self._filled.discard(key)
        job, rank, index = key
        self.closed_below[(job, rank)] = max(self.closed_below.get((job, rank), -(2**62)),
                                             index + 1)
        self.buffered_events -= window.held
        return window, window.take()
