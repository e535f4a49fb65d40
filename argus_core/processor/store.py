"""Trace storage: object keys, file and S3 stores, and a non-blocking uploader with a disk spool.

The processor writes one gzip-compressed Perfetto file per (job, rank, window) and hands it to
an :class:`Uploader`, which never blocks: the file goes into a bounded spool directory that *is*
the upload queue, and a background thread moves it to the store (retrying with capped
exponential backoff), so nothing accepted into the spool is lost to an S3 outage or a restart.

Key layout (the contract with ``argus traces`` and anyone browsing the bucket)::

    {prefix}/{safe_job(job)}/rank={rank}/{YYYYMMDDTHHMMSSZ}.pftrace.gz

- ``window_start`` is the window's start in UTC, compact ISO-8601 basic format
  (``20261129T190000Z``): readable, fixed-width, and lexicographic order is time order, so
  S3 ``StartAfter`` can skip everything before ``--since``. A start that is not a whole second
  (the processor's windows are whole seconds) gets a nine-digit fraction:
  ``20261129T190000.250000000Z``; :func:`parse_key` reads both forms back to the exact ns.
- ``safe_job``: ASCII letters, digits, ``_``, ``-`` and ``.`` stay; every other character
  (``/``, ``%``, spaces, control characters, non-ASCII) becomes ``%XX`` per UTF-8 byte, as in
  URLs. A ``.`` is also encoded when it starts the name or follows another ``.``, so the
  segment is never ``.``/``..``, never hidden and never contains ``..``. The encoding is
  reversible. Names whose encoding is longer than 128 characters are cut and end in ``~``
  plus 16 hex digits of the name's SHA-256 (``~`` never appears otherwise), which keeps keys
  and file names short; such a job is found by its name (``argus traces ls --job``) but
  :func:`parse_key` reports the segment, not the original name.
"""

from __future__ import annotations

import base64
import calendar
import contextlib
import hashlib
import heapq
import logging
import os
import random
import re
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO, Protocol, runtime_checkable
from urllib.parse import unquote, unquote_to_bytes, urlparse

log = logging.getLogger(__name__)

STORE_ENV = "ARGUS_STORE"
"""Environment variable naming the trace store URL (processor and ``argus traces``)."""
DEFAULT_STORE_URL = "file:///var/lib/argus/traces"
"""Where traces go when ``ARGUS_STORE`` is not set: a local directory on the processor host."""
SUFFIX = ".pftrace.gz"
MAX_JOB_SEGMENT = 128
S3_CONNECT_TIMEOUT_S = 3.0
S3_READ_TIMEOUT_S = 10.0

_SAFE_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-.")
_SEGMENT_RE = re.compile(r"[A-Za-z0-9_.%~-]+")
_RANK_RE = re.compile(r"rank=(0|[1-9][0-9]*)")
_WINDOW_RE = re.compile(r"([0-9]{8}T[0-9]{6})(?:\.([0-9]{9}))?Z" + re.escape(SUFFIX))
_MAX_WINDOW_NS = (calendar.timegm((9999, 12, 31, 23, 59, 59)) + 1) * 1_000_000_000  # year 10000


class StoreError(Exception):
    """A store operation failed (unreachable endpoint, denied, missing bucket, I/O error)."""


class NotFoundError(StoreError):
    """The requested key does not exist in the store."""


@dataclass(frozen=True)
class TraceRef:
    """What a trace key says: job, rank and window start (ns since the epoch, UTC)."""

    job: str
    rank: int
    window_start_ns: int
    key: str


@dataclass(frozen=True)
class ObjectInfo:
    """One stored object: its key, size in bytes and last-modified time (UTC)."""

    key: str
    size: int
    last_modified: datetime


# --------------------------------------------------------------------------- keys


