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
each py-spy child plus the thread's own CPU clock) and added to ``Health.add_cpu``.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import orjson

from argus_exporters.config import Settings
from argus_exporters.health import Health
from argus_exporters.identity import RankIdentity
from argus_exporters.records import stack_record

PROBE = "stacks"
THREAD_NAME = "argus-stacks"

# py-spy prints these when the kernel refuses the attach (ptrace/process_vm_readv): its own
# "Permission Denied: Try running again with elevated permissions ...", the raw OS errors
# EPERM/EACCES from remoteprocess, and "requires root" on macOS.
_PERMISSION_MARKERS = (
    "permission denied", "operation not permitted", "elevated permissions", "requires root",
    "os error 1)", "os error 13)", "ptrace_scope", "eperm", "eacces",
)

_THREAD_RE = re.compile(r'^Thread\s+(?P<id>\S+)(?:\s+\((?P<status>[^)]*)\))?'
                        r'(?::\s*"(?P<name>.*)")?\s*$')
_FRAME_RE = re.compile(r"^\s+(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)\s*$")


def format_frame(filename: str | None, function: str | None, line: int | None) -> str:
    """One frame as ``"file.py:function:line"``, the path cut to its last 3 components."""
    parts = [p for p in (filename or "?").replace("\\", "/").split("/") if p]
    short = "/".join(parts[-3:]) or "?"
    return f"{short}:{function or '?'}:{int(line) if line else 0}"


def parse_json_dump(data: bytes | str, max_frames: int = 256) -> list[tuple[str, list[str]]]:
    """Threads of a ``py-spy dump --json`` output: ``[(thread name, frames outermost first)]``.

    py-spy lists frames innermost first; they are reversed here. Threads without Python frames
    are left out; a stack deeper than ``max_frames`` keeps its innermost frames. Raises
    ValueError when the output is not py-spy's JSON.
    """
    doc = orjson.loads(data)
    if isinstance(doc, dict):
        doc = [doc]
    if not isinstance(doc, list):
        raise ValueError("py-spy --json output is not a list of threads")
    threads = []
    for thread in doc:
        if not isinstance(thread, dict):
            continue
        raw = [f for f in thread.get("frames") or () if isinstance(f, dict)]
        if not raw:
            continue
        frames = [format_frame(f.get("short_filename") or f.get("filename"), f.get("name"),
                               f.get("line")) for f in reversed(raw)]
        name = thread.get("thread_name") or (
            f"thread-{thread.get('os_thread_id') or thread.get('thread_id') or '?'}")
        threads.append((str(name), frames[-max_frames:]))
    return threads


def parse_text_dump(text: str, max_frames: int = 256) -> list[tuple[str, list[str]]]:
    """Threads of py-spy's human-readable ``dump`` output (for a py-spy without ``--json``).

    Understands ``Thread 123 (active+gil): "MainThread"`` headers followed by indented
    ``function (file.py:42)`` frames (innermost first, reversed here); other lines (process
    banner, locals) are skipped. Same result shape as ``parse_json_dump``.
    """
    threads: list[tuple[str, list[str]]] = []
    name: str | None = None
    frames: list[str] = []

    def close() -> None:
        if name is not None and frames:
            threads.append((name, list(reversed(frames))[-max_frames:]))

    for line in text.splitlines():
        header = _THREAD_RE.match(line)
        if header:
            close()
            name = header.group("name") or f"thread-{header.group('id')}"
            frames = []
            continue
        frame = _FRAME_RE.match(line)
        if frame and name is not None:
            frames.append(format_frame(frame.group("file"), frame.group("func"),
                                       int(frame.group("line") or 0)))
    close()
    return threads


def find_py_spy() -> str | None:
    """The py-spy executable: on PATH, else next to this interpreter (a venv's ``bin``)."""
    found = shutil.which("py-spy")
    if found:
        return found
    for folder in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)):
        candidate = Path(folder) / "py-spy"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


@dataclass
class _Run:
    """What one py-spy invocation came back with."""

    rc: int | None = None  # None: timed out, killed or never started
    out: bytes = b""
    err: bytes = b""
    cpu_s: float = 0.0
    timed_out: bool = False
    launch_error: str = ""

    def message(self) -> str:
        """First meaningful line of py-spy's complaint, for health reasons."""
        text = (self.err or self.out).decode("utf-8", "replace")
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        return (lines[0] if lines else f"exit status {self.rc}")[:300]


