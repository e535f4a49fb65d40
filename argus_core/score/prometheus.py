"""A small client for Prometheus's HTTP query API: instant queries (and, on
victoria-metrics, series exported as CSV: ``export_columns``), each attempt bounded in time
and in size, retried with backoff, every failure raised as ``QueryError`` naming the query and
the cause, with a ``reason`` (the label the scorer counts it under).

Bounded whatever the server does:

- ``timeout_s`` is the deadline of a whole attempt (connect, send, the whole answer), enforced
  by a timer that shuts the socket down: an answer trickled a byte a second ends there.
- At most ``max_answer_bytes`` of an answer are read: a longer one (by its Content-Length, or
  by what arrives) is refused with an error naming the bound, and not fetched again.
- ``close`` ends the attempt in flight at once and refuses every later query (shutting down).

Answers are checked before use: a successful vector whose ``result`` is a list of series, each
``{"metric": {<name>: <text>, ...}, "value": [<time>, "<number>"]}``; anything else is
``BAD_ANSWER`` and not fetched again; so is an export that is not the CSV asked for. NaN and
+-Inf samples are left out (the series reads as not reported) and counted in
``nonfinite_samples``.
"""

from __future__ import annotations

import contextlib
import http.client
import math
import queue
import socket
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from typing import TypeVar

import numpy as np
import orjson

from argus_core.score.csv_columns import CsvColumns, CsvError, export_format
from argus_core.score.limits import DEFAULT_MAX_ANSWER_BYTES, DEFAULT_TIMEOUT_S
from argus_core.score.vector_columns import (
    DecodeError,
    VectorColumns,
    columns_from_result,
    decode_vector,
)

T = TypeVar("T")
A = TypeVar("A")  # what a streamed answer is read into

QUERY_PATH = "/api/v1/query"
EXPORT_PATH = "/api/v1/export/csv"  # victoria-metrics'
EXPORT_BLOCK_BYTES = 4 << 20  # of an export, read and decoded at a time

ERROR_TEXT_BYTES = 4096  # of a refusal's answer, read for its message

# Why a query failed: the ``reason`` of QueryError.
UNREACHABLE = "unreachable"  # no connection, or the connection ended before the answer did
HTTP_STATUS = "http_status"  # Prometheus refused the query (4xx, 5xx)
DEADLINE = "deadline"  # no whole answer within timeout_s
TOO_LARGE = "too_large"  # the answer is longer than max_answer_bytes
BAD_ANSWER = "bad_answer"  # not a successful vector answer of well-formed series
BAD_LABELS = "bad_labels"  # a label that must be an integer (a rank) is not
STOPPED = "stopped"  # the client was closed (shutting down)
QUERY_REASONS = (UNREACHABLE, HTTP_STATUS, DEADLINE, TOO_LARGE, BAD_ANSWER, BAD_LABELS,
                 STOPPED)
RETRIED = frozenset({UNREACHABLE, HTTP_STATUS, DEADLINE})  # may answer otherwise next time


class QueryError(RuntimeError):
    """Prometheus could not answer a query (down, slow, refused it, or answered what the
    scorer cannot read); ``reason`` is one of ``QUERY_REASONS``."""

    def __init__(self, message: str, reason: str = UNREACHABLE):
        super().__init__(message)
        self.reason = reason


