"""The Tracer: phase marks in, one ``step`` record per training step out.

Instrumentation (module and optimizer hooks, ``phase()`` blocks, the DDP comm hook) calls
``begin_phase``/``end_phase``; the optimizer step (or an explicit ``step()``) closes a step.
Closed steps wait in a bounded queue until their marks have completed on the device; a
background resolver thread then reads them in batches of up to POLL_BATCH steps (the newest
mark of each stream of each step queried, one elapsed time per distinct mark, each batch in
one call where the clock can; never a synchronise, never on the training thread), and each
becomes a ``step`` record for the shipper, an update of the hot metrics and, when the
application traces with OpenTelemetry, spans. ``NoOpTracer`` has the same methods and does
nothing: it is what instrumentation gets when Argus is off, so call sites need no ``if``.

The hot path allocates no object per phase: a token is an integer (step index and slot), a
step's marks and intervals live in flat lists of a ``_Step`` reused from step to step, and on
a device clock a phase's end and the next start on the same stream share one CUDA event, as
do a span's later parts (DDP's buckets) and the step's end after the last phase's.

One module past 500 lines on purpose: the flat cell layout (``STRIDE``, token bits) is written
by the training-thread API and read by the resolver, and both halves must change together.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from time import perf_counter_ns, thread_time
from typing import Any

from argus_exporters import placement
from argus_exporters.clock import Clock, HostClock, default_clock
from argus_exporters.config import Settings
from argus_exporters.health import Health
from argus_exporters.identity import RankIdentity
from argus_exporters.metrics import StepMetrics
from argus_exporters.otel import SpanEmitter
from argus_exporters.probes import Probe
from argus_exporters.records import encode, rank_record, step_record
from argus_exporters.runqueue import RunDelay
from argus_exporters.shipper import Shipper
from argus_exporters.sinks import create_sink

MAX_INTERVALS_PER_STEP = 1 << 16  # phase intervals kept for one step; more are dropped
PLAIN, SPAN, COLLECTIVE = 0, 1, 2  # how a phase's intervals combine
NO_MARK = -1
# one phase interval: STRIDE cells of ``_Step.cells``, at these offsets from its base
NAME, START, END, KIND, WAITED, KEY, ARG, PEER = range(8)
STRIDE = 8
NO_PEER = -1
SLOT_BITS = 20  # a token is (step index << SLOT_BITS) | base of its cells
SLOT_MASK = (1 << SLOT_BITS) - 1
FULL = SLOT_MASK  # the base of a token whose step had no room left
MAX_CELLS = MAX_INTERVALS_PER_STEP * STRIDE

PhaseToken = int
"""What ``begin_phase`` returns and ``end_phase`` takes: the step's index and the phase's slot
in one integer (no object per phase); None when Argus is off."""


class _Step:
    """One step's marks and phase intervals in flat lists, reused from step to step (the
    training thread allocates no object per phase).

    ``marks`` holds each distinct mark once; ``marks[0]`` is the step's first (its device
    start). Each phase interval is STRIDE cells of ``cells``: its name, the indices in
    ``marks`` of its START and END (NO_MARK until it ends), its KIND (PLAIN, SPAN,
    COLLECTIVE), WAITED (the mark where a collective's wait began; NO_MARK: from its start),
    the KEY of its start's stream, the stream ARG it was given (None: the current one) and
    the PEER a point-to-point collective exchanges data with (its global rank; NO_PEER). A
    span phase has one interval per step (``spans``): its later parts move its end. ``last``
    maps a stream key to its newest mark on a device clock: ``i`` a phase start, ``-i - 1`` a
    phase end, which the next start on that stream shares. ``end`` is the closing mark.
    """

    __slots__ = ("cells", "collectives", "cpu_wait_s", "end", "first_epoch_ns", "index",
                 "last", "marks", "spans", "t_ns", "wall_s")

    def __init__(self, index: int = 0):
        self.marks: list[Any] = []
        self.cells: list[Any] = []
        self.spans: dict[str, int] = {}
        self.last: dict[int, int] = {}
        self.reset(index)

    def reset(self, index: int) -> None:
        """Empty, for step ``index`` (``clear`` frees the lists' storage too: the C recorder
        grows it again once a step, to what the last step took)."""
        self.index = index
        self.t_ns = 0  # host epoch time at the step's start
        self.first_epoch_ns = 0  # host epoch time when marks[0] was taken
        self.wall_s = 0.0
        self.cpu_wait_s: float | None = None  # the closing thread's wait for a CPU
        self.end = NO_MARK
        self.collectives = False  # holds a collective (their waits are taken out of phases)
        self.marks.clear()
        self.cells.clear()
        self.spans.clear()
        self.last.clear()

    @property
    def phases(self) -> list[str]:
        """The name of each interval taken in this step."""
        return self.cells[NAME::STRIDE]

    def tails(self) -> list[Any]:
        """The newest mark on each stream: when they have completed, all of them have."""
        marks = self.marks
        return [marks[i if i >= 0 else -i - 1] for i in self.last.values()]


class NoOpTracer:
    """Argus switched off: every call returns at once."""

    enabled = False

    def begin_phase(self, name: str, stream: Any = None, span: bool = False,
                    collective: bool = False, peer: int = -1) -> None:
        """Nothing."""

    def end_phase(self, token: Any, stream: Any = None) -> None:
        """Nothing."""

    def begin_collective(self, name: str, peer: int = -1, stream: Any = None) -> None:
        """Nothing."""

    def end_collective(self, token: Any, waited_from: Any = None) -> None:
        """Nothing."""

    @contextlib.contextmanager
    def phase(self, name: str, stream: Any = None):
        """A context manager that does nothing."""
        yield

    def step(self) -> None:
        """Nothing."""

    def emit(self, record: dict) -> None:
        """Nothing."""

    def force_flush(self, timeout: float = 5.0) -> bool:
        """Nothing to flush."""
        return True

    def shutdown(self, timeout: float = 5.0) -> None:
        """Nothing."""


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Disjoint intervals covering the same time as ``intervals``, in order."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def _offsets_many(clock: Clock, groups: list[list[Any]]) -> list[list[float]]:
    """Seconds from the first mark of each list to each of its marks, in one batch where the
    clock can (``offsets_many``)."""
    bulk = getattr(clock, "offsets_many", None)
    if bulk is not None:
        return bulk(groups)
    return [[clock.seconds(marks[0], mark) for mark in marks] for marks in groups]


def _epochs_many(clock: Clock, marks: list[Any]) -> list[int | None]:
    """The epoch time of each completed device mark, in one batch where the clock can."""
    bulk = getattr(clock, "epochs_many", None)
    if bulk is not None:
        return bulk(marks)
    return [clock.epoch_ns(mark) for mark in marks]


def _ready_steps(clock: Clock, steps: list[_Step]) -> int:
    """How many of ``steps`` (in order) have completed on the device: the newest mark of each
    stream of each, queried in one batch (``ready_count``) up to the first that has not."""
    tails: list[Any] = []
    owners: list[int] = []
    for i, step in enumerate(steps):
        tail = step.tails()
        tails += tail
        owners += [i] * len(tail)
    count = getattr(clock, "ready_count", None)
    ready = (count(tails) if count is not None
             else next((i for i, mark in enumerate(tails) if not clock.ready(mark)), len(tails)))
    return owners[ready] if ready < len(tails) else len(steps)


CPU_SAMPLE_EVERY = 64  # steps a CPU-time sample stands for (a thread clock read costs ~0.6 us)
RESOLVE_PERIOD_S = 0.2  # the resolver also wakes when a quarter of the pending queue is used
POLL_BATCH = 64  # steps read in one batch of device reads


class Tracer:
    """Turns phase marks into step records, metrics and spans; owns the shipper and probes."""

    enabled = True
    # With only step boundaries known (``argus run``), a step's device span starts where the
    # previous step ended; with ``instrument`` it starts at the first phase (forward), so a
    # host stall before it shows as wall time without device time.
    open_at_previous_end = False
    model_instrumented = False  # ``argus run`` found a model to instrument (forward phases)

    def __init__(self, settings: Settings, identity: RankIdentity, clock: Clock | None = None,
                 health: Health | None = None, sink=None, share_marks: bool = True,
                 discover: Callable[[RankIdentity], dict] = placement.discover):
        self.settings = settings
        self.identity = identity
        self._identity_lock = threading.Lock()  # placement and coordinates replace identity
        self.health = health or Health()
        self.clock = clock or default_clock()
        self.shipper = Shipper(sink or create_sink(settings, identity, self.health), self.health,
                               settings.queue_records, settings.batch_records, settings.flush_s)
        self.metrics = StepMetrics(identity, self.health, settings.window_steps,
                                   lambda: self.shipper.depth,
                                   "device" if self.clock.device else "host")
        self.spans = SpanEmitter(identity) if settings.otel else None
        self.probes: list[Probe] = []
        self._lock = threading.Lock()
        self._poll_lock = threading.Lock()
        self._current = _Step(0)
        self._pending: deque[_Step] = deque()
        self._free: list[_Step] = []  # resolved steps, reused (no allocation per step)
        self._device = bool(self.clock.device)
        # the clock's methods the hot path calls, bound once
        self._mark = self.clock.mark
        # a mark now on the current stream: on the host clock perf_counter_ns itself, no
        # Python frame (the collective hooks take three a collective)
        self.mark_now: Callable[[], Any] = (
            perf_counter_ns if type(self.clock).mark is HostClock.mark
            else functools.partial(self.clock.mark, None))
        self._one_stream = type(self.clock).stream_key is HostClock.stream_key
        self._stream_key = self.clock.stream_key
        self._stream = self.clock.current_stream
        # consecutive marks on one stream (a phase's end, the next phase's start) share one
        # CUDA event; host marks cost nothing and keep their own values
        self._share = self._device and share_marks
        self._last_end_perf_ns: int | None = None
        self._run_delay = RunDelay()  # read by the thread that closes steps
        self._last_end_epoch_ns = 0
        self._closed = False
        self._in_child = False
        self._off = False  # closed or in a forked child: the hot path checks one flag
        self._cpu = 0.0  # training-thread CPU time measured in the current sampled step
        self._sampled = True  # CPU clocks are read in 1 step of CPU_SAMPLE_EVERY (they cost)
        self._recorder: Any = None  # the collective hooks' C recorder (collective_recording)
        weak = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: (t := weak()) and t._forked())
        self._wake = threading.Event()
        self._resolver = threading.Thread(target=self._resolve_loop, name="argus-resolver",
                                          daemon=True)
        self._resolver.start()
        self.emit(rank_record(identity))
        if settings.placement and not identity.placement:  # found off the training thread
            threading.Thread(target=self._place, args=(discover,), name="argus-placement",
                             daemon=True).start()

    def _place(self, discover: Callable[[RankIdentity], dict]) -> None:
        """Where this rank runs (``placement.discover``), then a new ``rank`` record."""
        try:
            found = discover(self.identity)
        except Exception:  # discover never raises; a stand-in might
            return
        if not found:
            return
        with self._identity_lock:
            if self._closed:
                return
            self.identity = dataclasses.replace(self.identity, placement=dict(found))
            self.metrics.identity = self.identity
            self.emit(rank_record(self.identity))

    def _resolve_loop(self) -> None:
        prepare = getattr(self.clock, "prepare", None)
        if prepare is not None:  # e.g. build the bulk event reader here, not in training
            with contextlib.suppress(Exception):
                prepare()
        while not self._closed:
            self._wake.wait(RESOLVE_PERIOD_S)
            self._wake.clear()
            if self._closed:
                return
            cpu0 = time.thread_time()
            self.poll()
            self.health.add_cpu(time.thread_time() - cpu0)

    def _forked(self) -> None:
        self._in_child = True
        self._turn_off()

    def _turn_off(self) -> None:
        """Record nothing from now on (closed, or a forked child)."""
        self._off = True
        if self._recorder is not None:
            self._recorder.off = True

    # -- the training-thread API -------------------------------------------------------
    def begin_phase(self, name: str, stream: Any = None, span: bool = False,
                    collective: bool = False, peer: int = NO_PEER) -> PhaseToken | None:
        """Mark the start of a phase on ``stream`` (device clocks) or now (host clock).

        A phase begun several times in a step adds up its intervals; with ``span`` (parts
        that overlap, like a DDP step's gradient buckets, each queued behind the previous
        one) it lasts from the first part's start to the last part's end instead. A
        ``collective`` (``begin_collective``) lasts the union of its intervals. On a device
        clock a start right after a phase's end on the same stream shares its event: work
        issued between two phases counts in the later one.
        """
        if collective:
            return self.begin_collective(name, peer, stream)
        if self._off:  # closed, or a forked worker: never trace there
            return None
        sampled = self._sampled
        cpu0 = thread_time() if sampled else 0.0
        lock = self._lock
        lock.acquire()
        try:
            step = self._current
            cells = step.cells
            base = len(cells)
            if span and name in step.spans:  # a later part: the first part's start stands
                token = (step.index << SLOT_BITS) | step.spans[name]
            elif base >= MAX_CELLS:
                token = (step.index << SLOT_BITS) | FULL
            else:
                start, key = self._start_mark(step, stream)
                if span:
                    cells.extend((name, start, NO_MARK, SPAN, NO_MARK, key, stream, NO_PEER))
                    step.spans[name] = base
                else:
                    cells.extend((name, start, NO_MARK, PLAIN, NO_MARK, key, stream, NO_PEER))
                token = (step.index << SLOT_BITS) | base
        finally:
            lock.release()
        if sampled:
            self._cpu += thread_time() - cpu0
        return token

    def begin_collective(self, name: str, peer: int = NO_PEER,
                         stream: Any = None) -> PhaseToken | None:
        """Mark the issue of collective ``name`` on ``stream`` (None: the current one); end it
        with ``end_collective``. A collective's phase lasts the union of its intervals in the
        step; a point-to-point one names its ``peer`` (global rank), and the step record also
        holds its time, message count and shortest message per peer. The collective hooks'
        hot path: one lock, one mark, one extend."""
        if self._off:
            return None
        sampled = self._sampled
        cpu0 = thread_time() if sampled else 0.0
        lock = self._lock
        lock.acquire()
        try:
            step = self._current
            cells = step.cells
            base = len(cells)
            if base >= MAX_CELLS:
                token = (step.index << SLOT_BITS) | FULL
            else:
                if self._device:
                    start, key = self._start_mark(step, stream)
                else:  # a host clock: no mark to share
                    marks = step.marks
                    if not marks:
                        self._open(step)
                    start = len(marks)
                    key = 0 if self._one_stream else self._stream_key(stream)
                    marks.append(self.mark_now())
                cells.extend((name, start, NO_MARK, COLLECTIVE, NO_MARK, key, stream, peer))
                step.collectives = True
                token = (step.index << SLOT_BITS) | base
        finally:
            lock.release()
        if sampled:
            self._cpu += thread_time() - cpu0
        return token

    def collective_recording(self, native: Any = None) -> tuple[Callable[..., Any],
                                                                Callable[..., None]]:
        """The begin and end the collective hooks call: ``begin_collective`` and
        ``end_collective``, or on the host clock, where ``native`` (the hooks' extension
        module, ``_native/hooks.c``) is given, the same recording in C: the same cells and
        marks, everything off its common path left to these methods."""
        if (native is None or self._device or not self._one_stream
                or self.mark_now is not perf_counter_ns):
            return self.begin_collective, self.end_collective
        with self._lock:  # one recorder a tracer: step() hands it each new step
            recorder = self._recorder
            if recorder is None:
                recorder = native.HostRecorder(
                    self._lock, self.mark_now, self.begin_collective, self.end_collective,
                    COLLECTIVE, NO_MARK, 0, MAX_CELLS, STRIDE, END, WAITED, SLOT_BITS, FULL)
                recorder.enter(self._current)
                recorder.off, recorder.sampled = self._off, self._sampled
                self._recorder = recorder
        return recorder.begin, recorder.end

    def _start_mark(self, step: _Step, stream: Any) -> tuple[int, int]:
        """The index in ``step.marks`` of a phase's start on ``stream`` (a new mark, or the
        end of the stream's previous phase on a device clock that shares them) and the
        stream's key. Under the tracer's lock."""
        device = self._device
        where = self._stream() if stream is None and device else stream
        key = self._stream_key(where)
        marks = step.marks
        if not marks:
            self._open(step)
        # the stream's newest mark: a phase's end (negative) is this start's too
        previous = step.last.get(key, 0) if self._share else 0
        if previous < 0:
            start = -previous - 1
        else:
            start = len(marks)
            marks.append(self._mark(where))
        if device:
            step.last[key] = start
        return start, key

    def _open(self, step: _Step) -> None:
        """Host times of a step's first mark (taken next, as ``marks[0]``)."""
        now_epoch = time.time_ns()
        step.first_epoch_ns = now_epoch
        if self._last_end_perf_ns is None:  # the first step starts at its first phase
            self._last_end_perf_ns = time.perf_counter_ns()
            self._last_end_epoch_ns = now_epoch
            self._run_delay.since_last()  # from here, each step's wait for a CPU
        step.t_ns = self._last_end_epoch_ns

    def end_phase(self, token: PhaseToken | None, stream: Any = None) -> None:
        """Mark the end of the phase begun with ``token``."""
        if token is None or self._off:
            return
        sampled = self._sampled
        cpu0 = thread_time() if sampled else 0.0
        base = token & SLOT_MASK
        lock = self._lock
        lock.acquire()
        try:
            step = self._current
            late = token >> SLOT_BITS != step.index
            if not late and base != FULL:
                cells = step.cells
                where = stream if stream is not None else cells[base + ARG]
                if where is None and self._device:
                    where = self._stream()
                end = cells[base + END]
                if end >= 0:  # a span's later part: its end moves, on the same event
                    step.marks[end] = self.clock.remark(step.marks[end], where)
                else:
                    end = cells[base + END] = len(step.marks)
                    step.marks.append(self._mark(where))
                if self._device:
                    step.last[self._stream_key(where)] = -end - 1
                late = None
        finally:
            lock.release()
        if late is not None:
            self._dropped_end(late, None)
        if sampled:
            self._cpu += thread_time() - cpu0

    def wait_mark(self, token: PhaseToken | None) -> Any:
        """A mark now, on the stream the phase of ``token`` began on: where a rank began to
        wait for a collective (pass it to ``end_collective``)."""
        if token is None or self._off:
            return None
        if not self._device:  # the host clock has one stream: no need to look it up
            return self._mark(None)
        base = token & SLOT_MASK
        with self._lock:
            step = self._current
            stream = (step.cells[base + ARG] if token >> SLOT_BITS == step.index
                      and base != FULL else None)
        return self.clock.mark(stream)

    def end_collective(self, token: PhaseToken | None, waited_from: Any = None) -> None:
        """End a collective begun with ``begin_collective``: now, on the stream its begin was
        given (None: the current one, where a wait takes effect). ``waited_from`` is the mark
        where the rank began to wait for it (``wait_mark``, or ``mark_now`` for one issued on
        the current stream; None: it was waited for from its start, a synchronous call); that
        part is taken out of every other phase it fell inside on the same stream."""
        if token is None or self._off:
            if waited_from is not None:
                self.clock.release(waited_from)
            return
        base = token & SLOT_MASK
        lock = self._lock
        lock.acquire()
        try:
            step = self._current
            late = token >> SLOT_BITS != step.index
            if not late and base != FULL:
                marks, cells = step.marks, step.cells
                end = cells[base + END] = len(marks)
                marks.append(self._mark(cells[base + ARG]) if self._device
                             else self.mark_now())
                if waited_from is not None:
                    cells[base + WAITED] = len(marks)
                    marks.append(waited_from)
                if self._device:
                    step.last[cells[base + KEY]] = -end - 1
                late = None
        finally:
            lock.release()
        if late is not None:
            self._dropped_end(late, waited_from)

    def _dropped_end(self, late: bool, waited_from: Any) -> None:
        # ended after its step closed (its step record is already on its way), or a step
        # that never closes (collectives outside training: evaluation without an optimizer)
        self.health.drop("late_phase" if late else "step_intervals_full")
        if waited_from is not None:
            self.clock.release(waited_from)

    def drop_phase(self, token: PhaseToken | None, reason: str) -> None:
        """Forget a phase that will never end (a collective nobody waited for), counted.
        Its start mark goes back with its step's."""
        if token is not None:
            self.health.drop(reason)

    def update_coords(self, coords: dict[str, int]) -> None:
        """The rank's coordinates, learned from its process groups: a new ``rank`` record
        and new labels on its metrics."""
        with self._identity_lock:
            if coords == self.identity.coords:
                return
            self.identity = dataclasses.replace(self.identity, coords=dict(coords))
            self.metrics.identity = self.identity
            self.emit(rank_record(self.identity))

    @contextlib.contextmanager
    def phase(self, name: str, stream: Any = None):
        """``with tracer.phase("mlp"):`` times the block as one phase of the current step."""
        token = self.begin_phase(name, stream)
        try:
            yield
        finally:
            self.end_phase(token, stream)

    def step(self) -> None:
        """Close the current step (called after the optimizer step) and resolve ready steps."""
        if self._off:
            return
        sampled = self._sampled
        cpu0 = thread_time() if sampled else 0.0
        device = self._device
        where = self._stream() if device else None
        key = self._stream_key(where) if device else 0
        free = self._free
        following = free.pop() if free else _Step()
        first = self._last_end_perf_ns is None
        cpu_wait = None if first else self._run_delay.since_last()
        lock = self._lock
        lock.acquire()
        try:
            step = self._current
            step.cpu_wait_s = cpu_wait
            marks = step.marks
            if not marks:
                self._open(step)
            previous = step.last.get(key) if self._share else None
            if previous is not None and previous < 0:  # nothing a phase owns since its end
                step.end = -previous - 1
            else:
                step.end = len(marks)
                marks.append(self._mark(where))
                if device:
                    step.last[key] = -step.end - 1
            now_perf = perf_counter_ns()
            step.wall_s = (now_perf - self._last_end_perf_ns) * 1e-9
            self._last_end_perf_ns = now_perf
            self._last_end_epoch_ns = step.t_ns + int(step.wall_s * 1e9)
            self._pending.append(step)
            following.reset(step.index + 1)
            self._current = following
            if self._recorder is not None:
                self._recorder.enter(following)
            if self.open_at_previous_end:
                self._open(following)
                following.marks.append(self._mark(where))
                if device:
                    following.last[key] = 0
            backlog = len(self._pending)
        finally:
            lock.release()
        pending_steps = self.settings.pending_steps
        if backlog >= pending_steps // 4:  # batch: one wake per many steps
            self._wake.set()
        if backlog > pending_steps // 2:
            self.poll()  # the resolver is starved (a GIL-bound loop): catch up here
            # never while a resolver reads a pending step's marks: both locks
            with self._poll_lock, self._lock:
                while len(self._pending) > pending_steps:  # the device lags
                    self._discard(self._pending.popleft(), "gpu_lag")
        for probe in self.probes:
            probe.on_step(step.index, step.wall_s)
        self.health.steps += 1
        if sampled:  # scale the sampled step's cost to the steps it stands for
            self.health.add_cpu((self._cpu + thread_time() - cpu0) * CPU_SAMPLE_EVERY)
            self._cpu = 0.0
        self._sampled = sample_next = (step.index + 1) % CPU_SAMPLE_EVERY == 0
        if self._recorder is not None:
            self._recorder.sampled = sample_next

    # -- resolution ----------------------------------------------------------------------
    def _recycle(self, step: _Step) -> None:
        """Return a finished step's marks to the clock and the step to the free list."""
        release_all = getattr(self.clock, "release_all", None)
        if release_all is not None:
            release_all(step.marks)
        else:
            for mark in step.marks:
                self.clock.release(mark)
        step.reset(0)
        if len(self._free) < 8:
            self._free.append(step)

    def _discard(self, step: _Step, reason: str) -> None:
        self.health.drop(reason)
        self._recycle(step)

    def poll(self, block: bool = False) -> int:
        """Resolve closed steps whose marks have completed; returns how many were emitted.

        With ``block`` (shutdown only) it waits for the device instead of skipping.
        """
        with self._poll_lock:  # one resolver at a time keeps records in step order
            return self._poll(block)

    def _poll(self, block: bool) -> int:
        """Resolve ready steps in order, up to POLL_BATCH at a time. Readiness is read
        outside the tracer's lock (only the newest mark of each stream of each step), then
        every mark of the ready steps in one batch (``offsets_many``); discarding a pending
        step takes the poll lock too, so the steps read here stay in the queue until this pops
        them."""
        done = 0
        clock = self.clock
        while True:
            with self._lock:
                batch = list(itertools.islice(self._pending, POLL_BATCH))
            if not batch:
                return done
            if block:
                for step in batch:
                    for mark in step.marks:
                        clock.wait(mark)
            elif self._device:
                batch = batch[:_ready_steps(clock, batch)]
                if not batch:
                    return done
            with self._lock:
                for _ in batch:
                    self._pending.popleft()
            batch, times = self._read_times(batch)
            epochs = (_epochs_many(clock, [step.marks[0] for step in batch])
                      if self._device and self.settings.phases else [None] * len(batch))
            spans = self.spans is not None and self.spans.active()  # apps may set it late
            observed = [self._resolve(step, step_times, epoch, spans)
                        for step, step_times, epoch in zip(batch, times, epochs, strict=True)]
            self.metrics.observe_many(observed)
            done += len(batch)

    def _read_times(self, batch: list[_Step]) -> tuple[list[_Step], list[list[float]]]:
        """The steps' marks' times, in one batch; when CUDA refuses a read (an event of another
        device, a destroyed one), step by step, and a step it refuses is dropped and counted
        (``device_read_error``): never an exception into training or the resolver's end."""
        clock = self.clock
        try:
            return batch, _offsets_many(clock, [step.marks for step in batch])
        except RuntimeError:
            pass
        kept, times = [], []
        for step in batch:
            try:
                times.append(_offsets_many(clock, [step.marks])[0])
            except RuntimeError:
                self._discard(step, "device_read_error")
                continue
            kept.append(step)
        return kept, times

    def _resolve(self, step: _Step, times: list[float], epoch: int | None, spans: bool,
                 ) -> tuple[float, float, dict[str, float], float | None]:
        """A step's record and spans from its marks' ``times`` and the epoch time of its
        first mark on the device (None: not known); returns what the metrics observe of it
        (wall seconds, device seconds, seconds per phase, CPU wait)."""
        phases, offsets, peers = self._phase_times(step, times, spans)
        gpu_s = max(times[step.end], 0.0)
        if self.settings.phases:
            self.emit(step_record(self.identity, step.index, step.t_ns, step.wall_s, gpu_s,
                                  phases, epoch, peers, step.cpu_wait_s))
        if spans:
            self.spans.emit(step.index, step.t_ns, step.wall_s, step.first_epoch_ns, offsets)
        wall_s, cpu_wait_s = step.wall_s, step.cpu_wait_s
        self._recycle(step)
        return wall_s, gpu_s, phases, cpu_wait_s

    def _phase_times(self, step: _Step, times: list[float], spans: bool = True,
                     ) -> tuple[dict[str, float], list[tuple[str, float, float]],
                                dict[str, dict[int, tuple[float, int, float]]]]:
        """Seconds per phase name, in the order the phases started, (with ``spans``) each
        interval's (name, start offset, duration) for spans, and each point-to-point phase's
        (seconds, messages, shortest message's seconds) per peer; ``times`` holds each mark's
        seconds from the step's first mark.

        Intervals of one name add up, except span phases (a DDP step's buckets), which last
        from their first start to their last end (each bucket's interval includes its queue
        behind the earlier ones: summing them could exceed the step itself), and collectives,
        which last the union of their intervals. The time a rank waited for a collective is
        taken out of the phases (``forward``, not ``{axis}-{op}`` ones) it fell inside on the
        same stream: they count their own work only. A point-to-point phase's time with a
        peer is the union of its intervals with that peer (each one message).
        """
        first: dict[str, float] = {}
        total: dict[str, float] = {}
        offsets: list[tuple[str, float, float]] = []
        peers: dict[str, dict[int, tuple[float, int, float]]] = {}
        cells = step.cells
        if not step.collectives and not spans:  # the common step: plain phases and spans
            for base in range(0, len(cells), STRIDE):
                end_mark = cells[base + END]
                if end_mark < 0:  # never ended (dropped, or left open): not an interval
                    continue
                name = cells[base]
                start = times[cells[base + START]]
                own = times[end_mark] - start
                seen = first.get(name)
                if seen is None:
                    first[name] = start
                    total[name] = own if own > 0.0 else 0.0
                else:  # a span has one interval a step: this is a repeated plain phase
                    if start < seen:
                        first[name] = start
                    total[name] += own if own > 0.0 else 0.0
            if len(first) > 1:
                ordered = sorted(first, key=first.__getitem__)
                return {name: total[name] for name in ordered}, offsets, peers
            return total, offsets, peers
        span_end: dict[str, float] = {}
        united: dict[str, list[tuple[float, float]]] = {}
        with_peer: dict[tuple[str, int], list[tuple[float, float]]] = {}
        waits: dict[int, list[tuple[float, float]]] = {}
        plain: list[tuple[str, float, float, int]] = []
        for base in range(0, len(cells), STRIDE):
            end_mark = cells[base + END]
            if end_mark < 0:
                continue
            name = cells[base]
            start = times[cells[base + START]]
            end = times[end_mark]
            if end < start:
                end = start
            if spans:
                offsets.append((name, start, end - start))
            kind = cells[base + KIND]
            if kind == PLAIN:
                plain.append((name, start, end, cells[base + KEY]))
            elif kind == SPAN:
                span_end[name] = max(span_end.get(name, start), end)
            else:
                united.setdefault(name, []).append((start, end))
                if cells[base + PEER] != NO_PEER:
                    with_peer.setdefault((name, cells[base + PEER]), []).append((start, end))
                waited_mark = cells[base + WAITED]
                waited = start if waited_mark < 0 else times[waited_mark]
                waits.setdefault(cells[base + KEY], []).append(
                    (min(max(waited, start), end), end))
            seen = first.get(name)
            if seen is None or start < seen:
                first[name] = start
        for name, end in span_end.items():
            total[name] = total.get(name, 0.0) + max(end - first[name], 0.0)
        for name, intervals in united.items():
            total[name] = total.get(name, 0.0) + sum(e - s for s, e in _union(intervals))
        for (name, peer), intervals in with_peer.items():
            peers.setdefault(name, {})[peer] = (sum(e - s for s, e in _union(intervals)),
                                                len(intervals),
                                                min(e - s for s, e in intervals))
        blocked = {stream: _union(intervals) for stream, intervals in waits.items()}
        for name, start, end, stream in plain:
            own = end - start
            if blocked and stream in blocked and "-" not in name:
                own -= sum(max(min(end, e) - max(start, s), 0.0) for s, e in blocked[stream])
            total[name] = total.get(name, 0.0) + max(own, 0.0)
        ordered = sorted(first, key=first.__getitem__)
        return {name: total[name] for name in ordered}, offsets, peers

    # -- records, flush, shutdown ----------------------------------------------------------
    def emit(self, record: dict) -> None:
        """Queue one schema-v1 record for the sink (probes call this from their threads)."""
        if not self._in_child:
            self.shipper.submit(encode(record))

    def force_flush(self, timeout: float = 5.0) -> bool:
        """Resolve what the device has finished and push everything to the sink."""
        self.poll()
        return self.shipper.force_flush(timeout)

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop probes, resolve pending steps (waiting for the device), flush, close."""
        if self._closed or self._in_child:
            return
        for probe in self.probes:
            with contextlib.suppress(Exception):
                probe.shutdown(timeout)
        self._closed = True
        self._turn_off()
        self._wake.set()
        self._resolver.join(timeout)
        self.poll(block=True)
        self.shipper.shutdown(timeout)
