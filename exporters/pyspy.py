"""py-spy, the tool behind the stack probe: finding it, running it with a deadline, parsing it.

``PySpyRunner.run`` starts one short-lived py-spy (its own process group, stdin closed) and
collects its output with a deadline and a size cap; it is killed with its whole group when it
overstays or the probe shuts down, and reaped with ``os.wait4`` so that its own CPU time is
known exactly. ``parse_json_dump`` and ``parse_text_dump`` turn a dump into threads of frames
``"file.py:function:line"``, outermost first. The probe's scheduling is
``argus_exporters.stacks``.
"""

from __future__ import annotations

import contextlib
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
from dataclasses import dataclass
from pathlib import Path

import orjson

# py-spy prints these when the kernel refuses the attach (ptrace/process_vm_readv): its own
# "Permission Denied: Try running again with elevated permissions ...", the raw OS errors
# EPERM/EACCES from remoteprocess, and "requires root" on macOS.
PERMISSION_MARKERS = (
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
class PySpyRun:
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


def ptrace_hint() -> str:
    """How to let py-spy attach, with the host's ptrace scope."""
    try:
        scope = Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip()
    except OSError:
        scope = ""
    hint = "needs ptrace permission: root or CAP_SYS_PTRACE"
    if scope:
        hint += f", or kernel.yama.ptrace_scope=0 (now {scope})"
    return hint


class PySpyRunner:
    """Runs py-spy one invocation at a time; ``stop`` (set by the probe's shutdown) cuts a
    running one short."""

    def __init__(self, stop: threading.Event):
        self._stop = stop
        self._lock = threading.Lock()  # guards _proc (spawn vs. kill from shutdown)
        self._proc: subprocess.Popen | None = None

    def run(self, argv: list[str], timeout: float, max_output_bytes: int) -> PySpyRun:
        """Run py-spy with a deadline; kill its process group on timeout or shutdown.

        The child is reaped with ``os.wait4`` so that its own CPU time (user + system) is
        known exactly, not mixed with other children of the training process as
        ``RUSAGE_CHILDREN`` deltas would be.
        """
        result = PySpyRun()
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
            self._collect(proc, deadline, result, max_output_bytes)
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

    def _collect(self, proc: subprocess.Popen, deadline: float, result: PySpyRun,
                 max_output_bytes: int) -> None:
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
                if size > max_output_bytes:
                    result.timed_out = True  # treated as a failed sample
                    break
                if self._stop.is_set():
                    break
        result.out = b"".join(out)
        result.err = b"".join(err)[:65536]

    def _reap(self, proc: subprocess.Popen, result: PySpyRun, deadline: float) -> None:
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

    def kill_current(self) -> None:
        """Kill the py-spy running now, if any (shutdown)."""
        with self._lock:
            proc = self._proc
        if proc is not None and proc.returncode is None:
            self._kill(proc)
