"""``http(s)://host:port/path``: gzip NDJSON POSTs to Vector's ``http_server`` source or the
processor, made on the shipper's thread (never the training thread).

Toward a busy receiver it behaves like Vector's own ``http`` sink: a 429 or 503 is retried
after the ``Retry-After`` the receiver asked for (delta-seconds or an HTTP-date) or, without
one, after an exponential backoff. The waits of one batch are bounded by ``http_retry_s``
(``ARGUS_HTTP_RETRY_S``): a wait that would overrun the budget is not started. Every retry is
counted (``argus_exporter_http_retries_total{status}``); a batch still refused at the end is
reported as failed with ``failure_reason = "receiver_busy"``, which the shipper counts as
dropped. A receiver that is restarting (the connection refused, or closed before an answer:
the processor killed and started again) is retried the same way, with backoff within the same
budget (``status="connection"``), and a kept-alive connection found dead is replaced at once,
so a restart costs no batch; still unreachable at the end, the batch is a ``sink_error``. Other
answers are not retried: a 2xx is delivered; a 4xx, a 5xx other than 503 or a timeout (the
receiver may be working on it) costs at most one ``http_timeout_s`` and is a ``sink_error``;
what the receiver said about a refused batch goes to the log (once a minute per answer).

Every post is bounded whatever the receiver does: ``http_timeout_s`` is the deadline of the
whole post (connect, send, answer), enforced by a timer that shuts the socket down (a
receiver trickling its answer a byte a second gets no longer than that), and at most
``MAX_ANSWER_BYTES`` of an answer are read (a connection whose answer was longer is not kept).
``stop_waiting`` and ``shutdown`` end a wait and a post in flight at once; the connection is
closed only by the thread that uses it.
While the shipper's thread waits, the training thread keeps submitting into the shipper's
bounded queue, which drops its oldest lines (counted) when full.
"""

from __future__ import annotations

import contextlib
import email.utils
import gzip
import http.client
import logging
import os
import socket
import threading
import time
from datetime import UTC, datetime
from urllib.parse import urlparse

from argus_exporters.config import ConfigError, Settings
from argus_exporters.health import Health
from argus_exporters.identity import RankIdentity

RETRIED_STATUSES = (429, 503)
NO_CONNECTION = "connection"  # the retry label of a receiver that could not be reached
_ANSWER_LOGGED_CHARS = 500  # of a refusal's body, in the training log
MAX_ANSWER_BYTES = 4096  # of any answer, read; the rest is never read
_ANSWER_LOG_EVERY_S = 60.0  # the same refusal is logged again at most this often (its own
# limit: argus_exporters imports nothing of argus_core, whose processor.logs.RateLimit this is)

logger = logging.getLogger("argus_exporters")
_BACKOFF_FIRST_S = 0.5  # without Retry-After: 0.5, 1, 2, 4, 8, 8... seconds
_BACKOFF_MAX_S = 8.0
_MIN_WAIT_S = 0.1  # "Retry-After: 0" still waits a little, so retries stay bounded


def retry_after_seconds(value: str | None) -> float | None:
    """Seconds a ``Retry-After`` header asks to wait (RFC 9110: delta-seconds or an HTTP-date,
    0 for a date already past); None when absent or unreadable."""
    value = (value or "").strip()
    if not value:
        return None
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


