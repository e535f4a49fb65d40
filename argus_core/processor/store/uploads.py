"""The non-blocking uploader: a bounded disk spool that *is* the upload queue, drained to the
store by a background thread with capped exponential backoff, so nothing accepted into the
spool is lost to an outage or a restart."""

from __future__ import annotations

import base64
import contextlib
import heapq
import logging
import os
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from argus_core.processor.logs import rate_limited
from argus_core.processor.store.stores import (
    TMP_PREFIX,
    TraceStore,
    write_atomic,
)

log = logging.getLogger(__name__)


@dataclass
class UploadStats:
    """Uploader counters (read them for metrics); increments are thread-safe via :meth:`add`."""

    uploaded_files: int = 0
    uploaded_bytes: int = 0
    failures: int = 0
    dropped_files: int = 0
    dropped_bytes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **deltas: int) -> None:
        """Add to counters atomically, e.g. ``add(uploaded_files=1, uploaded_bytes=n)``."""
        with self._lock:
            for name, delta in deltas.items():
                if name.startswith("_") or not hasattr(self, name):
                    raise AttributeError(f"UploadStats has no counter {name!r}")
                setattr(self, name, getattr(self, name) + delta)

    def snapshot(self) -> dict[str, int]:
        """A consistent copy of all counters."""
        with self._lock:
            return {name: getattr(self, name) for name in
                    ("uploaded_files", "uploaded_bytes", "failures", "dropped_files",
                     "dropped_bytes")}


@dataclass(order=True)
class _Spooled:
    seq: int
    path: Path = field(compare=False)
    key: str = field(compare=False)
    size: int = field(compare=False)
    sidecar: Path | None = field(compare=False, default=None)


_SEQ_DIGITS = 20
_MAX_NAME = 240
_LOCK_NAME = ".lock"


def _b64(key: str) -> str:
    return base64.urlsafe_b64encode(key.encode("utf-8")).decode("ascii").rstrip("=")


def _unb64(text: str) -> str:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode("utf-8")