def quote_label(value: str) -> str:
    """A PromQL string literal for a label value (escapes backslashes and quotes)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


SHOWN_QUERY_CHARS = 300  # of a query, in an error: a peer set's rank regex runs to 8 KB


def shown(expr: str) -> str:
    """A query as an error names it: quoted, cut after ``SHOWN_QUERY_CHARS`` characters
    (the length said), so that one failure is one readable log line."""
    if len(expr) <= SHOWN_QUERY_CHARS:
        return repr(expr)
    return f"{expr[:SHOWN_QUERY_CHARS]!r}... ({len(expr)} characters)"


def size_text(n: int) -> str:
    """``n`` bytes as a person reads a bound: whole MiB where it is one, else bytes."""
    return f"{n >> 20} MiB" if n and n % (1 << 20) == 0 else f"{n} bytes"


class PrometheusAPI:
    """Instant queries against ``url`` (``http://host:9090``, a path prefix is kept)."""

    def __init__(self, url: str, timeout_s: float = DEFAULT_TIMEOUT_S, attempts: int = 3,
                 backoff_s: float = 0.25, sleep: Callable[[float], object] | None = None,
                 max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES):
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"--prometheus {url!r}: expected http(s)://host:port")
        try:
            port = parsed.port
        except ValueError:
            raise ValueError(f"--prometheus {url!r}: the port is not a number") from None
        if not (math.isfinite(timeout_s) and timeout_s > 0):
            raise ValueError(f"--timeout {timeout_s}: expected a finite number of seconds > 0")
        if max_answer_bytes < 1:
            raise ValueError(f"max_answer_bytes {max_answer_bytes}: expected > 0")
        self.url = url.rstrip("/")
        self._https = parsed.scheme == "https"
        self._host = parsed.hostname
        self._port = port
        self._prefix = parsed.path.rstrip("/")
        self.timeout_s = timeout_s
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.max_answer_bytes = max_answer_bytes
        self._closing = threading.Event()
        self.sleep = sleep or self._closing.wait  # a wait that closing ends
        self._in_flight: socket.socket | None = None  # the socket of the attempt under way
        self.failures = 0  # failed attempts, retried or not
        self.series_fetched = 0
        self.decode_fallbacks = 0  # answers read as plain JSON: not in the columnar layout
        self.nonfinite_samples = 0  # NaN and +-Inf samples left out

    def query(self, expr: str) -> list[dict]:
        """The ``result`` list of an instant query (vector results), retried with backoff;
        series whose sample is not a finite number are left out (counted)."""
        result = self._retried(expr, lambda data: _result(expr, data))
        kept = [series for series in result if math.isfinite(float(series["value"][1]))]
        self.nonfinite_samples += len(result) - len(kept)
        self.series_fetched += len(kept)
        return kept

    def query_columns(self, expr: str, ints: tuple[str, ...] = (),
                      texts: tuple[str, ...] = (), finite_only: bool = True) -> VectorColumns:
        """The given labels (``ints`` as integers) and the sample values of every series of
        an instant query, decoded without a dict per series where the answer has
        Prometheus's layout; any other answer is read as JSON and counted in
        ``decode_fallbacks``. Series whose sample is not finite are left out (counted), or
        with ``finite_only=False`` kept for the caller to leave out and count. A label in
        ``ints`` that is not an integer: QueryError (``BAD_LABELS``)."""
        fell_back = False

        def read(data: bytes) -> VectorColumns:
            nonlocal fell_back
            columns, fell_back = read_columns(expr, data, ints, texts)
            return columns

        try:
            columns = self._retried(expr, read)
        except DecodeError as exc:  # the answer holds what the scorer cannot read: no retry
            raise QueryError(f"{shown(expr)}: {exc}", BAD_LABELS) from None
        self.decode_fallbacks += fell_back
        return self._kept(columns, finite_only)

    def _kept(self, columns: VectorColumns, finite_only: bool) -> VectorColumns:
        """The columns without non-finite samples (counted) with ``finite_only``; counted
        as fetched."""
        finite = np.isfinite(columns.values)
        if finite_only and not finite.all():
            self.nonfinite_samples += int(len(finite) - finite.sum())
            columns = columns.take(np.flatnonzero(finite))
        self.series_fetched += len(columns)
        return columns

    def export_columns(self, selector: str, lookback_s: float, ints: tuple[str, ...] = (),
                       texts: tuple[str, ...] = (), finite_only: bool = True) -> VectorColumns:
        """What ``query_columns(selector)`` gives, read through victoria-metrics'
        ``/api/v1/export/csv`` instead: each series' last sample of the last ``lookback_s``
        seconds, the series ordered by their labels. The answer is decoded a block at a time
        as it arrives (``CsvColumns``), so the engine writes while the scorer decodes and
        only a block of its bytes is held; ``max_answer_bytes`` bounds the whole. Not CSV of
        the fields asked for: QueryError (``BAD_ANSWER``, naming the row)."""
        params = {"match[]": selector, "format": export_format(ints, texts),
                  # relative: the engine's clock, whatever the scorer's says
                  "start": f"-{max(round(lookback_s * 1000), 1)}ms",
                  # samples as stored, unsorted, duplicates kept: a third of the engine's
                  # work (CsvColumns.latest sorts and keeps the last of each series)
                  "reduce_mem_usage": "1"}

        def stream(response: http.client.HTTPResponse) -> CsvColumns:
            columns = CsvColumns(ints, texts)
            left = self.max_answer_bytes
            blocks = read_ahead(response.read1, EXPORT_BLOCK_BYTES)
            with contextlib.closing(blocks):
                for block in blocks:
                    left -= len(block)
                    if left < 0:
                        raise QueryError(f"{shown(selector)}: the export is longer than the "
                                         f"scorer's bound of {size_text(self.max_answer_bytes)}"
                                         f" per answer (--max-answer-mb)", TOO_LARGE)
                    columns.feed(block)
            return columns

        def read(columns: CsvColumns) -> VectorColumns:
            return columns.latest()

        try:
            columns = self._retried(selector, read, EXPORT_PATH, params, stream)
        except CsvError as exc:  # not what was asked for: the same next time
            raise QueryError(f"{shown(selector)}: {exc}", BAD_ANSWER) from None
        except QueryError as exc:
            if exc.reason == HTTP_STATUS and ": HTTP 404: " in str(exc):
                raise QueryError(f"{exc} (--read export needs victoria-metrics' {EXPORT_PATH}; "
                                 f"other engines: --read query)", HTTP_STATUS) from None
            raise
        return self._kept(columns, finite_only)

    def close(self) -> None:
        """End the attempt in flight now and refuse every later query (shutting down); safe
        from any thread."""
        self._closing.set()
        sock = self._in_flight
        if sock is not None:
            _shut(sock)

    def _retried(self, expr: str, read: Callable[[A], T], path: str = QUERY_PATH,
                 params: dict[str, str] | None = None,
                 stream: Callable[[http.client.HTTPResponse], A] | None = None) -> T:
        """``read`` of the answer (its bytes, or what ``stream`` made of it), fetching again
        with backoff when the fetch fails in a way that may not last (``RETRIED``)."""
        delay = self.backoff_s
        for attempt in range(self.attempts):
            try:
                return read(self._fetch(expr, path, params, stream))
            except QueryError as exc:
                self.failures += 1
                if (exc.reason not in RETRIED or attempt == self.attempts - 1
                        or self._closing.is_set()):
                    raise
                self.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")

    def _fetch(self, expr: str, path: str = QUERY_PATH, params: dict[str, str] | None = None,
               stream: Callable[[http.client.HTTPResponse], A] | None = None) -> bytes | A:
        """One attempt: the answer's bytes (or what ``stream`` makes of a successful
        answer as it reads it), all within ``timeout_s`` and ``max_answer_bytes``. Without
        ``params``, the instant query ``expr``."""
        stopping = QueryError(f"{shown(expr)}: the scorer is stopping", STOPPED)
        if self._closing.is_set():
            raise stopping
        body = urllib.parse.urlencode(params if params is not None else {
            "query": expr, "timeout": f"{self.timeout_s:g}s"})
        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        conn = cls(self._host, self._port, timeout=self.timeout_s)
        expired = threading.Event()
        sockets: list[socket.socket] = []  # the connection drops its own on Connection: close

        def expire() -> None:
            expired.set()
            for sock in sockets:
                _shut(sock)

        timer = threading.Timer(self.timeout_s, expire)
        timer.daemon = True
        timer.start()
        response = None
        try:
            conn.connect()
            sockets.append(conn.sock)
            self._in_flight = conn.sock
            if expired.is_set() or self._closing.is_set():  # during the connect
                _shut(conn.sock)
            conn.request("POST", self._prefix + path, body=body.encode(), headers={
                "Content-Type": "application/x-www-form-urlencoded",
                "Accept-Encoding": "identity"})
            response = conn.getresponse()
            ok = 200 <= response.status < 300
            if ok and stream is not None:
                data = stream(response)
            else:
                data = self._read(expr, response, self.max_answer_bytes if ok
                                  else ERROR_TEXT_BYTES, refuse_longer=ok)
            short = ok and bool(response.length)  # bytes announced, never sent
        except (OSError, http.client.HTTPException) as exc:
            if expired.is_set():
                raise self._late(expr) from None
            if self._closing.is_set():
                raise stopping from None
            raise QueryError(f"{shown(expr)}: {str(exc) or type(exc).__name__}",
                             UNREACHABLE) from None
        finally:
            timer.cancel()
            self._in_flight = None
            for sock in sockets:  # a read still blocked on it (a read-ahead thread) returns
                _shut(sock)
            if response is not None:
                response.close()
            conn.close()
        if expired.is_set():  # the read ended early, at the shutdown
            raise self._late(expr)
        if self._closing.is_set():
            raise stopping
        if short:
            raise QueryError(f"{shown(expr)}: the answer ended {response.length} bytes short of "
                             f"its Content-Length", UNREACHABLE)
        if not ok:
            raise QueryError(f"{shown(expr)}: HTTP {response.status}: {_error_text(data)}",
                             HTTP_STATUS)
        return data

    def _late(self, expr: str) -> QueryError:
        return QueryError(f"{shown(expr)}: no whole answer within --timeout {self.timeout_s:g} s "
                          f"(the deadline of connecting, sending and the whole answer)",
                          DEADLINE)

    def _read(self, expr: str, response: http.client.HTTPResponse, limit: int,
              refuse_longer: bool) -> bytes:
        """At most ``limit`` bytes of the answer; with ``refuse_longer``, a longer answer is
        QueryError (``TOO_LARGE``), refused by its Content-Length before any is read."""
        bound = f"the scorer's bound of {size_text(limit)} per answer (--max-answer-mb)"
        announced = response.length  # None without a Content-Length (chunked, or to close)
        if refuse_longer and announced is not None and announced > limit:
            raise QueryError(f"{shown(expr)}: the answer is {announced} bytes, over {bound}",
                             TOO_LARGE)
        data = response.read(limit + 1 if refuse_longer else limit)
        if len(data) > limit:
            raise QueryError(f"{shown(expr)}: the answer is longer than {bound}", TOO_LARGE)
        return data


