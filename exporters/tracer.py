"""The Tracer: phase marks in, one ``step`` record per training step out.

Instrumentation (module and optimizer hooks, ``phase()`` blocks, the DDP comm hook) calls
``begin_phase``/``end_phase``; the optimizer step (or an explicit ``step()``) closes a step.
Closed steps wait in a bounded queue until their marks have completed on the device; a
background resolver thread then reads them (``query()``, never a synchronise, never on the
training thread), and each becomes a ``step`` record
for the shipper, an update of the hot metrics and, when the application traces with
OpenTelemetry, spans. ``NoOpTracer`` has the same methods and does nothing: it is what
instrumentation gets when Argus is off, so call sites need no ``if``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from argus_exporters.clock import Clock, default_clock
from argus_exporters.config import Settings
from argus_exporters.health import Health
from argus_exporters.identity import RankIdentity
from argus_exporters.metrics import StepMetrics
from argus_exporters.otel import SpanEmitter
from argus_exporters.records import encode, rank_record, step_record
from argus_exporters.shipper import Shipper
from argus_exporters.sinks import create_sink


@dataclass(slots=True)
class _Phase:
    name: str
    start: Any
    end: Any
    span: bool = False
    collective: bool = False  # intervals of one name are united; its wait is taken out of
    waited_from: Any = None  # the phases it fell inside, from this mark to ``end``
    stream: int = 0  # clock.stream_key of the stream the marks were taken on


@dataclass
class _Step:
    index: int
    t_ns: int = 0  # host epoch time at the step's start
    first_mark: Any = None  # device (or host) mark at the first phase of the step
    first_epoch_ns: int = 0  # host epoch time when first_mark was taken
    phases: list[_Phase] = field(default_factory=list)
    end_mark: Any = None
    wall_s: float = 0.0


@dataclass(frozen=True, slots=True)
class PhaseToken:
    """Returned by ``begin_phase``; pass it to ``end_phase``."""

    name: str
    step: int
    start: Any
    stream: Any
    span: bool = False
    collective: bool = False
    stream_key: int = 0


class NoOpTracer:
    """Argus switched off: every call returns at once."""

    enabled = False

    def begin_phase(self, name: str, stream: Any = None, span: bool = False,
                    collective: bool = False) -> None:
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


CPU_SAMPLE_EVERY = 16
MAX_INTERVALS_PER_STEP = 1 << 16  # phase intervals kept for one step; more are dropped
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
                 health: Health | None = None, sink=None):
        self.settings = settings
        self.identity = identity
        self.health = health or Health()
        self.clock = clock or default_clock()
        self.shipper = Shipper(sink or create_sink(settings, identity, self.health), self.health,
                               settings.queue_records, settings.batch_records, settings.flush_s)
        self.metrics = StepMetrics(identity, self.health, settings.window_steps,
                                   lambda: self.shipper.depth)
        self.spans = SpanEmitter(identity) if settings.otel else None
        self.probes: list[Any] = []
        self._lock = threading.Lock()
        self._poll_lock = threading.Lock()
        self._current = _Step(0)
        self._pending: deque[_Step] = deque()
        self._last_end_perf_ns: int | None = None
        self._last_end_epoch_ns = 0
        self._closed = False
        self._in_child = False
        self._cpu = 0.0  # training-thread CPU time measured in the current sampled step
        self._sampled = True  # CPU clocks are read in 1 step of CPU_SAMPLE_EVERY (they cost)
        weak = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: (t := weak()) and t._forked())
        self._wake = threading.Event()
        self._resolver = threading.Thread(target=self._resolve_loop, name="argus-resolver",
                                          daemon=True)
        self._resolver.start()
        self.emit(rank_record(identity))

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

    # -- the training-thread API -------------------------------------------------------
    def _active(self) -> bool:
        return not (self._closed or self._in_child)  # never trace in forked workers

    def begin_phase(self, name: str, stream: Any = None, span: bool = False,
                    collective: bool = False) -> PhaseToken | None:
        """Mark the start of a phase on ``stream`` (device clocks) or now (host clock).

        A phase begun several times in a step adds up its intervals; with ``span`` (parts
        that overlap, like a DDP step's gradient buckets, each queued behind the previous
        one) it lasts from the first part's start to the last part's end instead. A
        ``collective`` (ended with ``end_collective``) lasts the union of its intervals.
        """
        if not self._active():
            return None
        cpu0 = time.thread_time() if self._sampled else 0.0
        start = self.clock.mark(stream)
        key = self.clock.stream_key(stream)
        with self._lock:
            step = self._current
            if step.first_mark is None:
                self._open(step, stream)
            token = PhaseToken(name, step.index, start, stream, span, collective, key)
        if self._sampled:
            self._cpu += time.thread_time() - cpu0
        return token

    def _open(self, step: _Step, stream: Any) -> None:
        now_epoch = time.time_ns()
        step.first_mark = self.clock.mark(stream)
        step.first_epoch_ns = now_epoch
        if self._last_end_perf_ns is None:  # the first step starts at its first phase
            self._last_end_perf_ns = time.perf_counter_ns()
            self._last_end_epoch_ns = now_epoch
        step.t_ns = self._last_end_epoch_ns

    def end_phase(self, token: PhaseToken | None, stream: Any = None) -> None:
        """Mark the end of the phase begun with ``token``."""
        if token is None or not self._active():
            return
        cpu0 = time.thread_time() if self._sampled else 0.0
        end = self.clock.mark(stream if stream is not None else token.stream)
        self._close(_Phase(token.name, token.start, end, token.span, token.collective,
                           stream=token.stream_key), token.step)
        if self._sampled:
            self._cpu += time.thread_time() - cpu0

    def end_collective(self, token: PhaseToken | None, waited_from: Any = None) -> None:
        """End a collective begun with ``begin_phase(name, collective=True)``: now, on the
        stream it was issued on. ``waited_from`` is the mark where the rank began to wait
        for it (None: it was waited for from its start, a synchronous call); that part is
        taken out of every other phase it fell inside on the same stream."""
        if token is None or not self._active():
            if waited_from is not None:
                self.clock.release(waited_from)
            return
        end = self.clock.mark(token.stream)
        self._close(_Phase(token.name, token.start, end, collective=True,
                           waited_from=waited_from, stream=token.stream_key), token.step)

    def drop_phase(self, token: PhaseToken | None, reason: str) -> None:
        """Forget a phase that will never end (a collective nobody waited for), counted."""
        if token is not None:
            self.health.drop(reason)
            self.clock.release(token.start)

    def _close(self, phase: _Phase, step_index: int) -> None:
        with self._lock:
            current = self._current
            if step_index == current.index and len(current.phases) < MAX_INTERVALS_PER_STEP:
                current.phases.append(phase)
                return
            late = step_index != current.index
        # ended after its step closed (its step record is already on its way), or a step
        # that never closes (collectives outside training: evaluation without an optimizer)
        self.health.drop("late_phase" if late else "step_intervals_full")
        for mark in (phase.start, phase.end, phase.waited_from):
            if mark is not None:
                self.clock.release(mark)

    def update_coords(self, coords: dict[str, int]) -> None:
        """The rank's coordinates, learned from its process groups: a new ``rank`` record
        and new labels on its metrics."""
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
        if not self._active():
            return
        sampled = self._sampled
        cpu0 = time.thread_time() if sampled else 0.0
        end = self.clock.mark()
        now_perf = time.perf_counter_ns()
        with self._lock:
            step = self._current
            if step.first_mark is None:
                self._open(step, None)
            step.end_mark = end
            step.wall_s = (now_perf - self._last_end_perf_ns) * 1e-9
            self._last_end_perf_ns = now_perf
            self._last_end_epoch_ns = step.t_ns + int(step.wall_s * 1e9)
            self._pending.append(step)
            self._current = _Step(step.index + 1)
            if self.open_at_previous_end:
                self._open(self._current, None)
            backlog = len(self._pending)
        if backlog >= self.settings.pending_steps // 4:  # batch: one wake per many steps
            self._wake.set()
        if backlog > self.settings.pending_steps // 2:
            self.poll()  # the resolver is starved (a GIL-bound loop): catch up here
            with self._lock:
                while len(self._pending) > self.settings.pending_steps:  # the device lags
                    self._discard(self._pending.popleft(), "gpu_lag")
        for probe in self.probes:
            probe.on_step(step.index, step.wall_s)
        self.health.steps += 1
        if sampled:  # scale the sampled step's cost to the steps it stands for
            self.health.add_cpu((self._cpu + time.thread_time() - cpu0) * CPU_SAMPLE_EVERY)
            self._cpu = 0.0
        self._sampled = (step.index + 1) % CPU_SAMPLE_EVERY == 0

    # -- resolution ----------------------------------------------------------------------
    def _marks(self, step: _Step) -> list[Any]:
        marks = [step.first_mark, step.end_mark]
        for p in step.phases:
            marks += (p.start, p.end) if p.waited_from is None else (p.start, p.end,
                                                                      p.waited_from)
        return marks

    def _discard(self, step: _Step, reason: str) -> None:
        self.health.drop(reason)
        for mark in self._marks(step):
            self.clock.release(mark)

    def poll(self, block: bool = False) -> int:
        """Resolve closed steps whose marks have completed; returns how many were emitted.

        With ``block`` (shutdown only) it waits for the device instead of skipping.
        """
        with self._poll_lock:  # one resolver at a time keeps records in step order
            return self._poll(block)

    def _poll(self, block: bool) -> int:
        done = 0
        while True:
            with self._lock:
                if not self._pending:
                    return done
                step = self._pending[0]
                marks = self._marks(step)
                if block:
                    for mark in marks:
                        self.clock.wait(mark)
                elif self.clock.device and not all(self.clock.ready(m) for m in marks):
                    return done
                self._pending.popleft()
            self._resolve(step)
            done += 1

    def _resolve(self, step: _Step) -> None:
        phases, offsets = self._phase_times(step)
        seconds = self.clock.seconds
        gpu_s = max(seconds(step.first_mark, step.end_mark), 0.0)
        if self.settings.phases:
            self.emit(step_record(self.identity, step.index, step.t_ns, step.wall_s, gpu_s,
                                  phases, self.clock.epoch_ns(step.first_mark)))
        self.metrics.observe(step.wall_s, gpu_s, phases)
        if self.spans is not None and self.spans.active():
            self.spans.emit(step.index, step.t_ns, step.wall_s, step.first_epoch_ns, offsets)
        for mark in self._marks(step):
            self.clock.release(mark)

    def _phase_times(self, step: _Step) -> tuple[dict[str, float], list[tuple[str, float,
                                                                              float]]]:
        """Seconds per phase name, in the order the phases started, and each interval's
        (name, start offset, duration) for spans.

        Intervals of one name add up, except span phases (a DDP step's buckets), which last
        from their first start to their last end (each bucket's interval includes its queue
        behind the earlier ones: summing them could exceed the step itself), and collectives,
        which last the union of their intervals. The time a rank waited for a collective is
        taken out of the phases (``forward``, not ``{axis}-{op}`` ones) it fell inside on the
        same stream: they count their own work only.
        """
        seconds = self.clock.seconds
        first: dict[str, float] = {}
        total: dict[str, float] = {}
        span_end: dict[str, float] = {}
        united: dict[str, list[tuple[float, float]]] = {}
        waits: dict[int, list[tuple[float, float]]] = {}
        plain: list[tuple[str, float, float, int]] = []
        offsets = []
        for p in step.phases:
            start = seconds(step.first_mark, p.start)
            duration = max(seconds(p.start, p.end), 0.0)
            end = start + duration
            offsets.append((p.name, start, duration))
            if p.collective:
                united.setdefault(p.name, []).append((start, end))
                waited = start if p.waited_from is None else seconds(step.first_mark,
                                                                     p.waited_from)
                waits.setdefault(p.stream, []).append((min(max(waited, start), end), end))
            elif p.span:
                span_end[p.name] = max(span_end.get(p.name, start), end)
            else:
                plain.append((p.name, start, end, p.stream))
            first[p.name] = min(first.get(p.name, start), start)
        for name, end in span_end.items():
            total[name] = total.get(name, 0.0) + max(end - first[name], 0.0)
        for name, intervals in united.items():
            total[name] = total.get(name, 0.0) + sum(e - s for s, e in _union(intervals))
        blocked = {stream: _union(intervals) for stream, intervals in waits.items()}
        for name, start, end, stream in plain:
            own = end - start
            if stream in blocked and "-" not in name:
                own -= sum(max(min(end, e) - max(start, s), 0.0) for s, e in blocked[stream])
            total[name] = total.get(name, 0.0) + max(own, 0.0)
        ordered = sorted(first, key=first.__getitem__)
        return {name: total[name] for name in ordered}, offsets

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
        self._wake.set()
        self._resolver.join(timeout)
        self.poll(block=True)
        self.shipper.shutdown(timeout)