def safe_job(job: str) -> str:
    """Encode a job name as one safe key segment (rule in the module docstring), reversibly."""
    if not job:
        raise ValueError("job name must not be empty")
    out: list[str] = []
    for ch in job:
        if ch in _SAFE_CHARS and not (ch == "." and (not out or out[-1] == ".")):
            out.append(ch)
        else:
            out.append("".join(f"%{byte:02X}" for byte in ch.encode("utf-8", "surrogatepass")))
    encoded = "".join(out)
    if len(encoded) <= MAX_JOB_SEGMENT:
        return encoded
    digest = hashlib.sha256(job.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    room = MAX_JOB_SEGMENT - len(digest) - 1
    head = ""
    for piece in out:  # whole characters only: never half a %XX escape or a UTF-8 sequence
        if len(head) + len(piece) > room:
            break
        head += piece
    return f"{head}~{digest}"


def _job_from_segment(segment: str) -> str | None:
    """Invert :func:`safe_job`; truncated segments come back as is; None if not a safe form."""
    if not _SEGMENT_RE.fullmatch(segment):
        return None
    if "~" in segment:
        return segment
    try:
        job = unquote_to_bytes(segment).decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return None
    return job if job and safe_job(job) == segment else None


def window_label(window_start_ns: int) -> str:
    """The key's window-start form: compact UTC ISO-8601, e.g. ``20261129T190000Z``."""
    if not 0 <= window_start_ns < _MAX_WINDOW_NS:
        raise ValueError(f"window start {window_start_ns} ns is outside years 1970-9999")
    seconds, fraction = divmod(window_start_ns, 1_000_000_000)
    label = datetime.fromtimestamp(seconds, UTC).strftime("%Y%m%dT%H%M%S")
    return f"{label}.{fraction:09d}Z" if fraction else f"{label}Z"


def _parse_window_label(text: str) -> int:
    """Nanoseconds since the epoch of a ``YYYYMMDDTHHMMSS`` label and an optional fraction."""
    moment = datetime.strptime(text, "%Y%m%dT%H%M%S").replace(tzinfo=UTC)
    return calendar.timegm(moment.utctimetuple()) * 1_000_000_000


def _join(prefix: str, *parts: str) -> str:
    """Join key parts with '/', ignoring slashes around the prefix and an empty prefix."""
    head = prefix.strip("/")
    return "/".join((head, *parts)) if head else "/".join(parts)


def job_prefix(prefix: str, job: str, rank: int | None = None) -> str:
    """The key prefix (ending in '/') of every trace of a job, or of one of its ranks."""
    parts = [safe_job(job)] + ([] if rank is None else [f"rank={_check_rank(rank)}"])
    return _join(prefix, *parts) + "/"


def _check_rank(rank: int) -> int:
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"rank must be an integer >= 0, got {rank!r}")
    return rank


def trace_key(prefix: str, job: str, rank: int, window_start_ns: int) -> str:
    """The object key of one window's file: ``{prefix}/{job}/rank={rank}/{start}.pftrace.gz``."""
    return job_prefix(prefix, job, rank) + window_label(window_start_ns) + SUFFIX


def parse_key(key: str) -> TraceRef | None:
    """Read job, rank and window start back from a trace key; None if it is not one."""
    parts = key.split("/")
    if len(parts) < 3:
        return None
    segment, rank_part, name = parts[-3:]
    rank_match = _RANK_RE.fullmatch(rank_part)
    window_match = _WINDOW_RE.fullmatch(name)
    job = _job_from_segment(segment)
    if rank_match is None or window_match is None or job is None:
        return None
    try:
        start_ns = _parse_window_label(window_match.group(1))
    except ValueError:
        return None
    start_ns += int(window_match.group(2) or 0)
    return TraceRef(job=job, rank=int(rank_match.group(1)), window_start_ns=start_ns, key=key)


# --------------------------------------------------------------------------- stores