READ_AHEAD_BLOCKS = 2  # received and waiting to be decoded, at most
_POLL_S = 0.1  # how often a reader with a full queue checks whether it was let go


def read_ahead(read1: Callable[[int], bytes], size: int,
               depth: int = READ_AHEAD_BLOCKS) -> Iterator[bytes]:
    """An answer's bytes in blocks, until ``read1`` (what has arrived, up to n bytes; empty
    at the end) gives nothing, received on a thread of their own ahead of the caller (at most
    ``depth`` blocks waiting): the engine writes and the network delivers while the caller
    decodes. A block is what arrived while the caller was busy, up to ``size`` bytes: handed
    over as soon as the caller waits. What ``read1`` raises is raised to the caller; a
    caller that stops early lets the thread go at its next block (shutting the socket down
    ends a read in progress)."""
    blocks: queue.Queue[bytes | BaseException] = queue.Queue(depth)
    done = threading.Event()

    def put(item: bytes | BaseException) -> bool:
        while not done.is_set():
            try:
                blocks.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def receive() -> None:
        try:
            while True:
                block = bytearray()
                while len(block) < size and (part := read1(size - len(block))):
                    block += part
                    if blocks.empty():  # the caller waits: hand this over now
                        break
                if not put(bytes(block)) or not block:
                    return
        except BaseException as exc:  # the caller's to handle, on its own thread
            put(exc)

    threading.Thread(target=receive, name="argus-score-read-ahead", daemon=True).start()
    try:
        while True:
            item = blocks.get()
            if isinstance(item, BaseException):
                raise item
            if not item:
                return
            yield item
    finally:
        done.set()