def _ptrace_hint() -> str:
    try:
        scope = Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip()
    except OSError:
        scope = ""
    hint = "needs ptrace permission: root or CAP_SYS_PTRACE"
    if scope:
        hint += f", or kernel.yama.ptrace_scope=0 (now {scope})"
    return hint


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
        self._lock = threading.Lock()  # guards _proc (spawn vs. kill from shutdown)
        self._state_lock = threading.Lock()  # orders "on" and "unavailable" reports
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._first = threading.Event()  # first dump outcome known
        self._first_fatal = False
        self._started = False
        self._thread: threading.Thread | None = None
        self._proc: subprocess.Popen | None = None
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
            self._kill_current()
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
        run = self._run([self._py_spy, "dump", "--help"], min(self.dump_timeout_s, 5.0))
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
        run = self._run([self._py_spy, "dump", "--pid", str(self._pid), *self._flags],
                        self.dump_timeout_s)
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
                if any(m in message.lower() for m in _PERMISSION_MARKERS) or any(
                        m in run.err.decode("utf-8", "replace").lower()
                        for m in _PERMISSION_MARKERS):
                    return "fatal", (f"py-spy not permitted to attach to pid {self._pid}: "
                                     f"{message} ({_ptrace_hint()})")
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

    # ---------------------------------------------------------------- subprocess handling

    def _run(self, argv: list[str], timeout: float) -> _Run:
        """Run py-spy with a deadline; kill its process group on timeout or shutdown.

        The child is reaped with ``os.wait4`` so that its own CPU time (user + system) is
        known exactly, not mixed with other children of the training process as
        ``RUSAGE_CHILDREN`` deltas would be.
        """
        result = _Run()
        env = dict(os.environ, RUST_BACKTRACE="0")
        with self._lock:
            if self._stop.is_set():
                return result
            try:
                proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, env=env, close_fds=True,
                                        start_new_session=True)
            except (FileNotFoundError, PermissionError, OSError) as exc:
                result.launch_error = f"cannot run py-spy at {argv[0]}: {exc}"
                return result
            self._proc = proc
        deadline = time.monotonic() + timeout
        try:
            self._collect(proc, deadline, result)
        finally:
            if result.timed_out or self._stop.is_set():
                self._kill(proc)
            for pipe in (proc.stdout, proc.stderr):
                with contextlib.suppress(Exception):
                    pipe.close()
            self._reap(proc, result, time.monotonic() + 1.0)
            with self._lock:
                self._proc = None
        return result

    def _collect(self, proc: subprocess.Popen, deadline: float, result: _Run) -> None:
        out: list[bytes] = []
        err: list[bytes] = []
        size = 0
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ, out)
            sel.register(proc.stderr, selectors.EVENT_READ, err)
            while sel.get_map():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    result.timed_out = True
                    break
                for key, _ in sel.select(min(remaining, 0.5)):
                    chunk = os.read(key.fd, 1 << 16)
                    if not chunk:
                        sel.unregister(key.fileobj)
                        continue
                    key.data.append(chunk)
                    size += len(chunk)
                if size > self.max_output_bytes:
                    result.timed_out = True  # treated as a failed sample
                    break
                if self._stop.is_set():
                    break
        result.out = b"".join(out)
        result.err = b"".join(err)[:65536]

    def _reap(self, proc: subprocess.Popen, result: _Run, deadline: float) -> None:
        killed = False
        while True:
            try:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere (a SIGCHLD handler): no CPU figure
                if not result.timed_out:
                    result.rc = 0 if result.out else 1
                proc.returncode = result.rc if result.rc is not None else -1
                return
            if pid:
                proc.returncode = os.waitstatus_to_exitcode(status)
                if not result.timed_out:
                    result.rc = proc.returncode
                result.cpu_s = usage.ru_utime + usage.ru_stime
                return
            if time.monotonic() >= deadline:
                if killed:  # unkillable (D state): leave it to Popen's own reaping later
                    return
                result.timed_out = True  # pipes closed but still alive: kill it
                self._kill(proc)
                killed = True
                deadline = time.monotonic() + 1.0
            time.sleep(0.002)

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
            os.killpg(proc.pid, signal.SIGKILL)  # start_new_session: pgid == pid

    def _kill_current(self) -> None:
        with self._lock:
            proc = self._proc
        if proc is not None and proc.returncode is None:
            self._kill(proc)
