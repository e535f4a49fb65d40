"""Trace object keys: the layout ``{prefix}/{safe_job(job)}/rank={rank}/{window}.pftrace.gz``,
its encoding of job names and window starts, and parsing keys back (the contract with
``argus traces`` and anyone browsing the bucket; see the package docstring)."""

from __future__ import annotations

import calendar
import hashlib
import logging
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import unquote_to_bytes

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
MAX_WINDOW_NS = (calendar.timegm((9999, 12, 31, 23, 59, 59)) + 1) * 1_000_000_000  # year 10000


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
    if not 0 <= window_start_ns < MAX_WINDOW_NS:
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


