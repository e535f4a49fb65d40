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

A rank's closed windows are those below its ``closed_below`` and those in ``closed_ahead``:
a window that closes while it is still current or ahead of the processor's clock (a rank gone
quiet, a record stamped within ``--max-skew`` in the future) closes alone, so one future
record never makes the rank's present records late.

Per-rank state (identity, watermark, closed windows) is forgotten after ``ttl_s`` without
records, or least recently seen first beyond ``max_ranks``. What a forgotten rank had closed is
kept as its own floor (:class:`Floors`), so a late record can never reopen a written window and
no other rank or job is affected; floors older than ``max_age_s`` (records that old are refused
at intake) are dropped.

One module past 500 lines on purpose: watermarks, windows and floors decide together whether a
record is late, and that decision is kept in one place.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from argus_core.processor.memory import (
    FLOOR_BYTES,
    KERNEL_EVENT_BYTES,
    WINDOW_STATE_BYTES,
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
    output_bytes: int = WINDOW_STATE_BYTES  # its memory (updated by the writer)
    failed: bool = False  # writing it failed: later chunks are dropped (and counted)
    host: str | None = None  # the rank's host when the window closed (None: still open)

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
    closed_ahead: set[int] = field(default_factory=set)  # closed ones at or above it
    seen: float = 0.0  # monotonic time of the last record
    open_index: set[int] = field(default_factory=set)  # indexes of the rank's open windows
    bytes: int = 0  # estimated memory (memory.rank_bytes)

    @property
    def open_windows(self) -> int:
        """How many of the rank's windows are open."""
        return len(self.open_index)

    def closed(self, index: int) -> bool:
        """Whether the rank's window ``index`` has closed (its records are late)."""
        return index < self.closed_below or index in self.closed_ahead

    def close(self, index: int, clock_index: int) -> None:
        """Window ``index`` closed; ``clock_index`` is the window of the processor's clock.
        A window behind the clock closes everything below it; a current or future one
        closes alone."""
        if index < clock_index:
            self.closed_below = max(self.closed_below, index + 1)
            self.closed_ahead = {i for i in self.closed_ahead if i >= self.closed_below}
        else:
            self.closed_ahead.add(index)


class Floors:
    """What forgotten ranks had closed, per (job, rank), bounded in count and age.

    Beyond ``max_entries`` the oldest rank floors fold into one floor per job, and beyond
    that the oldest job floors into one floor for everything (the last resort of a flood of
    more than ``max_entries`` jobs within ``max_age_s``; counted in ``folded``)."""

    def __init__(self, max_entries: int):
        self.max_entries = max_entries
        self.ranks: OrderedDict[tuple[str, int], tuple[int, tuple[int, ...]]] = OrderedDict()
        self.jobs: OrderedDict[str, int] = OrderedDict()
        self.everything = _NEVER
        self.folded = 0

    def __len__(self) -> int:
        return len(self.ranks) + len(self.jobs)

    def forget(self, key: tuple[str, int], state: RankState) -> None:
        """Keep what a rank being forgotten had closed."""
        self.ranks[key] = (state.closed_below, tuple(sorted(state.closed_ahead)))
        self.ranks.move_to_end(key)
        while len(self.ranks) > self.max_entries:
            (job, _), (below, ahead) = self.ranks.popitem(last=False)
            self.jobs[job] = max((self.jobs.get(job, _NEVER), below, *(i + 1 for i in ahead)))
            self.jobs.move_to_end(job)
            self.folded += 1
        while len(self.jobs) > self.max_entries:
            _, below = self.jobs.popitem(last=False)
            self.everything = max(self.everything, below)
            self.folded += 1

    def revive(self, key: tuple[str, int], state: RankState) -> None:
        """Give a rank seen again (or for the first time) the floors that apply to it."""
        self.peek(key, state)
        self.ranks.pop(key, None)

    def peek(self, key: tuple[str, int], state: RankState) -> None:
        """Set ``state``'s closed windows from the floors of ``key`` (keeping them)."""
        below, ahead = self.ranks.get(key, (_NEVER, ()))
        state.closed_below = max(below, self.jobs.get(key[0], _NEVER), self.everything)
        state.closed_ahead = {i for i in ahead if i >= state.closed_below}

    def prune(self, oldest_index: int) -> None:
        """Drop floors wholly below window ``oldest_index`` (nothing that old is accepted),
        oldest forgotten first, up to the first still needed: a few entries a call, never a
        walk over all of them (this runs every second, under the processor's lock)."""
        while self.ranks:
            below, ahead = next(iter(self.ranks.values()))
            if max((below, *(i + 1 for i in ahead))) > oldest_index:
                break
            self.ranks.popitem(last=False)
        while self.jobs and next(iter(self.jobs.values())) <= oldest_index:
            self.jobs.popitem(last=False)

    def snapshot(self) -> dict:
        """As plain data (part of :meth:`WindowStore.snapshot`)."""
        return {"ranks": [[job, rank, below, list(ahead)]
                          for (job, rank), (below, ahead) in self.ranks.items()],
                "jobs": [[job, below] for job, below in self.jobs.items()],
                "everything": self.everything}

    def restore(self, data: dict) -> None:
        """Merge floors from :meth:`snapshot`."""
        for job, rank, below, ahead in data.get("ranks", ()):
            old_below, old_ahead = self.ranks.get((job, rank), (_NEVER, ()))
            self.ranks[(job, rank)] = (max(old_below, below),
                                       tuple(sorted({*old_ahead, *ahead})))
        for job, below in data.get("jobs", ()):
            self.jobs[job] = max(self.jobs.get(job, _NEVER), below)
        self.everything = max(self.everything, int(data.get("everything", _NEVER)))


class WindowStore:
    """Open windows of every (job, rank), the rules that close them, and per-rank state."""

    def __init__(self, window_s: float, grace_s: float, *, max_lifetime_s: float | None = None,
                 max_age_s: float | None = None, max_floors: int = 65_536,
                 max_open_per_rank: int = 1 << 30,
                 clock_ns: Callable[[], int] = time.time_ns):
        self.window_ns = int(window_s * 1e9)
        self.grace_ns = int(grace_s * 1e9)
        self.max_age_ns = None if max_age_s is None else int(max_age_s * 1e9)
        self.max_open_per_rank = max_open_per_rank
        self.closed_early: list[Handover] = []  # closed to make room, not yet taken
        self.idle_s = window_s + grace_s
        self.max_lifetime_s = (2 * (window_s + grace_s) if max_lifetime_s is None
                               else max_lifetime_s)
        self.clock_ns = clock_ns
        self.ranks: OrderedDict[tuple[str, int], RankState] = OrderedDict()  # oldest seen first
        self.open: dict[WindowKey, Window] = {}
        self.floors = Floors(max_floors)  # what forgotten ranks had closed
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

    def is_closed(self, key: WindowKey) -> bool:
        """Whether a window has closed (a rank not seen yet: by its floors)."""
        state = self.ranks.get(key[:2])
        if state is None:
            state = RankState()
            self.floors.peek(key[:2], state)
        return state.closed(key[2])

    def identities(self) -> list[RankRecord]:
        """The identity records of every rank remembered, by (job, rank)."""
        return [s.identity for _, s in sorted(self.ranks.items()) if s.identity is not None]

    def _rank(self, job: str, rank: int) -> RankState:
        key = (job, rank)
        state = self.ranks.get(key)
        if state is None:
            state = self.ranks[key] = RankState()
            self.floors.revive(key, state)
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
            self.floors.forget(key, state)
        self.forgotten_ranks += len(gone)
        if self.max_age_ns is not None:
            self.floors.prune((self.clock_ns() - self.max_age_ns) // self.window_ns)
        return gone

    def floor_bytes(self) -> int:
        """Estimated bytes of the forgotten ranks' floors."""
        return FLOOR_BYTES * len(self.floors)

    # -- records in -------------------------------------------------------------------------
    def _window(self, state: RankState, job: str, rank: int, index: int,
                segment: int | None) -> Window | None:
        if state.closed(index):
            return None
        key = (job, rank, index)
        window = self.open.get(key)
        now = time.monotonic()
        if window is None:
            if len(state.open_index) >= self.max_open_per_rank and not self._make_room(
                    state, job, rank, index):
                return None
            window = self.open[key] = Window(job, rank, index, self.window_ns, created=now)
            state.open_index.add(index)
        window.touched = now
        if segment is not None and segment not in window.segments:
            window.segments.add(segment)
            self.segment_refs[segment] += 1
        return window

    def _make_room(self, state: RankState, job: str, rank: int, index: int) -> bool:
        """A rank at ``max_open_per_rank`` opens window ``index``: close its oldest open
        window if that is older (into :attr:`closed_early`, for the writer). False when
        every open window is newer: the items are late."""
        oldest = min(state.open_index)
        if oldest > index:
            return False
        self.closed_early.append(self._close((job, rank, oldest)))
        return True

    def add_body(self, records: list[Record], segment: int | None = None) -> Counter:
        """Buffer a body's records in window order (so a rank kept within
        ``max_open_per_rank`` closes only windows the rest of the body no longer needs);
        returns the items that arrived too late, by kind."""
        late: Counter = Counter()
        for record in window_order(records, self.window_ns):
            n = self.add(record, segment)
            if n:
                late["kernels" if isinstance(record, KernelBatch) else
                     "steps" if isinstance(record, StepRecord) else "stacks"] += n
        return late

    def take_closed_early(self) -> list[Handover]:
        """The windows closed to make room since the last call."""
        closed, self.closed_early = self.closed_early, []
        return closed

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
        self._rank(job, rank).close(index, self._clock_index())
        return None

    def _clock_index(self) -> int:
        """The window index of the processor's clock now."""
        return self.clock_ns() // self.window_ns

    def _close(self, key: WindowKey) -> Handover:
        window = self.open.pop(key)
        self._filled.discard(key)
        job, rank, index = key
        state = self.ranks.get((job, rank))
        if state is None:  # forgotten while the window was open cannot happen; be safe
            state = self._rank(job, rank)
        state.open_index.discard(index)
        state.close(index, self._clock_index())
        window.host = self.host(job, rank)  # the rank may be forgotten before it is written
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
        """Estimated bytes held, by kind (kernels, records, windows, ranks, floors); safe to
        call without the owner's lock (the copies are atomic under the GIL)."""
        return {"kernels": self.buffered_events * KERNEL_EVENT_BYTES,
                "records": self.record_bytes,
                "windows": sum(w.output_bytes for w in list(self.open.values())),
                "ranks": self.rank_bytes,
                "floors": self.floor_bytes()}

    def snapshot(self) -> dict:
        """Per-rank state as plain data (the write-ahead log starts each segment with it)."""
        ranks = []
        for (job, rank), state in self.ranks.items():
            ident = state.identity
            ranks.append([job, rank, state.watermark, state.closed_below,
                          None if ident is None else [ident.world_size, ident.host,
                                                      ident.local_rank, list(ident.coords),
                                                      ident.placement],
                          sorted(state.closed_ahead)])
        return {"floors": self.floors.snapshot(), "ranks": ranks}

    def restore(self, snapshot: dict) -> None:
        """Per-rank state from :meth:`snapshot` (before replaying the log)."""
        self.floors.restore(snapshot.get("floors", {}))
        if "floor_index" in snapshot:  # a log written before floors were kept per rank
            self.floors.everything = max(self.floors.everything, int(snapshot["floor_index"]))
        for job, rank, watermark, closed_below, ident, *rest in snapshot.get("ranks", ()):
            state = self._rank(job, rank)
            state.watermark = max(state.watermark, watermark)
            state.closed_below = max(state.closed_below, closed_below)
            state.closed_ahead |= {i for i in (rest[0] if rest else ())
                                   if i >= state.closed_below}
            if ident is not None:
                world_size, host, local_rank, coords, *placement = ident
                self._identify(state, RankRecord(job, rank, world_size, host, local_rank,
                                                 tuple(coords), *placement))


def window_order(records: list[Record], window_ns: int) -> list[Record]:
    """The records sorted by the window they go to (stable: a window's records keep their
    order); identities first, and a kernel batch that straddles windows split into one batch
    per window."""
    keyed: list[tuple[int, Record]] = []
    for record in records:
        if isinstance(record, RankRecord):
            keyed.append((_NEVER, record))
        elif isinstance(record, KernelBatch):
            if not len(record.start_ns):
                continue
            index = record.start_ns // window_ns
            first, last = int(index.min()), int(index.max())
            if first == last:
                keyed.append((first, record))
                continue
            order = np.argsort(index, kind="stable")
            wins, starts = np.unique(index[order], return_index=True)
            for win, sel in zip(wins.tolist(), np.split(order, starts[1:]), strict=True):
                keyed.append((win, KernelBatch(record.job, record.rank, record.names,
                                               record.name[sel], record.stream[sel],
                                               record.start_ns[sel], record.dur_ns[sel])))
        else:
            keyed.append((record.t_ns // window_ns, record))
    keyed.sort(key=lambda item: item[0])
    return [record for _, record in keyed]


def window_keys(records: list[Record], window_ns: int) -> set[WindowKey]:
    """The (job, rank, window index) of every window ``records`` go to, exactly (identities
    go to none); one pass per body serves both the admission check and the log entry."""
    keys: set[WindowKey] = set()
    for record in records:
        if isinstance(record, KernelBatch):
            if not len(record.start_ns):
                continue
            first = int(record.start_ns.min()) // window_ns
            last = int(record.start_ns.max()) // window_ns
            indexes = ((first,) if first == last  # most batches: no per-kernel divide
                       else np.unique(record.start_ns // window_ns).tolist())
            keys.update((record.job, record.rank, i) for i in indexes)
        elif isinstance(record, StepRecord | StackRecord):
            keys.add((record.job, record.rank, record.t_ns // window_ns))
    return keys


def opened_by(keys: set[WindowKey], store: WindowStore) -> Counter:
    """How many of the windows ``keys`` would open per (job, rank): not open nor closed now."""
    return Counter(key[:2] for key in keys if key not in store.open and not store.is_closed(key))
