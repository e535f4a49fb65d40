"""A small client for Prometheus's HTTP query API: instant queries, bounded in time, retried
with backoff, every failure raised as ``QueryError`` naming the query and the cause."""

from __future__ import annotations

import http.client
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import TypeVar

import orjson

from argus_core.score.vector_columns import (
    DecodeError,
    VectorColumns,
    columns_from_result,
    decode_vector,
)

T = TypeVar("T")


class QueryError(RuntimeError):
    """Prometheus could not answer a query (down, slow, or it refused the query)."""


def quote_label(value: str) -> str:
    """A PromQL string literal for a label value (escapes backslashes and quotes)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


class PrometheusAPI:
    """Instant queries against ``url`` (``http://host:9090``, a path prefix is kept)."""

    def __init__(self, url: str, timeout_s: float = 30.0, attempts: int = 3,
                 backoff_s: float = 0.25, sleep: Callable[[float], None] = time.sleep):
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"--prometheus {url!r}: expected http(s)://host:port")
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.sleep = sleep
        self.failures = 0  # failed attempts, retried or not
        self.series_fetched = 0
        self.decode_fallbacks = 0  # answers read as plain JSON: not in the columnar layout

    def query(self, expr: str) -> list[dict]:
        """The ``result`` list of an instant query (vector results), retried with backoff."""
        result = self._retried(expr, lambda data: _result(expr, data))
        self.series_fetched += len(result)
        return result

    def query_columns(self, expr: str, ints: tuple[str, ...] = (),
                      texts: tuple[str, ...] = ()) -> VectorColumns:
        """The given labels (``ints`` as integers) and the sample values of every series of
        an instant query, decoded without a dict per series where the answer has
        Prometheus's layout; any other answer is read as JSON and counted in
        ``decode_fallbacks``. A label in ``ints`` that is not an integer: QueryError."""
        fell_back = False

        def read(data: bytes) -> VectorColumns:
            nonlocal fell_back
            columns, fell_back = read_columns(expr, data, ints, texts)
            return columns

        try:
            columns = self._retried(expr, read)
        except DecodeError as exc:  # the answer holds what the scorer cannot read: no retry
            raise QueryError(f"{expr!r}: {exc}") from None
        self.decode_fallbacks += fell_back
        self.series_fetched += len(columns)
        return columns

    def _retried(self, expr: str, read: Callable[[bytes], T]) -> T:
        """``read`` of the answer's bytes, fetching again with backoff when the fetch or the
        read fails with QueryError."""
        delay = self.backoff_s
        for attempt in range(self.attempts):
            try:
                return read(self._fetch(expr))
            except QueryError:
                self.failures += 1
                if attempt == self.attempts - 1:
                    raise
                self.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")

    def _fetch(self, expr: str) -> bytes:
        body = urllib.parse.urlencode({"query": expr, "timeout": f"{self.timeout_s:g}s"})
        request = urllib.request.Request(
            f"{self.url}/api/v1/query", data=body.encode(),
            headers={"Content-Type": "application/x-www-form-urlencoded",
                     "Accept-Encoding": "identity"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                data = response.read()
        except urllib.error.HTTPError as exc:
            detail = _error_text(exc.read())
            raise QueryError(f"{expr!r}: HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            reason = getattr(exc, "reason", exc)
            raise QueryError(f"{expr!r}: {reason}") from None
        return data


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
    """The ``result`` list of a vector answer; QueryError if it is anything else."""
    try:
        document = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise QueryError(f"{expr!r}: the answer is not JSON") from None
    if document.get("status") != "success":
        raise QueryError(f"{expr!r}: {document.get('error', 'query failed')}")
    payload = document.get("data", {})
    if payload.get("resultType") != "vector":
        raise QueryError(f"{expr!r}: expected a vector, got {payload.get('resultType')}")
    return payload["result"]


def _error_text(data: bytes) -> str:
    try:
        return str(orjson.loads(data).get("error", ""))[:300]
    except (orjson.JSONDecodeError, AttributeError):
        return data[:300].decode(errors="replace")
