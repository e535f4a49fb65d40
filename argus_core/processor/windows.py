"""Time windows per (job, rank), on record time, with a grace period for late records.

A kernel batch is split across windows by its kernels' start times (vectorised); steps and
stack samples go by ``t_ns``. A window closes once the rank's newest record time passes its
end plus the grace period, or when the rank has been silent for that long in wall time (a
finished or hung job still gets its last window written). Records for a window that has
already closed are counted as late and dropped. Memory is accounted in buffered kernel events.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from argus_core.schema import KernelBatch, RankRecord, Record, StackRecord, StepRecord
from argus_core.trace import SymbolTable


@dataclass
class OpenWindow:
    """Everything buffered for one (job, rank, window)."""

    job: str
    rank: int
    index: int  # window start = index * window_ns
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = field(
        default_factory=list)  # (name id, stream, start_ns, dur_ns)
    steps: list[StepRecord] = field(default_factory=list)
    stacks: list[StackRecord] = field(default_factory=list)
    events: int = 0
    touched: float = 0.0  # monotonic time of the last record


@dataclass
class ClosedWindow:
    """A window ready to be compressed and written."""

    job: str
    rank: int
    start_ns: int
    window_ns: int
    host: str
    names: list[str]
    name: np.ndarray
    stream: np.ndarray
    start: np.ndarray
    dur: np.ndarray
    steps: list[StepRecord]
    stacks: list[StackRecord]


class WindowStore:
    """Open windows of every (job, rank), and the rules that close them."""

    def __init__(self, window_s: float, grace_s: float):
        self.window_ns = int(window_s * 1e9)
        self.grace_ns = int(grace_s * 1e9)
        self.idle_s = window_s + grace_s
        self.names = SymbolTable()
        self.open: dict[tuple[str, int, int], OpenWindow] = {}
        self.identity: dict[tuple[str, int], RankRecord] = {}
        self.watermark: dict[tuple[str, int], int] = {}
        self.closed_below: dict[tuple[str, int], int] = {}  # windows < this index are closed
        self.buffered_events = 0
        self.late = 0

    def _window(self, job: str, rank: int, index: int) -> OpenWindow | None:
        if index < self.closed_below.get((job, rank), -(2**62)):
            return None
        key = (job, rank, index)
        window = self.open.get(key)
        if window is None:
            window = self.open[key] = OpenWindow(job, rank, index)
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
            window.parts.append((ids[sel], batch.stream[sel], batch.start_ns[sel],
                                 batch.dur_ns[sel]))
            window.events += count
            self.buffered_events += count
        self._advance((batch.job, batch.rank), int(batch.start_ns.max()))
        self.late += late
        return late

    def _advance(self, key: tuple[str, int], t_ns: int) -> None:
        if t_ns > self.watermark.get(key, -(2**62)):
            self.watermark[key] = t_ns

    def due(self, now: float | None = None) -> list[ClosedWindow]:
        """Close and return the windows whose time has passed (watermark or idleness)."""
        now = time.monotonic() if now is None else now
        ready = []
        for key, window in self.open.items():
            end = (window.index + 1) * self.window_ns
            passed = self.watermark.get((window.job, window.rank), 0) >= end + self.grace_ns
            if passed or now - window.touched >= self.idle_s:
                ready.append(key)
        return [self._close(key) for key in sorted(ready)]

    def close_all(self) -> list[ClosedWindow]:
        """Close every open window (shutdown)."""
        return [self._close(key) for key in sorted(self.open)]

    def _close(self, key: tuple[str, int, int]) -> ClosedWindow:
        window = self.open.pop(key)
        job, rank, index = key
        self.closed_below[(job, rank)] = max(self.closed_below.get((job, rank), -(2**62)),
                                             index + 1)
        self.buffered_events -= window.events
        if window.parts:
            name, stream, start, dur = (np.concatenate(cols) for cols in zip(*window.parts,
                                                                               strict=True))
        else:
            name = np.zeros(0, dtype=np.int32)
            stream = start = dur = np.zeros(0, dtype=np.int64)
        identity = self.identity.get((job, rank))
        return ClosedWindow(job, rank, index * self.window_ns, self.window_ns,
                            identity.host if identity else "", self.names.names, name, stream,
                            start, dur, window.steps, window.stacks)
