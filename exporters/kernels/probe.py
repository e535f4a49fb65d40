"""The kernel probe: CUPTI kernel executions as columnar ``kernels`` records.

Threads and who touches CUPTI (no Python code ever runs inside a CUPTI callback):

- **CUPTI's threads** call the native buffer callbacks (``plumbing``): C code moving pointers
  between a buffer pool and a completed queue, never the GIL.
- **The training thread** enables/disables CONCURRENT_KERNEL at step edges (one traced step in
  ``kernel_duty``). ctypes releases the GIL for every CUPTI call.
- **argus-kernels** (decode) waits on the completed queue with the GIL released, decodes each
  buffer in bulk with numpy, reads CUPTI's dropped-record count for the buffer's queue, gives
  the buffer back and emits one ``kernels`` record.
- **argus-kernels-flush** (control) calls ``cuptiActivityFlushAll(0)`` every
  ``kernel_flush_s`` while tracing (and a few times after), which hands back only buffers whose
  records are all complete: kernels still running stay in CUPTI until they finish. A forced
  flush happens only at shutdown (and when handing CUPTI over to torch.profiler). The same
  thread reads CUPTI's global dropped count and checks the time base
  (``time.time_ns() - cuptiGetTimestamp()``, a gauge; the probe is ``degraded`` past 1 ms).

A Python lock serialises the probe's own CUPTI control calls; no callback path needs it. Drops
are counted, never waited for (``argus_exporter_dropped_records_total{reason}``):
``kernel_cupti_dropped`` (CUPTI's own count: no buffer space), ``kernel_incomplete_record``,
``kernel_record_layout_unknown``, ``kernel_decode_error``, ``kernel_emit_error``.

Another CUPTI client (nsys/ncu, torch.profiler, torch's CUPTI monitor) makes the probe ``busy``
for the rest of the process; torch.profiler is caught when it *prepares*, before its warm-up
(``profilers.watch_profiler_prepare``). A forked child never touches CUPTI.

One module past 500 lines on purpose: CUPTI's enable, buffer callbacks, flush and teardown
are one state machine whose order matters; the buffer decode and the duty schedule live in
their own modules.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from argus_exporters._native.build import ShimUnavailableError
from argus_exporters.config import Settings
from argus_exporters.health import Health
from argus_exporters.identity import RankIdentity
from argus_exporters.kernels.cupti import (
    CuptiCallError,
    CuptiLibrary,
    ProbeUnavailableError,
    state_for_status,
)
from argus_exporters.kernels.decode import (
    CONCURRENT_KERNEL,
    RecordIndex,
    UnknownRecordLayoutError,
    decode_kernel_buffer,
    read_c_string,
)
from argus_exporters.kernels.duty import DutyCycle
from argus_exporters.kernels.plumbing import (
    STOPPED,
    CallbackPlumbing,
    Completed,
    ShimLibrary,
    select_plumbing,
)
from argus_exporters.kernels.process import this_process
from argus_exporters.kernels.profilers import (
    foreign_profiler,
    profiler_enabled_check,
    watch_profiler_prepare,
)
from argus_exporters.records import kernels_record

logger = logging.getLogger("argus_exporters")

PROBE = "kernels"
CLOCK_OFFSET_LIMIT_NS = 1_000_000  # CUPTI vs host clock beyond this: degraded
CLOCK_GAUGE = "argus_exporter_cupti_clock_offset_seconds"
CLOCK_GAUGE_HELP = "time.time_ns() - cuptiGetTimestamp() at the last check (kernel time base)."
DECODE_WAIT_S = 0.5
TRAILING_FLUSHES = 3  # flushes after tracing stops, for kernels still running then


@dataclass
class KernelProbeStats:
    """Counters of the probe's own work (read by benchmarks and the GPU check)."""

    buffers: int = 0
    records: int = 0
    decode_s: float = 0.0  # wall time decoding
    walked_buffers: int = 0  # buffers that held other record kinds (walked record by record)
    other_records: int = 0  # records of other activity kinds in our buffers (not kernels)
    toggles: int = 0  # activity enable/disable calls
    toggle_s_max: float = 0.0
    flushes: int = 0
    cupti_dropped: int = 0
    backlog_pauses: int = 0
    clock_offset_ns: int | None = None


