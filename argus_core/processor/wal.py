"""The processor's write-ahead log: what a 2xx promises is on disk before the 2xx is sent.

Like Prometheus's WAL and Vector's disk buffers: every request body with accepted records is
appended, as received (still compressed), to the current segment file before the records are
acknowledged; a restart replays the log (``argus_core.processor.replay``). Entries::

    kind (1 byte) | payload length (uint32 LE) | CRC-32 of the payload (uint32 LE) | payload

- ``K`` snapshot, first in every segment: per-rank state (identity, watermark, closed windows)
  at the moment the segment opened, so older segments can be deleted without losing it.
- ``B`` body: the request body with its Content-Encoding, the item numbers of the records
  that were refused (so a replay accepts exactly what was acknowledged) and the windows its
  records went to (so a replay skips, undecoded, a body whose windows are all written).
- ``C`` closed: a window was closed and handed to the writer (later records for it are late).
- ``D`` done: a window's file is in the upload spool; its records are no longer needed.

A segment (``{seq:012d}.wal``) is deleted once every window holding records from it is done and
every older segment is gone. One ``writev`` per body: appends cost one system call per request,
never one per record. A torn entry at the end of the last segment (the process died mid-write)
was never acknowledged; reading stops there.

Sync policy (``fsync_each``): with it, :meth:`WriteAheadLog.durable` hands out a future that a
sync thread resolves after ``fdatasync`` covers the entry (group commit: one fdatasync for all
the requests waiting); a machine crash loses nothing acknowledged. Without it, the log is
fdatasynced every ``sync_interval_s``: a process crash still loses nothing (the data is in the
kernel's page cache), a machine crash can lose up to that interval.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import orjson

log = logging.getLogger(__name__)

SNAPSHOT, BODY, CLOSED, DONE = b"K", b"B", b"C", b"D"
_KINDS = (SNAPSHOT, BODY, CLOSED, DONE)
_HEADER = struct.Struct("<cII")
_BODY_META = struct.Struct("<HII")  # encoding length, refused items, windows' JSON length
_ITEM = struct.Struct("<I")
SUFFIX = ".wal"


class WalError(Exception):
    """The log cannot be written (disk full, I/O error): nothing may be acknowledged."""


@dataclass(frozen=True)
class Entry:
    """One log entry as read back."""

    kind: bytes
    payload: bytes
    segment: int


@dataclass(frozen=True)
class LoggedBody:
    """A ``B`` entry read back."""

    body: bytes
    encoding: str
    refused: frozenset[int]  # item numbers refused when the body came in
    windows: frozenset[tuple] | None  # (job, rank, index) its records went to; None: unknown


def body_payload(body: bytes, encoding: str, refused: list[int],
                 windows: list[tuple] | None) -> tuple[bytes, bytes]:
    """(meta, body) of a ``B`` entry: the encoding, the refused item numbers and the windows
    the records go to (a replay skips a body whose windows are all written), then the body."""
    encoded = encoding.encode("utf-8", "replace")[:1024]
    keys = b"" if windows is None else orjson.dumps(windows)
    meta = _BODY_META.pack(len(encoded), len(refused), len(keys)) + encoded + b"".join(
        _ITEM.pack(item) for item in refused) + keys
    return meta, body


def read_body_payload(payload: bytes) -> LoggedBody:
    """What a ``B`` entry's payload holds."""
    length, refused, keys = _BODY_META.unpack_from(payload)
    at = _BODY_META.size
    encoding = payload[at:at + length].decode("utf-8", "replace")
    at += length
    items = frozenset(_ITEM.unpack_from(payload, at + 4 * i)[0] for i in range(refused))
    at += 4 * refused
    windows = frozenset(tuple(k) for k in orjson.loads(payload[at:at + keys])) if keys else None
    return LoggedBody(payload[at + keys:], encoding, items, windows)


