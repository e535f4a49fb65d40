"""Stack probe: py-spy samples of the training process as schema-v1 ``stack`` records.

py-spy runs as a separate, short-lived process (``py-spy dump --pid PID --json --nonblocking``)
launched from a daemon thread: once every ``settings.stack_period_s`` seconds, plus a burst of
a few dumps in quick succession when the local step time spikes (``on_step``). Every Python
thread in a dump becomes one ``stack`` record, frames outermost first, as
``"file.py:function:line"``.

Nothing here blocks or crashes training (DESIGN.md, "Conventions"): ``on_step`` only touches a
small window and an event; every py-spy run has a timeout and is killed with its whole process
group when it overstays; shutdown kills a running dump instead of waiting for it. If py-spy is
missing or may not attach (ptrace), the probe says so once through ``Health.probe_state`` and
stays off. The CPU that py-spy and the probe thread spend is measured (``os.wait4`` rusage of
each py-spy child plus the thread's own CPU clock) and added to ``Health.add_cpu``. Running and
parsing py-spy is ``argus_exporters.pyspy``.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable

from argus_exporters.config import Settings
from argus_exporters.health import Health
from argus_exporters.identity import RankIdentity
from argus_exporters.pyspy import (
    PERMISSION_MARKERS,
    PySpyRunner,
    find_py_spy,
    parse_json_dump,
    parse_text_dump,
    ptrace_hint,
)
from argus_exporters.records import stack_record

PROBE = "stacks"
THREAD_NAME = "argus-stacks"

class StackProbe:
    """py-spy stack samples of one process, periodic plus bursts on step-time spikes.

    Thread-safety: ``on_step`` is meant for the training thread and only records a number and
    maybe sets an event; all py-spy work happens on the daemon thread ``argus-stacks``.
    Tunables below are class attributes so that a caller (or a test) may adjust them per
    instance before ``start``.
    """

    dump_timeout_s = 10.0  # one py-spy run; killed (whole process group) beyond this
    start_wait_s = 2.0  # how long start() waits for the first dump to learn if py-spy may attach
    startup_attempts = 3  # non-permission failures of the first dumps before giving up
    max_consecutive_failures = 5  # later failures in a row before the probe stays off
    burst_samples = 4  # dumps per burst
    burst_gap_s = 0.25  # between the dumps of a burst
    burst_cooldown_s = 60.0  # at most one burst per this many seconds
    median_steps = 32  # rolling window of step times for the spike median
    min_steps = 5  # steps seen before spikes are judged
    max_frames = 256  # deeper stacks keep their innermost frames
    max_output_bytes = 32 << 20  # py-spy output beyond this is cut off (killed)

    def __init__(self, settings: Settings, identity: RankIdentity, emit: Callable[[dict], None],
                 health: Health, pid: int | None = None, py_spy: str | None = None,
                 *, dump_timeout_s: float | None = None) -> None:
        """Prepare the probe for ``pid`` (default: this process); nothing runs before start.

        ``py_spy`` is the executable (default: ``find_py_spy()``); ``dump_timeout_s`` overrides
        the per-dump timeout.
        """
        self._settings = settings
        self._identity = identity
        self._emit = emit
        self._health = health
        self._pid = os.getpid() if pid is None else int(pid)
        self._py_spy_arg = py_spy
        if dump_timeout_s is not None:
            self.dump_timeout_s = float(dump_timeout_s)
        self._own_process = self._pid == os.getpid()
        self._state_lock = threading.Lock()  # orders "on" and "unavailable" reports
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._first = threading.Event()  # first dump outcome known
        self._first_fatal = False
        self._started = False
        self._thread: threading.Thread | None = None
        self._runner = PySpyRunner(self._stop)
        self._running = False  # start() succeeded and the probe has not stopped
        self._step_times: deque[float] = deque(maxlen=self.median_steps)
        self._last_burst = -math.inf
        self._burst_requested = False
        self._flags: list[str] = []
        self._json = True
        self.dumps = 0  # successful py-spy dumps
        self.bursts = 0  # bursts requested by on_step
        self.records = 0  # stack records emitted

    # ---------------------------------------------------------------- public, training thread

    def start(self) -> bool:
        """Start sampling; False (reported once as ``unavailable``) if py-spy is unusable.

        Returns once the first dump has answered whether py-spy may attach (typically tens of
        ms), at most ``start_wait_s`` plus a few ms; a slower first dump leaves the answer to
        the background thread, which reports through Health. Never raises.
        """
        try:
            return self._start()
        except Exception as exc:  # never into training
            self._unavailable(f"stack probe failed to start: {exc!r}")
            return False

    def on_step(self, step: int, wall_s: float) -> None:
        """Note one step's host time; a step ``stack_spike_ratio`` x the median asks for a burst.

        Cheap (a sort of at most ``median_steps`` floats) and never raises; does nothing
        unless the probe is running. Bursts are rate-limited to one per ``burst_cooldown_s``.
        The burst samples the steps right after the spike: fail-slow causes persist, and the
        spiking step's stack is gone by the time it is measured.
        """
        try:
            if not self._running or not wall_s > 0 or not math.isfinite(wall_s):
                return
            window = self._step_times
            spike = False
            if len(window) >= self.min_steps:
                ordered = sorted(window)
                mid = len(ordered) // 2
                median = (ordered[mid] if len(ordered) % 2
                          else 0.5 * (ordered[mid - 1] + ordered[mid]))
                spike = median > 0 and wall_s >= self._settings.stack_spike_ratio * median
            window.append(float(wall_s))
            if spike:
                now = time.monotonic()
                if now - self._last_burst >= self.burst_cooldown_s:
                    self._last_burst = now
                    self.bursts += 1
                    self._burst_requested = True
                    self._wake.set()
        except Exception:  # the training thread must never see probe errors
            pass

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop sampling: kill a running py-spy, join the thread for at most ``timeout`` s.

        Idempotent and never raises; a probe that never started or is unavailable does nothing.
        """
        try:
            was_running = self._running
            self._running = False
            self._stop.set()
            self._wake.set()
            self._runner.kill_current()
            thread = self._thread
            if thread is not None and thread is not threading.current_thread():
                thread.join(max(0.0, timeout))
            if was_running and self._health.probes.get(PROBE, ("",))[0] == "on":
                self._health.probe_state(PROBE, "off", "shut down")
        except Exception:  # shutdown must not raise into training teardown
            pass

    # ---------------------------------------------------------------- start-up

    def _start(self) -> bool:
        if self._started:  # start() is answered once
            return self._running
        self._started = True
        if not self._settings.stacks:
            self._health.probe_state(PROBE, "off", "ARGUS_STACKS is off")
            return False
        path = self._py_spy_arg or find_py_spy()
        if not path:
            return self._unavailable("py-spy not found (pip install py-spy)")
        if not os.path.isfile(path):
            return self._unavailable(f"py-spy not found at {path}")
        if not os.access(path, os.X_OK):
            return self._unavailable(f"py-spy at {path} is not executable")
        self._py_spy = path
        self._running = True
        self._thread = threading.Thread(target=self._main, name=THREAD_NAME, daemon=True)
        self._thread.start()
        self._first.wait(self.start_wait_s)
        with self._state_lock:
            if self._first_fatal or not self._running:
                self._running = False
                return False
            self._health.probe_state(PROBE, "on", f"py-spy every "
                                     f"{self._settings.stack_period_s:g}s on pid {self._pid}")
        return True

    def _unavailable(self, reason: str) -> bool:
        """Report once that the probe cannot work, and stop it."""
        with self._state_lock:
            self._running = False
            self._stop.set()
            self._health.probe_state(PROBE, "unavailable", reason)
        return False

    # ---------------------------------------------------------------- background thread

    def _main(self) -> None:
        try:
            self._loop()
        except Exception as exc:  # a bug here must not take anything else down
            self._first_fatal = not self._first.is_set()
            self._unavailable(f"stack probe thread failed: {exc!r}")
        finally:
            self._first.set()

    def _loop(self) -> None:
        self._detect_flags()
        if self._stop.is_set():
            return
        if not self._startup():
            return
        failures = 0
        next_due = time.monotonic() + self._settings.stack_period_s
        burst_left = 0
        while not self._stop.is_set():
            if self._burst_requested and burst_left == 0:
                self._burst_requested = False
                burst_left = self.burst_samples
            now = time.monotonic()
            if burst_left or now >= next_due:
                if burst_left:
                    burst_left -= 1
                else:
                    next_due = now + self._settings.stack_period_s
                outcome, reason = self._sample()
                if outcome == "fatal":
                    self._unavailable(reason)
                    return
                failures = 0 if outcome == "ok" else failures + 1
                if failures >= self.max_consecutive_failures:
                    self._unavailable(f"py-spy failed {failures} times in a row: {reason}")
                    return
            wait = self.burst_gap_s if burst_left else max(0.0, next_due - time.monotonic())
            self._wake.wait(wait)
            self._wake.clear()

    def _startup(self) -> bool:
        """First dumps: learn whether py-spy may attach at all, before start() returns."""
        reason = ""
        for _ in range(max(1, self.startup_attempts)):
            if self._stop.is_set():
                return False
            outcome, reason = self._sample()
            if outcome == "fatal":
                break
            if outcome == "stopped":
                return False
            if outcome in ("ok", "timeout"):  # a slow dump says nothing about permission
                self._first.set()
                return True
            self._stop.wait(0.05)
        else:
            reason = f"py-spy cannot sample pid {self._pid}: {reason}"
        self._first_fatal = True
        self._unavailable(reason)
        self._first.set()
        return False

    def _detect_flags(self) -> None:
        """Ask ``py-spy dump --help`` once which of ``--json``/``--nonblocking`` it has."""
        run = self._runner.run([self._py_spy, "dump", "--help"], min(self.dump_timeout_s, 5.0),
                               self.max_output_bytes)
        self._health.add_cpu(run.cpu_s)
        text = (run.out + run.err).decode("utf-8", "replace")
        if run.rc == 0 and "--pid" in text:
            self._json = "--json" in text
            nonblocking = "--nonblocking" in text
        else:  # unknown build (or a broken one: the dump itself will tell)
            self._json, nonblocking = True, True
        # --nonblocking: py-spy reads the target's memory without pausing it (no ptrace stop of
        # every thread), so a dump costs training nothing but py-spy's own CPU. The price is a
        # rare torn stack (the target keeps running while py-spy walks it) or a failed dump,
        # which we count and skip. Blocking mode would stop all threads of the training
        # process for the whole dump (ms to tens of ms with many threads), on every rank.
        self._flags = (["--json"] if self._json else []) + (
            ["--nonblocking"] if nonblocking else [])

    def _sample(self) -> tuple[str, str]:
        """One dump -> records. Outcome: ok, timeout, error (transient) or fatal (+ reason)."""
        cpu0 = time.thread_time()
        t_ns = time.time_ns()
        run = self._runner.run([self._py_spy, "dump", "--pid", str(self._pid), *self._flags],
                               self.dump_timeout_s, self.max_output_bytes)
        try:
            if run.launch_error:
                return "fatal", run.launch_error
            if self._stop.is_set() and run.rc != 0:
                return "stopped", "shut down"
            if run.timed_out:
                self._health.drop("stack_timeout")
                return "timeout", f"py-spy dump timed out after {self.dump_timeout_s:g}s"
            if run.rc != 0:
                message = run.message()
                if any(m in message.lower() for m in PERMISSION_MARKERS) or any(
                        m in run.err.decode("utf-8", "replace").lower()
                        for m in PERMISSION_MARKERS):
                    return "fatal", (f"py-spy not permitted to attach to pid {self._pid}: "
                                     f"{message} ({ptrace_hint()})")
                self._health.drop("stack_error")
                return "error", message
            try:
                threads = (parse_json_dump(run.out, self.max_frames) if self._json
                           else parse_text_dump(run.out.decode("utf-8", "replace"),
                                                self.max_frames))
            except ValueError:
                threads = parse_text_dump(run.out.decode("utf-8", "replace"), self.max_frames)
                if not threads:
                    self._health.drop("stack_error")
                    return "error", "py-spy output could not be parsed"
            self.dumps += 1
            self._publish(t_ns, threads)
            return "ok", ""
        finally:
            self._health.add_cpu(run.cpu_s + max(0.0, time.thread_time() - cpu0))

    def _publish(self, t_ns: int, threads: list[tuple[str, list[str]]]) -> None:
        for name, frames in threads:
            if self._own_process and name == THREAD_NAME:
                continue  # this probe's own thread, waiting on py-spy
            try:
                self._emit(stack_record(self._identity, t_ns, name, frames))
                self.records += 1
            except Exception:
                self._health.drop("stack_emit_error")