@runtime_checkable
class TraceStore(Protocol):
    """Where trace files live; keys are full object keys, ``prefix`` starts every trace key."""

    prefix: str
    url: str

    def put(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key`` (replacing it); raises StoreError on failure."""
        ...

    def put_file(self, key: str, path: Path) -> None:
        """Store the file at ``path`` under ``key``, streaming it (never whole in memory)."""
        ...

    def list(self, prefix: str = "", *, start_after: str = "") -> list[ObjectInfo]:
        """Objects whose key starts with ``prefix`` (and sorts after ``start_after``), by key."""
        ...

    def get(self, key: str) -> bytes:
        """The bytes stored under ``key``; NotFoundError if absent, StoreError on failure."""
        ...

    def check(self) -> None:
        """Raise StoreError saying why the store cannot take files (missing bucket, denied)."""
        ...


class FileStore:
    """A local directory as a store: key ``a/b/c`` is the file ``{root}/a/b/c``."""

    def __init__(self, root: str | Path, prefix: str = ""):
        self.root = Path(root)
        self.prefix = prefix.strip("/")
        self.url = self.root.absolute().as_uri()

    def _path(self, key: str) -> Path:
        parts = key.split("/")
        if not key or any(p in ("", ".", "..") or "\\" in p or "\0" in p for p in parts):
            raise ValueError(f"invalid key {key!r}: empty, '.' or '..' segments are not allowed")
        return self.root.joinpath(*parts)

    def put(self, key: str, data: bytes) -> None:
        """Write the file through a temporary name and rename, so readers never see half a file."""
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            _write_atomic(path, data)
        except OSError as exc:
            raise StoreError(f"cannot write {path}: {exc}") from exc

    def put_file(self, key: str, path: Path) -> None:
        """Copy a file in through a temporary name and rename."""
        target = self._path(key)
        with open(path, "rb") as source:  # a missing source is the caller's, not the store's
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                _write_atomic(target, source)
            except OSError as exc:
                raise StoreError(f"cannot write {target}: {exc}") from exc

    def list(self, prefix: str = "", *, start_after: str = "") -> list[ObjectInfo]:
        """Walk only the directory the prefix names, skipping temporary (dot) files."""
        base_dir = prefix.rpartition("/")[0]
        top = self._path(base_dir) if base_dir else self.root
        found: list[ObjectInfo] = []
        try:
            for dirpath, dirnames, filenames in os.walk(top):
                dirnames[:] = [d for d in dirnames if not d.startswith(".")]
                rel_dir = Path(dirpath).relative_to(self.root).as_posix()
                for name in filenames:
                    if name.startswith("."):
                        continue
                    key = name if rel_dir == "." else f"{rel_dir}/{name}"
                    if not key.startswith(prefix) or key <= start_after:
                        continue
                    with contextlib.suppress(FileNotFoundError):
                        st = os.stat(os.path.join(dirpath, name))
                        found.append(ObjectInfo(key, st.st_size,
                                                datetime.fromtimestamp(st.st_mtime, UTC)))
        except OSError as exc:
            raise StoreError(f"cannot list {top}: {exc}") from exc
        return sorted(found, key=lambda info: info.key)

    def check(self) -> None:
        """The root directory exists (or can be made) and is writable."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create {self.root}: {exc}") from exc
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise StoreError(f"{self.root} is not writable")

    def get(self, key: str) -> bytes:
        """Read the whole file."""
        path = self._path(key)
        try:
            return path.read_bytes()
        except FileNotFoundError as exc:
            raise NotFoundError(f"no such trace: {key} (in {self.url})") from exc
        except OSError as exc:
            raise StoreError(f"cannot read {path}: {exc}") from exc

    def open_stream(self, key: str) -> tuple[BinaryIO, int]:
        """The file opened for reading, and its size: a caller streams it in chunks instead of
        holding it whole (the caller closes it). NotFoundError if absent."""
        path = self._path(key)
        try:
            handle = open(path, "rb")  # noqa: SIM115 - returned open, the caller closes it
        except (FileNotFoundError, IsADirectoryError) as exc:
            raise NotFoundError(f"no such trace: {key} (in {self.url})") from exc
        except OSError as exc:
            raise StoreError(f"cannot read {path}: {exc}") from exc
        try:
            return handle, os.fstat(handle.fileno()).st_size
        except OSError as exc:
            handle.close()
            raise StoreError(f"cannot read {path}: {exc}") from exc


