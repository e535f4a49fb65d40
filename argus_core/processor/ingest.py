"""Request bodies to validated records: decompression with a size cap, NDJSON or JSON array.

Vector's ``http`` sink sends either newline-delimited JSON (``codec: json`` with newline
framing, or ``codec: native_json``) or one JSON array (``codec: json`` without framing), gzip
or zstd encoded. Every record is validated on its own: a bad one is rejected with its line (or
array item) and field, the others are kept.
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Callable, Set
from dataclasses import dataclass, field

import numpy as np
import orjson

from argus_core.processor.config import MAX_MEMBERS
from argus_core.schema import (
    KernelBatch,
    Record,
    SchemaError,
    StackRecord,
    StepRecord,
    parse_record,
)


class BodyError(Exception):
    """The body as a whole cannot be read; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class IngestResult:
    """Accepted records and, for the rest, where and why they were rejected."""

    records: list[Record] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # first MAX_ERRORS messages
    reasons: Counter = field(default_factory=Counter)  # rejected count by field
    refused: list[int] = field(default_factory=list)  # item numbers (1-based) rejected

    @property
    def rejected(self) -> int:
        """How many records were rejected."""
        return sum(self.reasons.values())


try:  # ISA-L inflates the same gzip ~1.5x faster than zlib
    from isal import isal_zlib as _zlib
except ImportError:  # pragma: no cover - depends on the environment
    _zlib = zlib

MAX_ERRORS = 20
_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


_FIRST_FEED = 1024  # compressed bytes given to a new gzip member at first (doubling after)
_MAX_FEED = 1 << 20


def decode_body(body: bytes, encoding: str | None, max_bytes: int,
                max_members: int = MAX_MEMBERS) -> bytes:
    """Undo Content-Encoding (gzip, zstd, identity; sniffed when unlabelled), at most
    ``max_bytes`` decompressed: a small compressed body cannot blow up memory.

    Linear in the body's size whatever its number of gzip members or zstd frames (each is
    read in place), and at most ``max_members`` of them.
    """
    encoding = (encoding or "").strip().lower()
    if encoding in ("gzip", "x-gzip") or (not encoding and body[:2] == _GZIP_MAGIC):
        return _inflate(body, max_bytes, max_members)
    if encoding == "zstd" or (not encoding and body[:4] == _ZSTD_MAGIC):
        return _unzstd(body, max_bytes, max_members)
    if encoding not in ("", "identity"):
        raise BodyError(415, f"unsupported Content-Encoding {encoding!r} (gzip, zstd, identity)")
    if len(body) > max_bytes:
        raise BodyError(413, f"body of {len(body)} bytes exceeds the limit of {max_bytes}")
    return body


def _too_big(max_bytes: int) -> BodyError:
    return BodyError(413, f"decompressed body exceeds the limit of {max_bytes} bytes")


def _too_many(max_members: int, what: str) -> BodyError:
    return BodyError(413, f"body holds more than {max_members} {what}")


def _members(body: bytes, max_bytes: int, max_members: int, what: str, member) -> bytes:
    """Decode a body of consecutive members (gzip members, zstd frames), each read in place.

    ``member(view, pos, room)`` decodes the member starting at ``pos`` into at most ``room``
    bytes and returns (its bytes, where the next member starts). At most ``max_members`` of
    them and ``max_bytes`` in all, else 413.
    """
    view = memoryview(body)
    parts: list[bytes] = []
    size = pos = count = 0
    while pos < len(view):
        count += 1
        if count > max_members:
            raise _too_many(max_members, what)
        data, pos = member(view, pos, max_bytes + 1 - size)
        size += len(data)
        if size > max_bytes:
            raise _too_big(max_bytes)
        if data:
            parts.append(data)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _inflate(body: bytes, max_bytes: int, max_members: int) -> bytes:
    """Inflate a gzip body of one or more members (``cat a.gz b.gz`` is valid gzip too)."""
    return _members(body, max_bytes, max_members, "gzip members", _gzip_member)


def _gzip_member(view: memoryview, pos: int, room: int) -> tuple[bytes, int]:
    """One gzip member, fed from the view in pieces that start small and double: what zlib
    copies back as ``unused_data`` at its end is at most about the member's own size, so the
    work stays linear in the body however many members it has."""
    inflater = _zlib.decompressobj(16 + zlib.MAX_WBITS)
    parts = []
    feed = _FIRST_FEED
    while True:
        piece = view[pos:pos + feed]
        try:
            part = inflater.decompress(piece, room)
        except _zlib.error as exc:
            raise BodyError(400, f"body is not valid gzip: {exc}") from None
        room -= len(part)
        parts.append(part)
        if room <= 0 or inflater.unconsumed_tail:
            return b"".join(parts), len(view)  # over the limit: the caller says 413
        if inflater.eof:
            return b"".join(parts), pos + len(piece) - len(inflater.unused_data)
        pos += len(piece)
        if pos >= len(view):
            raise BodyError(400, "body is not valid gzip: truncated")
        feed = min(feed * 2, _MAX_FEED)


