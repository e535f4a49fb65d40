"""Starting, checking and stopping the stack's processes.

Each component runs as a plain child process in its own session (so it outlives
``argus stack up`` and a terminal's Ctrl-C), with its output in a log file. What was started is
recorded by pid together with the process's start time, so ``argus stack down`` stops exactly
those processes and never a later process that reused a pid.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path


class StackError(RuntimeError):
    """The stack could not be started, found or stopped; the message says why."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc), None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[19])  # field 22 of proc(5), counted after "pid (comm)"


@dataclass
class Process:
    """A started component: how to find it again, and how to tell it is still ours."""

    name: str
    pid: int
    started: int  # /proc start time: a reused pid has another
    argv: list[str]
    log: str
    url: str = ""

    @classmethod
    def from_dict(cls, data: dict) -> Process:
        """Inverse of ``asdict``."""
        return cls(**data)

    def to_dict(self) -> dict:
        """For the stack's state file."""
        return asdict(self)

    @property
    def running(self) -> bool:
        """True while the very process we started is alive (not a zombie, not a reused pid)."""
        if _start_time(self.pid) != self.started:
            return False
        try:
            state = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return False
        return state != "Z"

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the process (only if it is still ours)."""
        if self.running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def stop(self, timeout: float = 20.0) -> bool:
        """SIGTERM, wait, then SIGKILL; True once the process is gone."""
        self.signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while self.running and time.monotonic() < deadline:
            _reap(self.pid)
            time.sleep(0.05)
        if self.running:
            self.signal(signal.SIGKILL)
            deadline = time.monotonic() + 5
            while self.running and time.monotonic() < deadline:
                _reap(self.pid)
                time.sleep(0.05)
        _reap(self.pid)
        return not self.running


def _reap(pid: int) -> None:
    """Collect the exit status if the process is our child (no zombie left behind)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def start(name: str, argv: list[str], log_dir: Path, env: dict | None = None,
          url: str = "") -> Process:
    """Start ``argv`` in its own session with stdout and stderr to ``log_dir/name.log``."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{name}.log"
    with open(log, "ab") as out:
        child = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True,
                                 env={**os.environ, **(env or {})})
    started = _start_time(child.pid)
    if started is None:
        raise StackError(f"{name} exited at once; see {log}")
    return Process(name, child.pid, started, list(argv), str(log), url)


def poll_ready(url: str, alive: Callable[[], bool], timeout: float,
               poll_s: float = 0.1) -> bool | None:
    """Poll ``url`` until it answers 2xx (True); None as soon as the server's process is no
    longer ``alive``, False when ``timeout`` seconds pass first. The one start-up wait of
    every server Argus, its tests and its benchmarks start."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive():
            return None
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if 200 <= response.status < 300:
                    return True
        except OSError:  # refused, reset, or an HTTP error status: not ready yet
            pass
        time.sleep(poll_s)
    return False


def start_child(argv: list[str], ready_url: str, log_path: Path, timeout: float = 60.0,
                poll_s: float = 0.1) -> subprocess.Popen:
    """Start a server binary as a child of this process, its output appended to
    ``log_path``, and wait until ``ready_url`` answers 2xx; raise StackError with the log's
    tail when it exits first or time runs out (then it is stopped). For throwaway servers
    (tests, benchmarks, a preview's Prometheus); the stack's own components use ``start``."""
    with open(log_path, "ab") as log:
        child = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    ready = poll_ready(ready_url, lambda: child.poll() is None, timeout, poll_s)
    if ready is None:
        raise StackError(f"{Path(argv[0]).name} exited with {child.returncode}:\n"
                         f"{_tail(str(log_path))}")
    if not ready:
        stop_child(child)
        raise StackError(f"{Path(argv[0]).name} did not answer {ready_url} within "
                         f"{timeout:g} s:\n{_tail(str(log_path))}")
    return child


def stop_child(child: subprocess.Popen | None, timeout: float = 20.0) -> None:
    """Stop a child started by ``start_child``: SIGTERM, then SIGKILL after ``timeout``."""
    if child is None or child.poll() is not None:
        return
    child.terminate()
    try:
        child.wait(timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait(10)


def wait_ready(process: Process, url: str, timeout: float = 60.0) -> None:
    """Poll ``url`` until it answers 2xx; raise with the log's tail if the process dies or
    time runs out."""
    ready = poll_ready(url, lambda: process.running, timeout)
    if ready is None:
        raise StackError(f"{process.name} exited during start-up:\n{_tail(process.log)}")
    if not ready:
        raise StackError(f"{process.name} did not answer {url} within {timeout:g} s:\n"
                         f"{_tail(process.log)}")


def _tail(path: str, lines: int = 15) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