class S3Store:
    """An S3 bucket through boto3; endpoint, credentials and region come from the AWS settings.

    Timeouts are short (connect 3 s, read 10 s) and botocore's own retries are off by default
    (``max_attempts=1``): the :class:`Uploader` retries with its own backoff and spool, and the
    CLI fails fast. With ``AWS_ENDPOINT_URL``/``AWS_ENDPOINT_URL_S3`` set (MinIO, Ceph, moto),
    path-style addressing is used; ``ARGUS_S3_ADDRESSING_STYLE`` (auto|path|virtual) overrides.
    """

    def __init__(self, bucket: str, prefix: str = "", *, client: Any = None,
                 max_attempts: int = 1, connect_timeout_s: float = S3_CONNECT_TIMEOUT_S,
                 read_timeout_s: float = S3_READ_TIMEOUT_S):
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.url = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self._client = client if client is not None else _s3_client(
            max_attempts, connect_timeout_s, read_timeout_s)

    def _fail(self, action: str, key: str, exc: Exception, *, of_key: bool = True) -> StoreError:
        """Turn a botocore exception into a StoreError with a message people can act on."""
        from botocore.exceptions import ClientError, NoCredentialsError

        where = f"s3://{self.bucket}/{key}" if key else self.url
        if isinstance(exc, NoCredentialsError):
            return StoreError(f"cannot {action} {where}: no AWS credentials (set "
                              "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)")
        if isinstance(exc, ClientError):
            error = exc.response.get("Error", {})
            code = error.get("Code", "?")
            if code in ("NoSuchKey", "404") and of_key:
                return NotFoundError(f"no such trace: {where}")
            if code == "NoSuchBucket":
                return StoreError(f"cannot {action} {where}: bucket {self.bucket!r} does not exist")
            return StoreError(f"cannot {action} {where}: {code}: {error.get('Message', exc)}")
        endpoint = getattr(self._client.meta, "endpoint_url", "?")
        return StoreError(f"cannot {action} {where} (endpoint {endpoint}): {exc}")

    def put(self, key: str, data: bytes) -> None:
        """One ``put_object``; any failure raises StoreError (the caller decides to retry)."""
        try:
            self._client.put_object(Bucket=self.bucket, Key=key, Body=data,
                                    ContentType=_content_type(key))
        except Exception as exc:  # botocore raises many unrelated types
            raise self._fail("write", key, exc) from exc

    def put_file(self, key: str, path: Path) -> None:
        """One ``put_object`` whose body is streamed from the file."""
        with open(path, "rb") as body:  # a missing source is the caller's, not the store's
            try:
                self._client.put_object(Bucket=self.bucket, Key=key, Body=body,
                                        ContentType=_content_type(key))
            except Exception as exc:
                raise self._fail("write", key, exc) from exc

    def list(self, prefix: str = "", *, start_after: str = "") -> list[ObjectInfo]:
        """``list_objects_v2`` over all pages; ``start_after`` skips keys server-side."""
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix}
        if start_after:
            kwargs["StartAfter"] = start_after
        found: list[ObjectInfo] = []
        try:
            for page in self._client.get_paginator("list_objects_v2").paginate(**kwargs):
                for item in page.get("Contents", ()):
                    modified = item["LastModified"]
                    found.append(ObjectInfo(item["Key"], int(item["Size"]),
                                            modified.astimezone(UTC)))
        except Exception as exc:
            raise self._fail("list", prefix, exc, of_key=False) from exc
        return found

    def check(self) -> None:
        """``head_bucket``: the bucket exists and these credentials may use it."""
        from botocore.exceptions import ClientError

        try:
            self._client.head_bucket(Bucket=self.bucket)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "?")
            if code in ("404", "NoSuchBucket"):
                raise StoreError(f"bucket {self.bucket!r} does not exist") from exc
            if code in ("403", "AccessDenied"):
                raise StoreError(f"access to bucket {self.bucket!r} denied") from exc
            raise self._fail("reach", "", exc, of_key=False) from exc
        except Exception as exc:
            raise self._fail("reach", "", exc, of_key=False) from exc

    def get(self, key: str) -> bytes:
        """``get_object`` and read the body."""
        try:
            return self._client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        except Exception as exc:
            raise self._fail("read", key, exc) from exc

    def open_stream(self, key: str) -> tuple[BinaryIO, int]:
        """``get_object``'s streaming body and its length: a caller reads it in chunks instead
        of holding it whole (and closes it, which frees the connection)."""
        try:
            answer = self._client.get_object(Bucket=self.bucket, Key=key)
        except Exception as exc:
            raise self._fail("read", key, exc) from exc
        return answer["Body"], int(answer["ContentLength"])

    def presigned_url(self, key: str, expires_s: int) -> str:
        """A URL that GETs ``key`` without credentials for ``expires_s`` seconds (signed here,
        no request is made: the key's existence is the caller's to check)."""
        try:
            return self._client.generate_presigned_url(
                "get_object", Params={"Bucket": self.bucket, "Key": key}, ExpiresIn=expires_s)
        except Exception as exc:
            raise self._fail("sign", key, exc) from exc


def _content_type(key: str) -> str:
    return "application/gzip" if key.endswith(".gz") else "application/octet-stream"


def _s3_client(max_attempts: int, connect_timeout_s: float, read_timeout_s: float) -> Any:
    """A boto3 S3 client with short timeouts and our retry policy, from the AWS settings."""
    import boto3
    from botocore.config import Config

    style = os.environ.get("ARGUS_S3_ADDRESSING_STYLE")
    if not style:
        custom = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        style = "path" if custom else "auto"
    if style not in ("auto", "path", "virtual"):
        raise ValueError(f"ARGUS_S3_ADDRESSING_STYLE must be auto, path or virtual, not {style!r}")
    config = Config(connect_timeout=connect_timeout_s, read_timeout=read_timeout_s,
                    retries={"total_max_attempts": max_attempts, "mode": "standard"},
                    s3={"addressing_style": style},
                    signature_version="s3v4")  # presigned URLs too (SigV2 is deprecated)
    return boto3.session.Session().client("s3", config=config)