def _shut(sock: socket.socket) -> None:
    """Shut a socket down (never close it: the fetching thread may be reading it), so that a
    read or write blocked on it returns."""
    with contextlib.suppress(OSError):  # already closed
        sock.shutdown(socket.SHUT_RDWR)


def read_columns(expr: str, data: bytes, ints: tuple[str, ...] = (),
                 texts: tuple[str, ...] = ()) -> tuple[VectorColumns, bool]:
    """The columns of an answer (``decode_vector``), or, where its layout is not
    Prometheus's, of its JSON (then the flag is True); QueryError if it is not a vector
    answer, DecodeError if an ``ints`` label is not an integer."""
    columns = decode_vector(data, ints, texts)
    if columns is not None:
        return columns, False
    return columns_from_result(_result(expr, data), ints, texts), True


def _result(expr: str, data: bytes) -> list[dict]:
    """The ``result`` list of a vector answer, every series checked (a dict of text labels
    and a ``[time, "number"]`` value); QueryError (``BAD_ANSWER``) if it is anything else,
    or Prometheus's own refusal of the query."""
    try:
        document = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise QueryError(f"{shown(expr)}: the answer is not JSON", BAD_ANSWER) from None
    if not isinstance(document, dict):
        raise QueryError(f"{shown(expr)}: the answer is a JSON {type(document).__name__}, not an "
                         f"object", BAD_ANSWER)
    if document.get("status") != "success":
        raise QueryError(f"{shown(expr)}: {str(document.get('error', 'query failed'))[:300]}",
                         BAD_ANSWER)
    payload = document.get("data")
    kind = payload.get("resultType") if isinstance(payload, dict) else None
    if kind != "vector":
        raise QueryError(f"{shown(expr)}: expected a vector, got {str(kind)[:40]}", BAD_ANSWER)
    result = payload.get("result")
    if not isinstance(result, list):
        raise QueryError(f"{shown(expr)}: the result is a JSON {type(result).__name__}, not a "
                         f"list", BAD_ANSWER)
    for i, series in enumerate(result):
        if not _well_formed(series):
            raise QueryError(f"{shown(expr)}: series {i} is not {{\"metric\": {{<labels>}}, "
                             f"\"value\": [<time>, \"<number>\"]}}", BAD_ANSWER)
    return result


def _well_formed(series: object) -> bool:
    """Whether a series is ``{"metric": {<name>: <text>}, "value": [<time>, "<number>"]}``
    (its number read by ``float``: NaN and +-Inf too)."""
    if not isinstance(series, dict):
        return False
    metric, value = series.get("metric"), series.get("value")
    if not isinstance(metric, dict) or not all(isinstance(v, str) for v in metric.values()):
        return False
    if not isinstance(value, list) or len(value) != 2 or not isinstance(value[1], str):
        return False
    try:
        float(value[1])
    except ValueError:
        return False
    return True


def _error_text(data: bytes) -> str:
    try:
        return str(orjson.loads(data).get("error", ""))[:300]
    except (orjson.JSONDecodeError, AttributeError):
        return data[:300].decode(errors="replace")