class KernelProbe:
    """GPU kernel executions from CUPTI, one traced step in ``settings.kernel_duty`` (or as
    many as ``settings.kernel_budget`` allows, when the duty is auto: ``kernels/duty.py``).

    ``start()`` never raises; every other method is a no-op unless ``start()`` returned True.
    ``backend`` (libcupti), ``plumbing`` (callbacks) and ``env`` are for tests and GPU checks.
    """

    def __init__(self, settings: Settings, identity: RankIdentity,
                 emit: Callable[[dict], None], health: Health, *,
                 backend: CuptiLibrary | None = None, plumbing: CallbackPlumbing | None = None,
                 env: Mapping[str, str] | None = None):
        self._settings = settings
        self._identity = identity
        self._emit = emit
        self._health = health
        self._backend = backend
        self._plumbing = plumbing
        self._env = os.environ if env is None else env
        self._cycle = DutyCycle(int(settings.kernel_duty), float(settings.kernel_budget))
        self._reason_parts = ("", "")
        self._dtype: np.dtype | None = None
        self._candidates: list[np.dtype] = []
        self._control = threading.Lock()  # the probe's CUPTI control calls; no callback needs it
        self._control_stop = threading.Event()
        self._decode_thread: threading.Thread | None = None
        self._control_thread: threading.Thread | None = None
        self._started: bool | None = None
        self._active = False  # callbacks registered, hooks may touch CUPTI
        self._tracing = False  # CONCURRENT_KERNEL enabled now
        self._trailing = 0  # flushes still due after tracing stopped
        self._backlog = False  # tracing paused: too many buffers wait for decoding
        self._closed = False
        self._decoding = False
        self._profiler_enabled: Callable[[], bool] | None = None
        self._walker: ShimLibrary | bool | None = None  # False: the shim cannot be loaded
        self._base_reason = ""
        self._degraded: dict[str, str] = {}
        self._other_kinds_logged = False
        self.state: tuple[str, str] | None = None
        self.stats = KernelProbeStats()

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> bool:
        """Arm the probe in a training rank; False (state reported once) when it cannot run."""
        if self._started is not None:
            return self._started
        self._started = False
        try:
            self._started = self._start()
        except ProbeUnavailableError as exc:
            self._report(exc.state, exc.reason)
        except Exception as exc:  # never into training
            self._report("unavailable", f"start failed: {exc!r}")
        return self._started

    def _start(self) -> bool:
        settings = self._settings
        if not settings.kernels:
            self._report("off", "ARGUS_KERNELS is not set")
            return False
        forced = settings.extra.get("training_rank")
        ok, why = this_process(self._env, None if forced is None else bool(forced))
        if not ok:
            self._report("skipped", why)
            return False
        busy = foreign_profiler(self._env)
        if busy:
            self._report("busy", busy)
            return False
        backend = self._backend = self._backend or CuptiLibrary.load()
        self._candidates = backend.record_dtypes()
        if not self._candidates:
            self._report("unavailable", "cupti-python ships no activity_kernel*_dtype")
            return False
        plumbing = self._plumbing = self._plumbing or select_plumbing(
            settings.kernel_callbacks, self._env)
        plumbing.configure(int(settings.kernel_buffers), int(settings.kernel_buffer_bytes))
        try:
            backend.register(*plumbing.callback_addresses())
        except CuptiCallError as exc:
            plumbing.release()
            self._report(state_for_status(exc.status), str(exc))
            return False
        self._profiler_enabled = profiler_enabled_check()
        watch_profiler_prepare(self)
        weak = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: (probe := weak()) and probe._forked())
        self._decode_thread = threading.Thread(target=self._decode_loop, name="argus-kernels",
                                               daemon=True)
        self._control_thread = threading.Thread(target=self._control_loop,
                                                name="argus-kernels-flush", daemon=True)
        self._active = True
        self._decode_thread.start()
        self._control_thread.start()
        atexit.register(self._atexit)
        self._reason_parts = (f"{backend.describe()}; {plumbing.name}",
                              f"{settings.kernel_buffers} x {settings.kernel_buffer_bytes} B "
                              "buffers")
        self._base_reason = self._reason()
        self._check_clock()
        self._refresh_state()
        return True

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop tracing, force-flush CUPTI, decode what is left, stop the threads."""
        if self._closed:
            return
        self._closed = True
        self._control_stop.set()
        self._join(self._control_thread, timeout)
        with self._control:
            was_active, self._active = self._active, False
            if was_active:
                with contextlib.suppress(Exception):
                    if self._tracing:
                        self._backend.disable(CONCURRENT_KERNEL)
                with contextlib.suppress(Exception):
                    self._backend.flush(True)  # every buffer comes home, complete or not
            self._tracing = False
        with contextlib.suppress(Exception):
            atexit.unregister(self._atexit)
        if self._decode_thread is not None:
            self._plumbing.stop()  # the decode thread drains the queue, then ends
            self._join(self._decode_thread, timeout)
        if was_active:
            self._count_cupti_drops(0, 0)
        if self._plumbing is not None and self._started and not self._plumbing.release():
            logger.debug("argus: CUPTI still holds kernel buffers; the pool is kept")

    @staticmethod
    def _join(thread: threading.Thread | None, timeout: float) -> None:
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _atexit(self) -> None:
        with contextlib.suppress(Exception):
            self.shutdown(timeout=2.0)

    def _forked(self) -> None:
        """In a forked child: never touch CUPTI or the parent's threads (they are gone)."""
        self._active = self._tracing = False
        self._closed = True
        self._control = threading.Lock()
        with contextlib.suppress(Exception):
            atexit.unregister(self._atexit)

    # -- training-thread hooks -----------------------------------------------------------------

    def step_begin(self, step: int) -> None:
        """Enable CONCURRENT_KERNEL if ``step`` is a traced one (1 in ``kernel_duty``)."""
        if not self._active:
            return
        check = self._profiler_enabled
        if check is not None and check():
            self.yield_to_profiler("torch.profiler started recording: it owns CUPTI now")
            return
        if not self._tracing and not self._backlog and self._cycle.traces(step):
            self._set_tracing(True)

    def on_step(self, step: int, wall_s: float) -> None:
        """The tracer's per-step call (:class:`argus_exporters.probes.Probe`): the step that
        completed ends, the next one begins."""
        self.step_end(step, wall_s)
        self.step_begin(step + 1)

    def step_end(self, step: int, wall_s: float | None = None) -> None:
        """Disable CONCURRENT_KERNEL after a traced step (kept on when every step is traced).

        With the step's wall time, an auto duty re-estimates what tracing costs (every 32
        steps) and may trace fewer or more steps from the next one on.
        """
        if not self._active:
            return
        launches = self.stats.records + self.stats.cupti_dropped  # dropped ones cost too
        if wall_s is not None and self._cycle.observe(self._tracing, wall_s, launches):
            self._base_reason = self._reason()
            self._refresh_state()
        if self._tracing and self._cycle.duty > 1:
            self._set_tracing(False)

    @property
    def duty(self) -> int:
        """Trace one step in this many (now)."""
        return self._cycle.duty

    def _reason(self) -> str:
        backend, buffers = self._reason_parts
        return f"{backend}; {self._cycle.describe()}; {buffers}"

    def pause(self) -> None:
        """Stop collecting until the next traced ``step_begin`` (e.g. around an eval loop)."""
        if self._active and self._tracing:
            self._set_tracing(False)

    def drain(self, timeout: float = 5.0) -> bool:
        """Flush completed buffers now and wait until they are decoded; no trailing flushes.

        For benchmarks and tests (an "off" segment with nothing of the probe running).
        """
        with self._control:
            if self._active:
                with contextlib.suppress(CuptiCallError):
                    self._backend.flush(False)
                if not self._tracing:
                    self._trailing = 0
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._plumbing is None or (self._plumbing.pending() == 0 and not self._decoding):
                return True
            time.sleep(0.001)
        return False

    def _set_tracing(self, on: bool) -> None:
        cpu0, wall0 = time.thread_time(), time.perf_counter()
        failure: CuptiCallError | None = None
        with self._control:
            if not self._active or self._tracing == on:
                return
            try:
                if on:
                    self._backend.enable(CONCURRENT_KERNEL)
                else:
                    self._backend.disable(CONCURRENT_KERNEL)
            except CuptiCallError as exc:
                failure = exc
            else:
                self._tracing = on
                self._trailing = TRAILING_FLUSHES
        if failure is not None:
            self._go_inert(state_for_status(failure.status), str(failure))
        wall = time.perf_counter() - wall0
        self.stats.toggles += 1
        self.stats.toggle_s_max = max(self.stats.toggle_s_max, wall)
        self._health.add_cpu(time.thread_time() - cpu0)

    def yield_to_profiler(self, reason: str) -> None:
        """Hand CUPTI over to torch.profiler: stop tracing, take our buffers home, go quiet."""
        with self._control:
            if not self._active:
                return
            self._active = False
            with contextlib.suppress(Exception):
                if self._tracing:
                    self._backend.disable(CONCURRENT_KERNEL)
            with contextlib.suppress(Exception):
                self._backend.flush(True)  # before kineto's callbacks replace ours
            self._tracing = False
        self._control_stop.set()
        self._report("busy", reason)

    def _go_inert(self, state: str, reason: str) -> None:
        """Stop touching CUPTI for the rest of the process (another client took it over)."""
        with self._control:
            self._active = False
            self._tracing = False
        self._control_stop.set()
        self._report(state, reason)

    # -- control thread ------------------------------------------------------------------------

    def _control_loop(self) -> None:
        period = float(self._settings.kernel_flush_s)
        while not self._control_stop.wait(period):
            cpu0 = time.thread_time()
            try:
                self._control_tick()
            except Exception:  # a bug here must not end the thread silently
                logger.debug("argus: kernel probe control tick failed", exc_info=True)
            self._health.add_cpu(time.thread_time() - cpu0)

    def _control_tick(self) -> None:
        failure: CuptiCallError | None = None
        with self._control:
            if not self._active:
                return
            if self._tracing or self._trailing > 0:
                if not self._tracing:
                    self._trailing -= 1
                try:
                    self._backend.flush(False)  # complete buffers only: no kernel is cut off
                    self.stats.flushes += 1
                except CuptiCallError as exc:
                    failure = exc
        if failure is not None:
            self._go_inert(state_for_status(failure.status), str(failure))
            return
        self._count_cupti_drops(0, 0)
        self._check_clock()
        self._check_backlog()

    def _count_cupti_drops(self, context: int, stream_id: int) -> None:
        with contextlib.suppress(Exception):
            dropped = self._backend.dropped_records(context, stream_id)
            if dropped:
                self.stats.cupti_dropped += dropped
                self._health.drop("kernel_cupti_dropped", dropped)

    def _check_clock(self) -> None:
        try:
            offset = self._backend.clock_offset_ns()
        except CuptiCallError:
            return
        self.stats.clock_offset_ns = offset
        self._health.set_gauge(CLOCK_GAUGE, CLOCK_GAUGE_HELP, offset * 1e-9)
        if abs(offset) > CLOCK_OFFSET_LIMIT_NS:
            self._degrade("clock", f"CUPTI timestamps are {offset / 1e6:+.3f} ms off the host "
                                   "clock (time.time_ns() - cuptiGetTimestamp()): a timestamp "
                                   "callback (kineto's?) replaced CLOCK_REALTIME; kernels "
                                   "cannot be placed into steps")
        else:
            self._recover("clock")

    def _check_backlog(self) -> None:
        """Pause tracing while more buffers wait than the pool size (torch's pool grows)."""
        waiting = self._plumbing.pending()
        if not self._backlog and waiting > int(self._settings.kernel_buffers):
            self._backlog = True
            self.stats.backlog_pauses += 1
            self._degrade("backlog", f"{waiting} CUPTI buffers wait for decoding; tracing "
                                     "paused until they are decoded")
            self._set_tracing(False)

    # -- decode thread -------------------------------------------------------------------------

    def _decode_loop(self) -> None:
        plumbing = self._plumbing
        while True:
            item = plumbing.get_completed(DECODE_WAIT_S)
            if item is STOPPED:
                if self._backlog:
                    self._backlog = False
                    self._recover("backlog")
                return
            if item is None:
                continue
            cpu0 = time.thread_time()
            self._decoding = True
            try:
                self._decode(item)
            except Exception:  # never let the thread die
                logger.debug("argus: kernel buffer handling failed", exc_info=True)
            finally:
                plumbing.return_buffer(item.address)
                self._decoding = False
            if self._active:
                self._count_cupti_drops(item.context, item.stream_id)
            if self._backlog and plumbing.pending() == 0:
                self._backlog = False
                self._recover("backlog")
            self._health.add_cpu(time.thread_time() - cpu0)

    def _decode(self, item: Completed) -> None:
        """Decode one completed buffer and emit one ``kernels`` record."""
        if item.valid_size <= 0 or not item.address:
            return
        wall0 = time.perf_counter()
        view = (ctypes.c_char * item.valid_size).from_address(item.address)
        columns = None
        try:
            columns = decode_kernel_buffer(
                view, item.valid_size, read_c_string, dtype=self._dtype,
                candidates=self._candidates,
                index_records=lambda: self._index(item.address, item.valid_size))
        except UnknownRecordLayoutError as exc:
            self._health.drop("kernel_record_layout_unknown", self._estimate(item.valid_size,
                                                                              exc.record_size))
            self._degrade("layout", f"{exc}; {self._backend.describe()}: install the "
                                    "cupti-python matching this CUPTI (the [cupti] extra pins "
                                    "a matching pair)")
        except Exception:
            self._health.drop("kernel_decode_error", self._estimate(item.valid_size))
            logger.debug("argus: kernel buffer decode failed", exc_info=True)
        self.stats.decode_s += time.perf_counter() - wall0
        self.stats.buffers += 1
        if columns is None:
            return
        if columns.record_dtype is not None:
            self._dtype = columns.record_dtype
        if columns.other_kinds:
            self._note_other_kinds(columns.other_kinds)
        if columns.incomplete:
            self._health.drop("kernel_incomplete_record", columns.incomplete)
        if columns.count:
            self.stats.records += columns.count
            record = kernels_record(self._identity, columns.names, columns.name,
                                    columns.stream, columns.start_ns, columns.dur_ns)
            try:
                self._emit(record)
            except Exception:
                self._health.drop("kernel_emit_error", columns.count)

    def _index(self, address: int, valid_size: int) -> RecordIndex:
        """Walk a mixed buffer: in C (the plumbing's, else the shim's), else from Python."""
        self.stats.walked_buffers += 1
        next_record = self._backend.next_record_address()
        index = self._plumbing.index_records(next_record, address, valid_size, CONCURRENT_KERNEL)
        if index is not None:
            return index
        if self._walker is None:
            try:
                self._walker = ShimLibrary.load(self._env)
            except ShimUnavailableError:
                self._walker = False
        if self._walker:
            return self._walker.index_records(next_record, address, valid_size,
                                              CONCURRENT_KERNEL)
        return self._backend.index_records(address, valid_size, CONCURRENT_KERNEL)

    def _note_other_kinds(self, kinds: dict[int, int]) -> None:
        self.stats.other_records += sum(kinds.values())
        if not self._other_kinds_logged:
            self._other_kinds_logged = True
            logger.info("argus: CUPTI buffers also hold records of activity kinds %s (another "
                        "CUPTI user in this process); kernels are kept, the others skipped",
                        sorted(kinds))

    def _estimate(self, valid_size: int, record_size: int | None = None) -> int:
        size = record_size or (self._dtype or self._candidates[0]).itemsize
        return max(1, valid_size // size)

    # -- health ----------------------------------------------------------------------------

    def _degrade(self, cause: str, reason: str) -> None:
        if self._degraded.get(cause) != reason:
            self._degraded[cause] = reason
            self._refresh_state()

    def _recover(self, cause: str) -> None:
        if self._degraded.pop(cause, None) is not None:
            self._refresh_state()

    def _refresh_state(self) -> None:
        if self.state is not None and self.state[0] in ("busy", "unavailable", "off"):
            return
        if self._degraded:
            self._report("degraded", "; ".join(self._degraded.values()))
        else:
            self._report("on", self._base_reason)

    def _report(self, state: str, reason: str) -> None:
        self.state = (state, reason)
        self._health.probe_state(PROBE, state, reason)