def open_store(url: str, *, max_attempts: int = 1) -> TraceStore:
    """Open ``file:///dir`` or ``s3://bucket[/prefix]``; ValueError for anything else."""
    parsed = urlparse(url)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/"):
            raise ValueError(f"bad store URL {url!r}: a directory is file:///absolute/path")
        return FileStore(unquote(parsed.path))
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ValueError(f"bad store URL {url!r}: expected s3://bucket[/prefix]")
        return S3Store(parsed.netloc, unquote(parsed.path), max_attempts=max_attempts)
    hint = f"; for a directory use file://{os.path.abspath(url)}" if not parsed.scheme else ""
    raise ValueError(f"unsupported store URL {url!r}: use file:///dir or s3://bucket/prefix{hint}")


def default_store_url() -> str:
    """The store URL from ``ARGUS_STORE``, else :data:`DEFAULT_STORE_URL`."""
    return os.environ.get(STORE_ENV) or DEFAULT_STORE_URL


def find_traces(store: TraceStore, job: str, rank: int | None = None,
                since_ns: int | None = None) -> list[tuple[TraceRef, ObjectInfo]]:
    """Trace files of a job (one rank or all) whose window starts at or after ``since_ns``.

    Sorted oldest first (then by rank). With a rank, ``since`` becomes a server-side
    ``StartAfter``, so old windows are never listed.
    """
    prefix = job_prefix(store.prefix, job, rank)
    start_after = ""
    if since_ns is not None and rank is not None and since_ns > 0:
        # The label without its 'Z' sorts before every key of that second and after all earlier.
        start_after = prefix + window_label(min(since_ns, _MAX_WINDOW_NS - 1)).split(".")[0][:15]
    found = []
    for info in store.list(prefix, start_after=start_after):
        ref = parse_key(info.key)
        if ref is None or (since_ns is not None and ref.window_start_ns < since_ns):
            continue
        found.append((ref, info))
    found.sort(key=lambda pair: (pair[0].window_start_ns, pair[0].rank, pair[0].key))
    return found


# --------------------------------------------------------------------------- uploads


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


class _EveryFewSeconds:
    """Rate-limits a warning: logs at most once per interval, with the count it held back."""

    def __init__(self, interval_s: float = 30.0):
        self.interval_s = interval_s
        self._last = -float("inf")
        self._held = 0
        self._lock = threading.Lock()

    def warning(self, message: str, *args: object) -> None:
        """Log the warning now, or count it for the next one."""
        with self._lock:
            now = time.monotonic()
            if now - self._last < self.interval_s:
                self._held += 1
                return
            held, self._held, self._last = self._held, 0, now
        suffix = f" ({held} similar message(s) suppressed)" if held else ""
        log.warning(message + suffix, *args)


_SEQ_DIGITS = 20
_MAX_NAME = 240
_LOCK_NAME = ".lock"
_TMP_PREFIX = ".tmp-"


def _b64(key: str) -> str:
    return base64.urlsafe_b64encode(key.encode("utf-8")).decode("ascii").rstrip("=")


def _unb64(text: str) -> str:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode("utf-8")


def _write_atomic(path: Path, data: bytes | BinaryIO) -> None:
    """Write a temporary file next to ``path``, fsync it, and rename it into place.

    ``data`` is bytes, or a binary file object copied in pieces.
    """
    tmp = path.with_name(f"{_TMP_PREFIX}{path.name}.{os.getpid()}.{random.getrandbits(32):08x}")
    try:
        with open(tmp, "wb") as fh:
            if isinstance(data, bytes | bytearray | memoryview):
                fh.write(data)
            else:
                shutil.copyfileobj(data, fh, 1 << 20)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


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
        self._drop_log = _EveryFewSeconds()
        self._fail_log = _EveryFewSeconds()
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
        return self._place(seq, key, len(data), lambda target: _write_atomic(target, data))

    def _place(self, seq: int, key: str, size: int, put: Any) -> _Spooled:
        """Name a spool entry, write its key sidecar if needed, and ``put(path)`` its data."""
        name = f"{seq:0{_SEQ_DIGITS}d}-{_b64(key)}.spool"
        sidecar = None
        if len(name) > _MAX_NAME:
            name = f"{seq:0{_SEQ_DIGITS}d}.spool"
            sidecar = self.spool_dir / f"{seq:0{_SEQ_DIGITS}d}.key"
            _write_atomic(sidecar, key.encode("utf-8"))
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
            if path.name.startswith(_TMP_PREFIX):
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
