"""The shipper: one background thread draining a bounded queue of NDJSON lines into a sink.

Modelled on OpenTelemetry's BatchSpanProcessor: ``submit`` never blocks (a full queue drops
its oldest line and counts it), a daemon thread exports when a batch fills or a timer fires,
``force_flush`` and ``shutdown`` have timeouts, and after ``fork`` the child starts clean.
"""

from __future__ import annotations

import collections
import os
import threading
import time
import weakref

from argus_exporters.health import Health
from argus_exporters.sinks import Sink


class Shipper:
    """Bounded, non-blocking hand-off from the training thread to a sink."""

    def __init__(self, sink: Sink, health: Health, max_records: int, batch_records: int,
                 flush_s: float):
        self.sink = sink
        self.health = health
        self.max_records = max_records
        self.batch_records = batch_records
        self.flush_s = flush_s
        self._init_state()
        weak = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: (s := weak()) and s._init_state())

    def _init_state(self) -> None:
        self._queue: collections.deque[bytes] = collections.deque(maxlen=self.max_records)
        self._queue_lock = threading.Lock()  # makes "full, so the oldest goes" exact
        self._wake = threading.Event()
        self._idle = threading.Condition()
        self._busy = False
        self._stopped = False
        self._thread: threading.Thread | None = None

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="argus-shipper", daemon=True)
            self._thread.start()

    @property
    def depth(self) -> int:
        """Lines waiting to be exported."""
        return len(self._queue)

    def submit(self, line: bytes) -> None:
        """Queue one line; never blocks. When full, the oldest line is dropped and counted."""
        if self._stopped:
            self.health.drop("shut_down")
            return
        with self._queue_lock:
            full = len(self._queue) >= self.max_records
            self._queue.append(line)
        if full:
            self.health.drop("queue_full")
        if self._thread is None:
            self._ensure_thread()
        if len(self._queue) >= self.batch_records:
            self._wake.set()

    def _run(self) -> None:
        cpu0 = time.thread_time()
        while True:
            self._wake.wait(self.flush_s)
            self._wake.clear()
            self._drain()
            self.health.add_cpu(time.thread_time() - cpu0)
            cpu0 = time.thread_time()
            if self._stopped:
                return

    def _drain(self) -> None:
        with self._idle:
            self._busy = True
        try:
            while self._queue:
                with self._queue_lock:
                    batch = [self._queue.popleft()
                             for _ in range(min(self.batch_records, len(self._queue)))]
                self._export(batch)
        finally:
            with self._idle:
                self._busy = False
                self._idle.notify_all()

    def _export(self, batch: list[bytes]) -> None:
        try:
            ok = self.sink.export(batch)
        except Exception:  # a sink must not raise, but never let it kill the thread
            ok = False
        if ok:
            self.health.shipped(len(batch), sum(len(line) for line in batch))
        else:
            self.health.failed_export()
            # A sink may say why (the HTTP sink: "receiver_busy" after its retries).
            self.health.drop(getattr(self.sink, "failure_reason", None) or "sink_error",
                             len(batch))

    def force_flush(self, timeout: float = 5.0) -> bool:
        """Export everything queued so far; True if done within ``timeout`` seconds."""
        if self._thread is None:
            return self.sink.force_flush(timeout)
        deadline = time.monotonic() + timeout
        self._wake.set()
        with self._idle:
            while self._queue or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._wake.set()
                self._idle.wait(min(left, 0.05))
        return self.sink.force_flush(max(deadline - time.monotonic(), 0.0))

    def shutdown(self, timeout: float = 5.0) -> None:
        """Flush (within ``timeout``), stop the thread and close the sink. A sink still waiting
        to retry after the timeout (a busy or dead receiver) is told to stop waiting, so the
        thread drains what is left, dropped and counted, instead of sitting out the wait."""
        if self._stopped:
            return
        flushed = self.force_flush(timeout)
        self._stopped = True
        stop_waiting = getattr(self.sink, "stop_waiting", None)
        if not flushed and stop_waiting is not None:
            stop_waiting()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self.sink.shutdown()
