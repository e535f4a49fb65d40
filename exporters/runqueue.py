"""How long the training thread waited for a CPU: Linux's run delay (``schedstat``).

A rank whose thread is runnable but not running (another process on its cores, more busy
threads than cores, a noisy neighbour) is slow without being slow at its own work. The kernel
counts that time per thread: the second field of ``/proc/self/task/<tid>/schedstat``, in
nanoseconds. One ``pread`` on a file kept open costs about a microsecond; where the kernel does
not keep it (not Linux, schedstats off, no ``/proc``) nothing is read again.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading


class RunDelay:
    """Seconds the calling thread waited for a CPU between two calls (``since_last``)."""

    def __init__(self) -> None:
        self._off = not sys.platform.startswith("linux")
        self._tid: int | None = None
        self._fd: int | None = None
        self._last_ns: int | None = None

    def since_last(self) -> float | None:
        """Seconds this thread waited for a CPU since its previous call; None on its first
        call, after another thread called, or where the kernel keeps no count."""
        if self._off:
            return None
        tid = threading.get_native_id()
        if tid != self._tid:
            self._open(tid)
            if self._fd is None:
                return None
        try:
            now = int(os.pread(self._fd, 64, 0).split(None, 2)[1])
        except (OSError, ValueError, IndexError):
            self.close()
            self._off = True
            return None
        last, self._last_ns = self._last_ns, now
        return None if last is None else max(now - last, 0) * 1e-9

    def _open(self, tid: int) -> None:
        self.close()
        self._tid, self._last_ns = tid, None
        try:
            self._fd = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self._off = True

    def close(self) -> None:
        """Close the file (it is reopened by the next call from another thread)."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