class HttpSink:
    """POSTs batches as ``application/x-ndjson`` with ``Content-Encoding: gzip``."""

    def __init__(self, settings: Settings, identity: RankIdentity, health: Health):
        url = urlparse(settings.sink)
        if not url.hostname:
            raise ConfigError(f"ARGUS_SINK={settings.sink!r}: missing host")
        self.https = url.scheme == "https"
        self.host = url.hostname
        self.port = url.port or (443 if self.https else 80)
        self.path = (url.path or "/") + (f"?{url.query}" if url.query else "")
        self.timeout = settings.http_timeout_s
        self.retry_budget_s = settings.http_retry_s
        self.health = health
        self.headers = {"Content-Type": "application/x-ndjson", "Content-Encoding": "gzip",
                        "User-Agent": "argus-exporters/0.1"}
        token = os.environ.get("ARGUS_SINK_TOKEN")
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        self.failure_reason: str | None = None  # why the last failed batch failed
        self._last_refusal: tuple[str, float] = ("", 0.0)  # (what was logged, when)
        self._conn: http.client.HTTPConnection | None = None
        self._closing = threading.Event()
        self._lock = threading.Lock()  # guards the post in flight (its socket, abort state)
        self._posting = False
        self._aborted = False

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
            self._conn = cls(self.host, self.port, timeout=self.timeout)
        return self._conn

    def _reset(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _post(self, body: bytes) -> tuple[int | str | None, str | None]:
        """One attempt, within the deadline: (status, Retry-After header); ``NO_CONNECTION``
        when the receiver could not be reached or closed the connection before answering,
        None on a timeout or an abort (the connection is then opened afresh next time)."""
        reused = self._conn is not None
        with self._lock:
            if self._closing.is_set():
                return NO_CONNECTION, None
            self._posting, self._aborted = True, False
        timer = threading.Timer(self.timeout, self._abort)
        timer.daemon = True
        timer.start()
        try:
            conn = self._connection()
            conn.request("POST", self.path, body=body, headers=self.headers)
            response = conn.getresponse()
            answer = response.read(MAX_ANSWER_BYTES)
            if not response.isclosed():  # more than we read: never reuse this connection
                self._reset()
            if response.status >= 400 and response.status not in RETRIED_STATUSES:
                self._log_refusal(response.status, answer)
            return response.status, response.getheader("Retry-After")
        except TimeoutError:
            self._reset()
            return None, None
        except (OSError, http.client.HTTPException):
            self._reset()
            if self._aborted:  # the deadline passed, or shutting down
                return None, None
            if reused and not self._closing.is_set():  # a kept-alive connection gone stale
                timer.cancel()
                with self._lock:
                    self._posting = False
                return self._post(body)
            return NO_CONNECTION, None
        finally:
            timer.cancel()
            with self._lock:
                self._posting = False

    def _abort(self) -> None:
        """End the post in flight now: shut its socket down (never close it: the posting
        thread may be reading it), so the posting thread's read returns."""
        with self._lock:
            if not self._posting:
                return
            self._aborted = True
            sock = getattr(self._conn, "sock", None) if self._conn is not None else None
        if sock is not None:
            with contextlib.suppress(OSError):  # already closed
                sock.shutdown(socket.SHUT_RDWR)

    def _log_refusal(self, status: int, answer: bytes) -> None:
        """Say in the training log what the receiver answered to a refused batch (the
        processor names the field: a clock hours off, a name too long), once per minute."""
        said = answer[:_ANSWER_LOGGED_CHARS].decode("utf-8", "replace").strip()
        message = f"HTTP {status} from {self.host}:{self.port}{self.path}: {said}"
        last, when = self._last_refusal
        now = time.monotonic()
        if message != last or now - when >= _ANSWER_LOG_EVERY_S:
            self._last_refusal = (message, now)
            logger.warning("argus: the receiver refused a batch: %s", message)

    def export(self, lines: list[bytes]) -> bool:
        """Send one batch, retrying a busy or restarting receiver within the budget; True once
        delivered."""
        body = gzip.compress(b"".join(lines), compresslevel=1)
        self.failure_reason = None
        waited = 0.0
        retries = 0
        while True:
            status, retry_after = self._post(body)
            if isinstance(status, int) and 200 <= status < 300:
                return True
            if status != NO_CONNECTION and status not in RETRIED_STATUSES:
                self.failure_reason = "sink_error"
                return False
            failure = "sink_error" if status == NO_CONNECTION else "receiver_busy"
            asked = retry_after_seconds(retry_after)
            wait = max(_MIN_WAIT_S, asked if asked is not None
                       else min(_BACKOFF_FIRST_S * 2**retries, _BACKOFF_MAX_S))
            if waited + wait > self.retry_budget_s or self._closing.is_set():
                self.failure_reason = failure
                return False
            self.health.http_retry(status)
            if self._closing.wait(wait):  # shutting down: stop waiting, count the batch
                self.failure_reason = failure
                return False
            waited += wait
            retries += 1

    def force_flush(self, timeout: float) -> bool:
        """Nothing is buffered here."""
        return True

    def stop_waiting(self) -> None:
        """End any retry wait and any post in flight now, and retry no more (shutting
        down); safe from any thread."""
        self._closing.set()
        self._abort()

    def shutdown(self) -> None:
        """End any retry wait and post in flight; close the connection unless a post still
        uses it (its thread closes it)."""
        self.stop_waiting()
        with self._lock:
            idle = not self._posting
        if idle:
            self._reset()
