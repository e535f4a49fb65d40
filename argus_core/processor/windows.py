"""Time windows per (job, rank), on record time, with a grace period for late records.

A kernel batch is split across windows by its kernels' start times (vectorised); steps and
stack samples go by ``t_ns``. Kernels and stack samples are held only until a window has
``chunk_events`` kernels or ``chunk_bytes`` of samples (:meth:`WindowStore.chunks`): the
processor then writes them into the window's Perfetto file (and the kernels into its duration
sketch), so memory follows the chunk size, not the window length. Each window interns its own
kernel names, so names go with the window that used them.

A window closes once the rank's watermark passes its end plus the grace period, when the rank
has been silent that long in wall time (a finished or hung job still gets its last window
written), or at the latest ``max_lifetime_s`` after it opened. Records for a window that has
already closed are counted as late and dropped. The watermark is the newest record time
received, but never more than the grace period ahead of the processor's own clock: one record
stamped in the future (a clock glitch) cannot close the windows the rank is still filling.

Per-rank state (identity, watermark, closed windows) is forgotten after ``ttl_s`` without
records, or least recently seen first beyond ``max_ranks``; the windows a forgotten rank had
closed stay closed (``floor_index``), so a late record can never reopen a written window.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from argus_core.processor.memory import (
    KERNEL_EVENT_BYTES,
    WINDOW_BYTES,
    name_bytes,
    rank_bytes,
    stack_bytes,
    step_bytes,
)
from argus_core.schema import KernelBatch, RankRecord, Record, StackRecord, StepRecord
from argus_core.trace import SymbolTable

_NEVER = -(2**62)

WindowKey = tuple[str, int, int]
"""(job, rank, window index); the window starts at index * window_ns."""


@dataclass
class KernelChunk:
    """Kernel columns of one window; ``name`` holds ids of the window's symbol table."""

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
class Handover:
    """What a window hands to the writer at once: kernels and stack samples, and their bytes."""

    window: Window
    kernels: KernelChunk
    stacks: list[StackRecord]
    bytes: int


@dataclass
class Window:
    """One (job, rank, window): what it holds not yet handed over, and its steps."""

    job: str
    rank: int
    index: int  # window start = index * window_ns
    window_ns: int
    names: SymbolTable = field(default_factory=SymbolTable)
    parts: list[KernelChunk] = field(default_factory=list)
    held: int = 0  # kernel events in ``parts``
    events: int = 0  # kernel events accepted into this window
    steps: list[StepRecord] = field(default_factory=list)
    stacks: list[StackRecord] = field(default_factory=list)  # not yet handed over
    stack_bytes: int = 0  # estimated bytes of ``stacks``
    record_bytes: int = 0  # estimated bytes of ``steps`` and interned names
    created: float = 0.0  # monotonic time the window opened
    touched: float = 0.0  # monotonic time of the last record
    segments: set[int] = field(default_factory=set)  # write-ahead log segments holding records
    output: Any = None  # the writer's state for this window (created by the processor)
    output_bytes: int = WINDOW_BYTES  # the writer's memory for it (updated by the writer)
    failed: bool = False  # writing it failed: later chunks are dropped (and counted)

    @property
    def key(self) -> WindowKey:
        """(job, rank, index)."""
        return self.job, self.rank, self.index

    @property
    def start_ns(self) -> int:
        """Start of the window, ns since the epoch."""
        return self.index * self.window_ns

    def take(self) -> tuple[KernelChunk, list[StackRecord], int]:
        """Hand over the kernels and stack samples held so far, with their bytes."""
        chunk = KernelChunk.concat(self.parts)
        stacks, held = self.stacks, self.held * KERNEL_EVENT_BYTES + self.stack_bytes
        self.parts, self.held, self.stacks, self.stack_bytes = [], 0, [], 0
        return chunk, stacks, held


@dataclass
class RankState:
    """What the processor remembers of one (job, rank) between windows."""

    identity: RankRecord | None = None
    watermark: int = _NEVER  # newest record time, at most grace ahead of the clock
    closed_below: int = _NEVER  # windows with a smaller index are closed
    seen: float = 0.0  # monotonic time of the last record
    open_windows: int = 0
    bytes: int = 0  # estimated memory (memory.rank_bytes)