class WriteAheadLog:
    """Segments of log entries in one directory; appends from any thread."""

    def __init__(self, directory: str | Path, *, fsync_each: bool = False,
                 sync_interval_s: float = 1.0, segment_bytes: int = 64 << 20,
                 segment_age_s: float = 300.0):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.fsync_each = fsync_each
        self.sync_interval_s = sync_interval_s
        self.segment_bytes = segment_bytes
        self.segment_age_s = segment_age_s
        self.current: int | None = None
        self.syncs = 0
        self._fd: int | None = None
        self._size = 0
        self._opened = 0.0
        self._sizes: dict[int, int] = {seq: (self.directory / _name(seq)).stat().st_size
                                       for seq in self._on_disk()}
        self.bytes_on_disk = sum(self._sizes.values())
        """Total size of the segments on disk (read without a lock: the event loop asks)."""
        self._lock = threading.Lock()  # appends and the current segment
        self._sync_lock = threading.Lock()  # an fdatasync and a roll never overlap
        self._cond = threading.Condition()
        self._waiters: list[Future] = []
        self._dirty = False
        self._stopping = False
        self._thread = threading.Thread(target=self._sync_loop, name="argus-wal-sync",
                                        daemon=True)
        self._thread.start()

    # -- reading ----------------------------------------------------------------------------
    def _on_disk(self) -> list[int]:
        return sorted(int(p.name[:-len(SUFFIX)]) for p in self.directory.glob(f"*{SUFFIX}")
                      if p.name[:-len(SUFFIX)].isdigit())

    def segments(self) -> list[int]:
        """Sequence numbers of the segments on disk, oldest first."""
        with self._lock:
            return sorted(self._sizes)

    def read(self, segment: int, kinds: tuple[bytes, ...] = _KINDS) -> Iterator[Entry]:
        """The entries of one segment, in order; others than ``kinds`` are skipped unread.

        Stops at the first torn or corrupt entry (logged): nothing after it was acknowledged
        if it is the last segment, and nothing after it can be trusted otherwise.
        """
        path = self.directory / _name(segment)
        with open(path, "rb") as fh:
            while True:
                offset = fh.tell()
                header = fh.read(_HEADER.size)
                if not header:
                    return
                if len(header) < _HEADER.size:
                    log.warning("write-ahead log %s: torn entry header at byte %d", path, offset)
                    return
                kind, length, crc = _HEADER.unpack(header)
                if kind not in _KINDS:
                    log.error("write-ahead log %s: unknown entry kind %r at byte %d; the rest "
                              "of this segment is skipped", path, kind, offset)
                    return
                if kind not in kinds:
                    fh.seek(length, os.SEEK_CUR)
                    if fh.tell() > os.fstat(fh.fileno()).st_size:
                        log.warning("write-ahead log %s: torn entry at byte %d", path, offset)
                        return
                    continue
                payload = fh.read(length)
                if len(payload) < length or zlib.crc32(payload) != crc:
                    log.warning("write-ahead log %s: torn or corrupt entry at byte %d "
                                "(%d of %d bytes); reading stops there", path, offset,
                                len(payload), length)
                    return
                yield Entry(kind, payload, segment)

    # -- writing ----------------------------------------------------------------------------
    def open_segment(self, snapshot: bytes) -> int:
        """Start a new current segment whose first entry is ``snapshot``; returns its number.

        The previous segment is fdatasynced and closed first, so whatever was acknowledged in
        it is on disk.
        """
        with self._sync_lock, self._lock:
            if self._fd is not None:
                self._close_current()
            seq = max(self._sizes, default=0) + 1
            path = self.directory / _name(seq)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
            except OSError as exc:
                raise WalError(f"cannot create {path}: {exc}") from exc
            self._fd, self.current, self._size, self._opened = fd, seq, 0, time.monotonic()
            self._sizes[seq] = 0
            self._append(SNAPSHOT, (snapshot,))
            os.fdatasync(fd)
            fsync_dir(self.directory)
            return seq

    def _close_current(self) -> None:
        with contextlib.suppress(OSError):
            os.fdatasync(self._fd)
        os.close(self._fd)
        self._fd = None

    def append(self, kind: bytes, *parts: bytes) -> int:
        """Append one entry whose payload is ``parts`` joined; returns the segment it is in.

        Raises WalError (after cutting the segment back to its last whole entry) when the
        entry cannot be written: then nothing of it may be acknowledged.
        """
        with self._lock:
            if self._fd is None:
                raise WalError("the write-ahead log is closed")
            self._append(kind, parts)
            return self.current  # type: ignore[return-value]

    def _append(self, kind: bytes, parts: tuple[bytes, ...]) -> None:
        crc = 0
        length = 0
        for part in parts:
            crc = zlib.crc32(part, crc)
            length += len(part)
        whole = [_HEADER.pack(kind, length, crc), *parts]
        total = _HEADER.size + length
        written = 0
        try:
            while written < total:
                written += os.writev(self._fd, _rest(whole, written) if written else whole)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._size)
            raise WalError(f"cannot write the write-ahead log in {self.directory}: {exc}") \
                from exc
        self._size += total
        self._sizes[self.current] = self._size
        self.bytes_on_disk += total
        self._dirty = True

    def should_roll(self) -> bool:
        """The current segment is full, or old enough to start a new one."""
        return self._fd is not None and (
            self._size >= self.segment_bytes
            or (time.monotonic() - self._opened >= self.segment_age_s and self._size > 4096))

    def durable(self) -> Future | None:
        """With ``fsync_each``: a future done once everything appended so far is fdatasynced
        (raising WalError if that failed). Without: None (written is as durable as it gets)."""
        if not self.fsync_each:
            return None
        future: Future = Future()
        with self._cond:
            self._waiters.append(future)
            self._cond.notify()
        return future

    def sync(self) -> None:
        """fdatasync the current segment now (before deleting segments its entries retire)."""
        with self._sync_lock:
            fd = self._fd
            if fd is not None:
                os.fdatasync(fd)
                self.syncs += 1

    def delete(self, segments: list[int]) -> None:
        """Remove segments whose records are all written elsewhere (never the current one)."""
        for seq in segments:
            if seq == self.current:
                continue
            with self._lock:
                self.bytes_on_disk -= self._sizes.pop(seq, 0)
            with contextlib.suppress(FileNotFoundError):
                (self.directory / _name(seq)).unlink()

    def close(self) -> None:
        """Stop the sync thread, fdatasync and close the current segment."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(10)
        with self._sync_lock, self._lock:
            if self._fd is not None:
                self._close_current()

    # -- the sync thread --------------------------------------------------------------------
    def _sync_loop(self) -> None:
        while True:
            with self._cond:
                if self.fsync_each:
                    while not self._waiters and not self._stopping:
                        self._cond.wait()
                else:
                    self._cond.wait(self.sync_interval_s)
                if self._stopping and not self._waiters:
                    return
                waiters, self._waiters = self._waiters, []
                dirty, self._dirty = self._dirty, False
            error = None
            if waiters or dirty:
                try:
                    self.sync()
                except OSError as exc:
                    error = WalError(f"cannot fsync the write-ahead log: {exc}")
                    log.error("%s", error)
            for future in waiters:
                if error is None:
                    future.set_result(None)
                else:
                    future.set_exception(error)


def _name(seq: int) -> str:
    return f"{seq:012d}{SUFFIX}"


def _rest(buffers: list[bytes], written: int) -> list[bytes]:
    """What is left of ``buffers`` after the first ``written`` bytes went out."""
    out = []
    for buf in buffers:
        if written >= len(buf):
            written -= len(buf)
            continue
        out.append(memoryview(buf)[written:])
        written = 0
    return out


def fsync_dir(directory: Path) -> None:
    """Make a directory's entries (a new or renamed file) durable (POSIX; no-op elsewhere)."""
    with contextlib.suppress(OSError, AttributeError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

