"""The Tracer: phase marks in, one ``step`` record per training step out.

Instrumentation (module and optimizer hooks, ``phase()`` blocks, the DDP comm hook) calls
``begin_phase``/``end_phase``; the optimizer step (or an explicit ``step()``) closes a step.
Closed steps wait in a bounded queue until their marks have completed on the device; a
background resolver thread then reads them in bulk (the newest mark of each stream queried,
one elapsed time per distinct mark, never a synchronise, never on the training thread), and
each becomes a ``step`` record
for the shipper, an update of the hot metrics and, when the application traces with
OpenTelemetry, spans. ``NoOpTracer`` has the same methods and does nothing: it is what
instrumentation gets when Argus is off, so call sites need no ``if``.

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
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from argus_exporters import placement
from argus_exporters.clock import Clock, default_clock
from argus_exporters.config import Settings
from argus_exporters.health import Health
from argus_exporters.identity import RankIdentity
from argus_exporters.metrics import StepMetrics
from argus_exporters.otel import SpanEmitter
from argus_exporters.probes import Probe
from argus_exporters.records import encode, rank_record, step_record
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

    __slots__ = ("cells", "collectives", "end", "first_epoch_ns", "index", "last", "marks",
                 "spans", "t_ns", "wall_s")

    def __init__(self, index: int = 0):
        self.marks: list[Any] = []
        self.cells: list[Any] = []
        self.spans: dict[str, int] = {}
        self.last: dict[int, int] = {}
        self.reset(index)

    def reset(self, index: int) -> None:
        """Empty, for step ``index`` (the lists keep their storage)."""
        self.index = index
        self.t_ns = 0  # host epoch time at the step's start
        self.first_epoch_ns = 0  # host epoch time when marks[0] was taken
        self.wall_s = 0.0
        self.end = NO_MARK
        self.collectives = 0  # collective intervals (their waits are taken out of phases)
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


def _offsets(clock: Clock, marks: list[Any]) -> list[float]:
    """Seconds from ``marks[0]`` to each mark, in bulk where the clock can (``offsets``)."""
    bulk = getattr(clock, "offsets", None)
    if bulk is not None:
        return bulk(marks)
    first = marks[0]
    return [clock.seconds(first, mark) for mark in marks]


CPU_SAMPLE_EVERY = 16
RESOLVE_PERIOD_S = 0.2  # the resolver also wakes when a quarter of the pending queue is used


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
                                   lambda: self.shipper.depth)
        self.spans = SpanEmitter(identity) if settings.otel else None
        self.probes: list[Probe] = []
        self._lock = threading.Lock()
        self._poll_lock = threading.Lock()
        self._current = _Step(0)
        self._pending: deque[_Step] = deque()
        self._free: list[_Step] = []  # resolved steps, reused (no allocation per step)
        self._device = bool(self.clock.device)
        # consecutive marks on one stream (a phase's end, the next phase's start) share one
        # CUDA event; host marks cost nothing and keep their own values
        self._share = self._device and share_marks
        self._last_end_perf_ns: int | None = None
        self._last_end_epoch_ns = 0
        self._closed = False
        self._in_child = False
        self._off = False  # closed or in a forked child: the hot path checks one flag
        self._cpu = 0.0  # training-thread CPU time measured in the current sampled step
        self._sampled = True  # CPU clocks are read in 1 step of CPU_SAMPLE_EVERY (they cost)
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
        self._off = True

    # -- the training-thread API -------------------------------------------------------
    def begin_phase(self, name: str, stream: Any = None, span: bool = False,
                    collective: bool = False, peer: int = NO_PEER) -> PhaseToken | None:
        """Mark the start of a phase on ``stream`` (device clocks) or now (host clock).

        A phase begun several times in a step adds up its intervals; with ``span`` (parts
        that overlap, like a DDP step's gradient buckets, each queued behind the previous
        one) it lasts from the first part's start to the last part's end instead. A
        ``collective`` (ended with ``end_collective``) lasts the union of its intervals;
        a point-to-point one names its ``peer`` (global rank), and the step record also holds
        its time, message count and shortest message per peer. On a device clock a start
        right after a phase's end on the same stream shares its event: work issued between
        two phases counts in the later one.
        """
        if self._off:  # closed, or a forked worker: never trace there
            return None
        sampled = self._sampled
        cpu0 = time.thread_time() if sampled else 0.0
        clock = self.clock
        with self._lock:
            step = self._current
            cells = step.cells
            if span and name in step.spans:  # a later part: the first part's start stands
                token = (step.index << SLOT_BITS) | step.spans[name]
            elif len(cells) >= MAX_CELLS:
                token = (step.index << SLOT_BITS) | FULL
            else:
                where = (stream if stream is not None or not self._device
                         else clock.current_stream())
                key = clock.stream_key(where)
                marks = step.marks
                if not marks:
                    self._open(step)
                previous = step.last.get(key) if self._share else None
                if previous is not None and previous < 0:
                    start = -previous - 1
                else:
                    start = len(marks)
                    marks.append(clock.mark(where))
                if self._device:
                    step.last[key] = start
                base = len(cells)
                if collective:
                    cells.extend((name, start, NO_MARK, COLLECTIVE, NO_MARK, key, stream,
                                  peer))
                    step.collectives += 1
                else:
                    cells.extend((name, start, NO_MARK, SPAN if span else PLAIN, NO_MARK, key,
                                  stream, NO_PEER))
                    if span:
                        step.spans[name] = base
                token = (step.index << SLOT_BITS) | base
        if sampled:
            self._cpu += time.thread_time() - cpu0
        return token

    def _open(self, step: _Step) -> None:
        """Host times of a step's first mark (taken next, as ``marks[0]``)."""
        now_epoch = time.time_ns()
        step.first_epoch_ns = now_epoch
        if self._last_end_perf_ns is None:  # the first step starts at its first phase
            self._last_end_perf_ns = time.perf_counter_ns()
            self._last_end_epoch_ns = now_epoch
        step.t_ns = self._last_end_epoch_ns

    def end_phase(self, token: PhaseToken | None, stream: Any = None) -> None:
        """Mark the end of the phase begun with ``token``."""
        if token is None or self._off:
            return
        sampled = self._sampled
        cpu0 = time.thread_time() if sampled else 0.0
        clock = self.clock
        base = token & SLOT_MASK
        with self._lock:
            step = self._current
            late = token >> SLOT_BITS != step.index
            if not late and base != FULL:
                cells = step.cells
                where = stream if stream is not None else cells[base + ARG]
                if where is None and self._device:
                    where = clock.current_stream()
                end = cells[base + END]
                if end >= 0:  # a span's later part: its end moves, on the same event
                    step.marks[end] = clock.remark(step.marks[end], where)
                else:
                    end = cells[base + END] = len(step.marks)
                    step.marks.append(clock.mark(where))
                if self._device:
                    step.last[clock.stream_key(where)] = -end - 1
                late = None
        if late is not None:
            self._dropped_end(late, None)
        if sampled:
            self._cpu += time.thread_time() - cpu0

    def wait_mark(self, token: PhaseToken | None) -> Any:
        """A mark now, on the stream the phase of ``token`` began on: where a rank began to
        wait for a collective (pass it to ``end_collective``)."""
        if token is None or self._off:
            return None
        base = token & SLOT_MASK
        with self._lock:
            step = self._current
            stream = (step.cells[base + ARG] if token >> SLOT_BITS == step.index
                      and base != FULL else None)
        return self.clock.mark(stream)

    def end_collective(self, token: PhaseToken | None, waited_from: Any = None) -> None:
        """End a collective begun with ``begin_phase(name, collective=True)``: now, on the
        stream it was issued on. ``waited_from`` is the mark where the rank began to wait
        for it (``wait_mark``; None: it was waited for from its start, a synchronous call);
        that part is taken out of every other phase it fell inside on the same stream."""
        if token is None or self._off:
            if waited_from is not None:
                self.clock.release(waited_from)
            return
        clock = self.clock
        base = token & SLOT_MASK
        with self._lock:
            step = self._current
            late = token >> SLOT_BITS != step.index
            if not late and base != FULL:
                marks, cells = step.marks, step.cells
                end = cells[base + END] = len(marks)
                marks.append(clock.mark(cells[base + ARG]))
                if waited_from is not None:
                    cells[base + WAITED] = len(marks)
                    marks.append(waited_from)
                if self._device:
                    step.last[cells[base + KEY]] = -end - 1
                late = None
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
        cpu0 = time.thread_time() if sampled else 0.0
        clock = self.clock
        where = clock.current_stream() if self._device else None
        key = clock.stream_key(where) if self._device else 0
        free = self._free
        following = free.pop() if free else _Step()
        with self._lock:
            step = self._current
            marks = step.marks
            if not marks:
                self._open(step)
            previous = step.last.get(key) if self._share else None
            if previous is not None and previous < 0:  # nothing a phase owns since its end
                step.end = -previous - 1
            else:
                step.end = len(marks)
                marks.append(clock.mark(where))
                if self._device:
                    step.last[key] = -step.end - 1
            now_perf = time.perf_counter_ns()
            step.wall_s = (now_perf - self._last_end_perf_ns) * 1e-9
            self._last_end_perf_ns = now_perf
            self._last_end_epoch_ns = step.t_ns + int(step.wall_s * 1e9)
            self._pending.append(step)
            following.reset(step.index + 1)
            self._current = following
            if self.open_at_previous_end:
                self._open(following)
                following.marks.append(clock.mark(where))
                if self._device:
                    following.last[key] = 0
            backlog = len(self._pending)
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
            self.health.add_cpu((self._cpu + time.thread_time() - cpu0) * CPU_SAMPLE_EVERY)
            self._cpu = 0.0
        self._sampled = (step.index + 1) % CPU_SAMPLE_EVERY == 0

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
        """Resolve ready steps in order. Readiness is read outside the tracer's lock (only
        the newest mark of each stream); discarding a pending step takes the poll lock too,
        so the step read here stays in the queue until this pops it."""
        done = 0
        clock = self.clock
        while True:
            with self._lock:
                if not self._pending:
                    return done
                step = self._pending[0]
            if block:
                for mark in step.marks:
                    clock.wait(mark)
            elif self._device and not clock.ready_all(step.tails()):
                return done
            with self._lock:
                self._pending.popleft()
            self._resolve(step)
            done += 1

    def _resolve(self, step: _Step) -> None:
        spans = self.spans is not None and self.spans.active()
        times = _offsets(self.clock, step.marks)
        phases, offsets, peers = self._phase_times(step, times, spans)
        gpu_s = max(times[step.end], 0.0)
        if self.settings.phases:
            epoch = self.clock.epoch_ns(step.marks[0]) if self._device else None
            self.emit(step_record(self.identity, step.index, step.t_ns, step.wall_s, gpu_s,
                                  phases, epoch, peers))
        self.metrics.observe(step.wall_s, gpu_s, phases)
        if spans:
            self.spans.emit(step.index, step.t_ns, step.wall_s, step.first_epoch_ns, offsets)
        self._recycle(step)

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
        self._off = True
        self._wake.set()
        self._resolver.join(timeout)
        self.poll(block=True)
        self.shipper.shutdown(timeout)