class WindowStore:
    """Open windows of every (job, rank), the rules that close them, and per-rank state."""

    def __init__(self, window_s: float, grace_s: float, *, max_lifetime_s: float | None = None,
                 clock_ns: Callable[[], int] = time.time_ns):
        self.window_ns = int(window_s * 1e9)
        self.grace_ns = int(grace_s * 1e9)
        self.idle_s = window_s + grace_s
        self.max_lifetime_s = (2 * (window_s + grace_s) if max_lifetime_s is None
                               else max_lifetime_s)
        self.clock_ns = clock_ns
        self.ranks: OrderedDict[tuple[str, int], RankState] = OrderedDict()  # oldest seen first
        self.open: dict[WindowKey, Window] = {}
        self.floor_index = _NEVER  # windows below it are closed for every forgotten rank
        self.skip: set[WindowKey] = set()  # windows already written (write-ahead log replay)
        self.segment_refs: Counter = Counter()  # log segment -> windows holding its records
        self.buffered_events = 0  # kernel events held in open windows' parts
        self.record_bytes = 0  # steps, stack samples and names held by open windows
        self.rank_bytes = 0
        self.late: Counter = Counter()  # items dropped late, by kind (kernels, steps, stacks)
        self.forgotten_ranks = 0
        self._filled: set[WindowKey] = set()  # windows that got kernels or stacks lately

    # -- per-rank state ---------------------------------------------------------------------
    def host(self, job: str, rank: int) -> str:
        """The host a rank reported in its identity record ("" until one arrives)."""
        state = self.ranks.get((job, rank))
        return state.identity.host if state and state.identity else ""

    def identities(self) -> list[RankRecord]:
        """The identity records of every rank remembered, by (job, rank)."""
        return [s.identity for _, s in sorted(self.ranks.items()) if s.identity is not None]

    def _rank(self, job: str, rank: int) -> RankState:
        key = (job, rank)
        state = self.ranks.get(key)
        if state is None:
            state = self.ranks[key] = RankState(closed_below=self.floor_index)
            state.bytes = rank_bytes(None)
            self.rank_bytes += state.bytes
        else:
            self.ranks.move_to_end(key)
        state.seen = time.monotonic()
        return state

    def _identify(self, state: RankState, record: RankRecord) -> None:
        state.identity = record
        self.rank_bytes -= state.bytes
        state.bytes = rank_bytes(record)
        self.rank_bytes += state.bytes

    def expire(self, ttl_s: float, max_ranks: int, now: float | None = None,
               ) -> list[tuple[str, int]]:
        """Forget ranks silent for ``ttl_s`` (and the least recently seen beyond
        ``max_ranks``) that have no open window; returns the (job, rank) pairs forgotten."""
        now = time.monotonic() if now is None else now
        gone = []
        for key, state in self.ranks.items():  # oldest seen first: stop at the first recent one
            if now - state.seen < ttl_s and len(self.ranks) - len(gone) <= max_ranks:
                break
            if state.open_windows == 0:
                gone.append(key)
        for key in gone:
            state = self.ranks.pop(key)
            self.rank_bytes -= state.bytes
            self.floor_index = max(self.floor_index, state.closed_below)
        self.forgotten_ranks += len(gone)
        return gone

    # -- records in -------------------------------------------------------------------------
    def _window(self, state: RankState, job: str, rank: int, index: int,
                segment: int | None) -> Window | None:
        if index < state.closed_below:
            return None
        key = (job, rank, index)
        window = self.open.get(key)
        now = time.monotonic()
        if window is None:
            window = self.open[key] = Window(job, rank, index, self.window_ns, created=now)
            state.open_windows += 1
        window.touched = now
        if segment is not None and segment not in window.segments:
            window.segments.add(segment)
            self.segment_refs[segment] += 1
        return window

    def add(self, record: Record, segment: int | None = None) -> int:
        """Buffer one record (from write-ahead log ``segment``, if any); returns how many of
        its items arrived too late (dropped)."""
        state = self._rank(record.job, record.rank)
        if isinstance(record, RankRecord):
            self._identify(state, record)
            return 0
        if isinstance(record, KernelBatch):
            return self._add_kernels(record, state, segment)
        index = record.t_ns // self.window_ns
        kind = "steps" if isinstance(record, StepRecord) else "stacks"
        if (record.job, record.rank, index) in self.skip:
            return 0
        window = self._window(state, record.job, record.rank, index, segment)
        self._advance(state, record.t_ns)
        if window is None:
            self.late[kind] += 1
            return 1
        if isinstance(record, StepRecord):
            size = step_bytes(record)
            window.steps.append(record)
            window.record_bytes += size
        else:
            size = stack_bytes(record)
            window.stacks.append(record)
            window.stack_bytes += size
            self._filled.add(window.key)
        self.record_bytes += size
        return 0

    def _add_kernels(self, batch: KernelBatch, state: RankState, segment: int | None) -> int:
        n = len(batch.name)
        if n == 0:
            return 0
        first = int(batch.start_ns.min()) // self.window_ns
        last = int(batch.start_ns.max()) // self.window_ns
        # Most batches sit inside one window: only a straddling one pays a per-kernel divide.
        index = None if first == last else batch.start_ns // self.window_ns
        late = 0
        for win in range(first, last + 1):
            sel = slice(None) if index is None else index == win
            count = n if first == last else int(np.count_nonzero(sel))
            if count == 0 or (batch.job, batch.rank, win) in self.skip:
                continue
            window = self._window(state, batch.job, batch.rank, win, segment)
            if window is None:
                late += count
                continue
            known = len(window.names)
            ids = window.names.ids(batch.names)
            if len(window.names) > known:
                size = sum(name_bytes(name) for name in window.names.names[known:])
                window.record_bytes += size
                self.record_bytes += size
            window.parts.append(KernelChunk(ids[batch.name[sel]], batch.stream[sel],
                                            batch.start_ns[sel], batch.dur_ns[sel]))
            window.held += count
            window.events += count
            self.buffered_events += count
            self._filled.add(window.key)
        self._advance(state, int(batch.start_ns.max()))
        self.late["kernels"] += late
        return late

    def _advance(self, state: RankState, t_ns: int) -> None:
        """Move the watermark to ``t_ns``, but never past the clock plus the grace period."""
        t_ns = min(t_ns, self.clock_ns() + self.grace_ns)
        if t_ns > state.watermark:
            state.watermark = t_ns

    # -- records out ------------------------------------------------------------------------
    def chunks(self, min_events: int, min_bytes: int) -> list[Handover]:
        """Take the kernels and stack samples of every open window holding at least
        ``min_events`` kernels or ``min_bytes`` of samples."""
        ready = []
        for key in self._filled:
            window = self.open.get(key)
            if window is not None and (window.held >= min_events
                                       or window.stack_bytes >= min_bytes):
                ready.append(self._handover(window))
        self._filled = {key for key in self._filled if key in self.open
                        and (self.open[key].held or self.open[key].stacks)}
        return ready

    def _handover(self, window: Window) -> Handover:
        self.buffered_events -= window.held
        self.record_bytes -= window.stack_bytes
        chunk, stacks, size = window.take()
        return Handover(window, chunk, stacks, size)

    def due(self, now: float | None = None) -> list[Handover]:
        """Close the windows whose time has passed (watermark, idleness or lifetime); each
        comes with what it still holds."""
        now = time.monotonic() if now is None else now
        ready = []
        for key, window in self.open.items():
            end = (window.index + 1) * self.window_ns
            state = self.ranks.get((window.job, window.rank))
            passed = state is not None and state.watermark >= end + self.grace_ns
            if (passed or now - window.touched >= self.idle_s
                    or now - window.created >= self.max_lifetime_s):
                ready.append(key)
        return [self._close(key) for key in sorted(ready)]

    def close_all(self) -> list[Handover]:
        """Close every open window (shutdown)."""
        return [self._close(key) for key in sorted(self.open)]

    def close_key(self, key: WindowKey) -> Handover | None:
        """Close one window by key (write-ahead log replay); None when it is not open, but
        the rank's windows up to it count as closed all the same."""
        if key in self.open:
            return self._close(key)
        job, rank, index = key
        state = self._rank(job, rank)
        state.closed_below = max(state.closed_below, index + 1)
        return None

    def _close(self, key: WindowKey) -> Handover:
        window = self.open.pop(key)
        self._filled.discard(key)
        job, rank, index = key
        state = self.ranks.get((job, rank))
        if state is None:  # forgotten while the window was open cannot happen; be safe
            state = self._rank(job, rank)
        state.open_windows -= 1
        state.closed_below = max(state.closed_below, index + 1)
        self.record_bytes -= window.record_bytes
        handover = self._handover(window)
        handover.bytes += window.record_bytes
        return handover

    def release(self, window: Window) -> list[int]:
        """A window is written (or given up): its log segments lose a reference; returns the
        segments no open or pending window needs any more."""
        free = []
        for segment in window.segments:
            self.segment_refs[segment] -= 1
            if self.segment_refs[segment] <= 0:
                del self.segment_refs[segment]
                free.append(segment)
        window.segments = set()
        return free

    # -- accounting and persistence ----------------------------------------------------------
    def memory(self) -> dict[str, int]:
        """Estimated bytes held, by kind (kernels, records, windows, ranks); safe to call
        without the owner's lock (the copies are atomic under the GIL)."""
        return {"kernels": self.buffered_events * KERNEL_EVENT_BYTES,
                "records": self.record_bytes,
                "windows": sum(w.output_bytes for w in list(self.open.values())),
                "ranks": self.rank_bytes}

    def snapshot(self) -> dict:
        """Per-rank state as plain data (the write-ahead log starts each segment with it)."""
        ranks = []
        for (job, rank), state in self.ranks.items():
            ident = state.identity
            ranks.append([job, rank, state.watermark, state.closed_below,
                          None if ident is None else [ident.world_size, ident.host,
                                                      ident.local_rank, list(ident.coords)]])
        return {"floor_index": self.floor_index, "ranks": ranks}

    def restore(self, snapshot: dict) -> None:
        """Per-rank state from :meth:`snapshot` (before replaying the log)."""
        self.floor_index = max(self.floor_index, int(snapshot.get("floor_index", _NEVER)))
        for job, rank, watermark, closed_below, ident in snapshot.get("ranks", ()):
            state = self._rank(job, rank)
            state.watermark = max(state.watermark, watermark)
            state.closed_below = max(state.closed_below, closed_below)
            if ident is not None:
                world_size, host, local_rank, coords = ident
                self._identify(state, RankRecord(job, rank, world_size, host, local_rank,
                                                 tuple(coords)))