class Uploader:
    """Non-blocking uploads with retry, capped exponential backoff and a bounded on-disk spool.

    The spool directory is the queue. Each accepted file is ``{seq:020d}-{b64}.spool``, where
    ``seq`` orders uploads (oldest first, continuing across restarts) and ``b64`` is the
    URL-safe base64 of the key without padding; a key too long for a file name is written to a
    sidecar ``{seq:020d}.key`` before the data file ``{seq:020d}.spool`` appears. Files are
    written to a ``.tmp-`` name, fsynced and renamed, so a crash never leaves half a file under
    a spool name. One background thread uploads the oldest file, deletes it after the store
    accepted it, and on failure waits ``backoff_s``, doubling up to ``max_backoff_s``
    (reset by a success); a new Uploader on the same directory resumes what is left.
    Delivery is at least once: a crash between the upload and the delete re-uploads the same
    key with the same bytes. One Uploader per spool directory (enforced with a lock file).
    """

    def __init__(self, store: TraceStore, spool_dir: str | Path, max_spool_bytes: int, *,
                 backoff_s: float = 0.5, max_backoff_s: float = 30.0,
                 stats: UploadStats | None = None):
        if max_spool_bytes <= 0:
            raise ValueError("max_spool_bytes must be > 0")
        if not 0 < backoff_s <= max_backoff_s:
            raise ValueError("need 0 < backoff_s <= max_backoff_s")
        self.store = store
        self.spool_dir = Path(spool_dir)
        self.max_spool_bytes = max_spool_bytes
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.stats = stats if stats is not None else UploadStats()
        self._cond = threading.Condition()
        self._queue: list[_Spooled] = []
        self._bytes = 0
        self._seq = 0
        self._kick = False
        self._stopping = False
        self._closed = False
        self._drop_log = self._fail_log = rate_limited(log)  # a full disk repeats itself
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = _lock_dir(self.spool_dir)
        try:
            self._recover()
        except BaseException:
            os.close(self._lock_fd)
            raise
        self._thread = threading.Thread(target=self._run, name="argus-uploader", daemon=True)
        self._thread.start()

    # ----------------------------------------------------------------- public

    @property
    def spool_bytes(self) -> int:
        """Bytes of trace data in the spool (accepted and not yet uploaded)."""
        with self._cond:
            return self._bytes

    @property
    def pending(self) -> int:
        """Files in the spool (accepted and not yet uploaded)."""
        with self._cond:
            return len(self._queue)

    def submit(self, key: str, data: bytes) -> None:
        """Spool a file for upload, never waiting on the store; drop and count it if full."""
        size = len(data)
        with self._cond:
            if self._bytes + size > self.max_spool_bytes:
                self.stats.add(dropped_files=1, dropped_bytes=size)
                self._drop_log.warning("trace spool %s full (%d of %d bytes): dropped %s",
                                       self.spool_dir, self._bytes, self.max_spool_bytes, key)
                return
            self._bytes += size  # reserve the room before writing outside the lock
            self._seq += 1
            seq = self._seq
        try:
            entry = self._write(seq, key, data)
        except Exception as exc:  # disk full, permissions: count, never raise into the caller
            with self._cond:
                self._bytes -= size
            self.stats.add(dropped_files=1, dropped_bytes=size)
            self._drop_log.warning("cannot spool %s into %s: %s", key, self.spool_dir, exc)
            return
        with self._cond:
            heapq.heappush(self._queue, entry)
            self._cond.notify_all()

    def submit_file(self, key: str, path: Path) -> bool:
        """Move a finished file (on the spool's filesystem) into the spool for upload.

        The file is renamed, never read: a window's trace reaches the store without being
        held in memory. Returns False, and deletes the file, when the spool is full (counted
        as dropped) or the move fails.
        """
        path = Path(path)
        try:
            size = path.stat().st_size
        except OSError as exc:
            self.stats.add(dropped_files=1)
            self._drop_log.warning("cannot spool %s: %s", key, exc)
            return False
        with self._cond:
            room = self._bytes + size <= self.max_spool_bytes
            if room:
                self._bytes += size
                self._seq += 1
                seq = self._seq
        try:
            if not room:
                self.stats.add(dropped_files=1, dropped_bytes=size)
                self._drop_log.warning("trace spool %s full (%d of %d bytes): dropped %s",
                                       self.spool_dir, self._bytes, self.max_spool_bytes, key)
                return False
            try:
                entry = self._place(seq, key, size, lambda target: os.replace(path, target))
            except Exception as exc:
                with self._cond:
                    self._bytes -= size
                self.stats.add(dropped_files=1, dropped_bytes=size)
                self._drop_log.warning("cannot spool %s into %s: %s", key, self.spool_dir, exc)
                return False
        finally:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # still there only if it was not moved
        with self._cond:
            heapq.heappush(self._queue, entry)
            self._cond.notify_all()
        return True

    def flush(self, timeout: float) -> bool:
        """Upload everything spooled now (cutting a backoff short); True if the spool is empty."""
        deadline = time.monotonic() + max(timeout, 0.0)
        with self._cond:
            self._kick = True
            self._cond.notify_all()
            while self._queue and self._thread.is_alive():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            return not self._queue

    def close(self, timeout: float) -> None:
        """Flush for up to ``timeout`` seconds, then stop; what is left stays for the next start."""
        if self._closed:
            return
        deadline = time.monotonic() + max(timeout, 0.0)
        self.flush(timeout)
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        # The thread releases the directory lock when it exits: if it is still inside a put
        # (bounded by the store's timeouts), a new Uploader must not start on this spool yet.
        self._thread.join(max(deadline - time.monotonic(), 0.05))
        self._closed = True

    def __enter__(self) -> Uploader:
        """Use as a context manager: closes (flushing up to 5 s) on exit."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close with a 5 s flush; what is left stays spooled for the next start."""
        self.close(timeout=5.0)

    # ----------------------------------------------------------------- spool files

    def _write(self, seq: int, key: str, data: bytes) -> _Spooled:
        """Write one spool file (and a key sidecar when the key does not fit in the name)."""
        return self._place(seq, key, len(data), lambda target: write_atomic(target, data))

    def _place(self, seq: int, key: str, size: int, put: Any) -> _Spooled:
        """Name a spool entry, write its key sidecar if needed, and ``put(path)`` its data."""
        name = f"{seq:0{_SEQ_DIGITS}d}-{_b64(key)}.spool"
        sidecar = None
        if len(name) > _MAX_NAME:
            name = f"{seq:0{_SEQ_DIGITS}d}.spool"
            sidecar = self.spool_dir / f"{seq:0{_SEQ_DIGITS}d}.key"
            write_atomic(sidecar, key.encode("utf-8"))
        path = self.spool_dir / name
        try:
            put(path)
        except BaseException:
            if sidecar is not None:
                with contextlib.suppress(OSError):
                    sidecar.unlink()
            raise
        return _Spooled(seq, path, key, size, sidecar)

    def _recover(self) -> None:
        """Rebuild the queue from the spool directory (a restarted processor resumes uploads)."""
        keys: dict[int, Path] = {}
        spooled: list[Path] = []
        for path in self.spool_dir.iterdir():
            if path.name.startswith(TMP_PREFIX):
                with contextlib.suppress(OSError):
                    path.unlink()  # a write that never completed: it was never accepted
            elif path.suffix == ".key" and path.stem.isdigit():
                keys[int(path.stem)] = path
            elif path.suffix == ".spool":
                spooled.append(path)
        for path in spooled:
            stem = path.name[:-len(".spool")]
            seq_text, _, encoded = stem.partition("-")
            if len(seq_text) != _SEQ_DIGITS or not seq_text.isdigit():
                log.warning("ignoring unexpected file in the trace spool: %s", path)
                continue
            seq = int(seq_text)
            sidecar = keys.pop(seq, None) if not encoded else None
            try:
                key = _unb64(encoded) if encoded else sidecar.read_text("utf-8")  # type: ignore[union-attr]
                size = path.stat().st_size
            except (ValueError, AttributeError, OSError) as exc:
                log.warning("ignoring unreadable spool file %s: %s", path, exc)
                continue
            self._queue.append(_Spooled(seq, path, key, size, sidecar))
            self._bytes += size
            self._seq = max(self._seq, seq)
        for seq, orphan in keys.items():  # a key whose data never arrived (crash in between)
            self._seq = max(self._seq, seq)
            with contextlib.suppress(OSError):
                orphan.unlink()
        heapq.heapify(self._queue)
        if self._queue:
            log.info("trace spool %s: resuming %d pending upload(s), %d bytes",
                     self.spool_dir, len(self._queue), self._bytes)

    # ----------------------------------------------------------------- worker

    def _run(self) -> None:
        """The worker thread: upload until close(), then release the spool directory."""
        try:
            self._loop()
        finally:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)

    def _loop(self) -> None:
        """The upload loop: oldest first, delete after success, capped exponential backoff."""
        delay = 0.0
        while True:
            with self._cond:
                while not self._stopping and not self._queue:
                    self._cond.wait()
                if self._stopping:
                    return
                entry = self._queue[0]
                self._kick = False
            try:
                ok = self._upload(entry)
            except Exception:  # never let the thread die
                log.exception("trace uploader: unexpected error on %s", entry.key)
                ok = False
            if ok:
                delay = 0.0
                continue
            delay = self.backoff_s if delay == 0.0 else min(delay * 2, self.max_backoff_s)
            self._sleep(delay * random.uniform(1.0, 1.2))

    def _sleep(self, seconds: float) -> None:
        """Wait out a backoff, unless flush() or close() asks for an attempt now."""
        deadline = time.monotonic() + seconds
        with self._cond:
            while not self._stopping and not self._kick:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                self._cond.wait(remaining)

    def _upload(self, entry: _Spooled) -> bool:
        """Try one upload; True when the file is gone from the spool (uploaded or vanished)."""
        if not entry.path.exists():
            log.warning("spool file %s vanished before upload; counted as dropped", entry.path)
            self.stats.add(dropped_files=1, dropped_bytes=entry.size)
            self._forget(entry)
            return True
        try:
            put_file = getattr(self.store, "put_file", None)
            if put_file is not None:  # streamed: a window's file is never whole in memory
                put_file(entry.key, entry.path)
            else:
                self.store.put(entry.key, entry.path.read_bytes())
        except FileNotFoundError:
            log.warning("spool file %s vanished during upload; counted as dropped", entry.path)
            self.stats.add(dropped_files=1, dropped_bytes=entry.size)
            self._forget(entry)
            return True
        except Exception as exc:
            self.stats.add(failures=1)
            self._fail_log.warning("trace upload failed, will retry (%d pending): %s",
                                   self.pending, exc)
            return False
        for path in (entry.path, entry.sidecar):
            if path is not None:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        self.stats.add(uploaded_files=1, uploaded_bytes=entry.size)
        self._forget(entry)
        return True

    def _forget(self, entry: _Spooled) -> None:
        with self._cond:
            self._queue.remove(entry)
            heapq.heapify(self._queue)
            self._bytes -= entry.size
            self._cond.notify_all()


def _lock_dir(directory: Path) -> int:
    """Hold an exclusive lock on the spool directory, so two uploaders never share it."""
    fd = os.open(directory / _LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except ImportError:  # not POSIX: no lock, document one uploader per directory
        pass
    except OSError as exc:
        os.close(fd)
        raise RuntimeError(f"spool directory {directory} is in use by another uploader") from exc
    return fd


def iter_spool_keys(spool_dir: str | Path) -> Iterator[str]:
    """The keys waiting in a spool directory, oldest first (for inspection and tests)."""
    entries = []
    for path in Path(spool_dir).glob("*.spool"):
        stem = path.name[:-len(".spool")]
        seq_text, _, encoded = stem.partition("-")
        if not seq_text.isdigit():
            continue
        key = _unb64(encoded) if encoded else (path.parent / f"{seq_text}.key").read_text("utf-8")
        entries.append((int(seq_text), key))
    for _, key in sorted(entries):
        yield key