def _zstd_module():
    try:
        from compression import zstd  # Python 3.14+
    except ImportError:
        from backports import zstd  # the same module before 3.14 (aiohttp uses it too)
    return zstd


def _unzstd(body: bytes, max_bytes: int, max_members: int) -> bytes:
    """Decompress every zstd frame of a body (a stream of several frames is valid zstd;
    skippable frames hold no data)."""
    zstd = _zstd_module()

    def frame(view: memoryview, pos: int, room: int) -> tuple[bytes, int]:
        try:
            length = zstd.get_frame_size(view[pos:])
            decompressor = zstd.ZstdDecompressor()
            data = decompressor.decompress(view[pos:pos + length], max_length=room)
        except zstd.ZstdError as exc:
            raise BodyError(400, f"body is not valid zstd: {exc}") from None
        if len(data) >= room or (not decompressor.needs_input and not decompressor.eof):
            return data, len(view)  # over the limit: the caller says 413
        if not decompressor.eof:
            raise BodyError(400, "body is not valid zstd: truncated frame")
        return data, pos + length

    return _members(body, max_bytes, max_members, "zstd frames", frame)


@dataclass(frozen=True)
class ClockBounds:
    """Record times must lie within ``max_age_ns`` before and ``max_skew_ns`` after ``now_ns``
    (the processor's clock): a kernel stamped an hour ahead (a clock glitch) is refused, naming
    the field, instead of silencing its rank."""

    now_ns: int
    max_skew_ns: int
    max_age_ns: int

    def check(self, record: Record) -> None:
        """Raise SchemaError naming the first time outside the bounds."""
        if isinstance(record, KernelBatch):
            if len(record.start_ns) == 0:
                return
            self._check_times(record.start_ns, "start_ns")
        elif isinstance(record, StepRecord | StackRecord):
            self._check_times(np.array([record.t_ns], dtype=np.int64), "t_ns", scalar=True)

    def _check_times(self, times: np.ndarray, name: str, scalar: bool = False) -> None:
        latest, earliest = self.now_ns + self.max_skew_ns, self.now_ns - self.max_age_ns
        for bad, limit, words in ((times > latest, self.max_skew_ns, "ahead of"),
                                  (times < earliest, self.max_age_ns, "behind")):
            if not bad.any():
                continue
            i = int(np.argmax(bad))
            off = abs(int(times[i]) - self.now_ns) / 1e9
            where = name if scalar else f"{name}[{i}]"
            raise SchemaError(where, f"{off:.0f} s {words} the processor's clock (more than "
                                     f"{limit / 1e9:.0f} s; check the host's clock)")


def parse_body(data: bytes, *, check: Callable[[Record], None] | None = None,
               skip: Set[int] = frozenset()) -> IngestResult:
    """Validate every record of an NDJSON or JSON-array body.

    ``check`` is a further test of each valid record (it raises SchemaError to refuse one);
    items whose number is in ``skip`` are passed over unread (a log replay leaves out what
    was refused when the body first came in).
    """
    result = IngestResult()
    stripped = data.lstrip()
    if stripped[:1] == b"[":
        try:
            items = orjson.loads(stripped)
        except orjson.JSONDecodeError as exc:
            _reject(result, 1, "body", "json", f"malformed JSON array: {exc}")
            return result
        if not isinstance(items, list):
            _reject(result, 1, "body", "json", "expected a JSON array of records")
            return result
        bools = _bool_tokens(stripped)
        for number, item in enumerate(items, start=1):
            if number not in skip:
                _accept(result, number, f"item {number}", item, check, bools)
        return result
    for number, line in enumerate(data.split(b"\n"), start=1):
        if number in skip or not line.strip():
            continue
        try:
            item = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            _reject(result, number, f"line {number}", "json", f"malformed JSON: {exc}")
            continue
        _accept(result, number, f"line {number}", item, check, _bool_tokens(line))
    return result


def _bool_tokens(text: bytes) -> bool:
    """Whether JSON ``text`` may hold a ``true`` or ``false`` (two byte scans, far cheaper than
    checking the type of every kernel value; a name containing the word only costs speed)."""
    return b"true" in text or b"false" in text


def _accept(result: IngestResult, number: int, where: str, item: object,
            check: Callable[[Record], None] | None, bools: bool = True) -> None:
    try:
        record = parse_record(item, may_hold_bools=bools)
        if check is not None:
            check(record)
    except SchemaError as exc:
        _reject(result, number, where, exc.field, exc.message)
        return
    result.records.append(record)


def _reject(result: IngestResult, number: int, where: str, field_name: str,
            message: str) -> None:
    result.refused.append(number)
    result.reasons[field_name.split("[")[0].split(".")[0]] += 1
    if len(result.errors) < MAX_ERRORS:
        result.errors.append(f"{where}: {field_name}: {message}")
