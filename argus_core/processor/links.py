"""Perfetto one click away: find the trace file of a rank at a time, and hand it to a browser.

Grafana's data links (and ``argus traces open``) name a job, a rank and a time; these routes of
the processor find that window's file in the trace store and answer with it:

- ``GET /v1/traces/open?job=J&rank=R&at=T``: a redirect to a presigned S3 URL valid for
  ``ARGUS_TRACE_LINK_EXPIRES_S`` seconds (default 900), or the file itself for a file store.
- ``GET /v1/traces/perfetto?job=J&rank=R&at=T``: a redirect that opens the same file in the
  Perfetto UI (``https://ui.perfetto.dev/#!/?url=...``, or ``ARGUS_PERFETTO_UI``). The UI
  fetches the file from the browser: the bucket (or this processor) must allow that origin
  (CORS, see docs/dashboards.md), and be reachable by HTTPS (or on localhost). For a file store the
  URL is this processor's ``/v1/traces/file/KEY`` under ``ARGUS_PUBLIC_URL`` when set, else
  under the local address the request's connection reached (never the ``Host`` header, which
  the client chooses).
- ``GET /v1/traces/file/KEY``: one trace file by key, with the CORS header for the Perfetto UI
  (what the Perfetto link points at when the store is a directory).

The window is the newest one starting at or before T, if it started less than
:data:`LOOKBACK_S` before T: a point on a kernel-summary panel shows the last *closed* window,
and a click on a live panel lands in a window not written yet, so "the newest at or before"
finds the file behind the point in both cases. ``at`` is ISO-8601 (UTC if no zone) or Unix
time in milliseconds (Grafana's ``${__value.time}``) or seconds, within the years 1970-9999.
Because every click resolves afresh, a dashboard's link never expires; only the presigned URL
it redirects to does.

Every bad input is a 400 whose JSON ``error`` says what is wrong (a well-formed key or window
that is not there is a 404); keys are checked against the store's layout before the store is
touched. With a read token, every route needs it (``Authorization: Bearer T`` or ``?token=T``,
for Grafana links that cannot send headers); ``/file`` also takes the signed, expiring
``exp``/``sig`` pair the Perfetto redirect of a file store carries, because the Perfetto UI
fetches by URL alone. Files are streamed in :data:`CHUNK_BYTES` chunks read off the event loop,
at most ``max_downloads`` at once (503 with Retry-After beyond), and a client that takes no
chunk for ``write_timeout_s`` is cut off, so slow or stalled readers bound memory and slots.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import io
import logging
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, BinaryIO
from urllib.parse import quote, urlsplit

from aiohttp import web

from argus_core.processor.store import (
    NotFoundError,
    StoreError,
    TraceRef,
    TraceStore,
    find_traces,
    parse_key,
)
from argus_core.timeparse import parse_instant

log = logging.getLogger(__name__)

PERFETTO_UI_ENV = "ARGUS_PERFETTO_UI"
EXPIRES_ENV = "ARGUS_TRACE_LINK_EXPIRES_S"
PUBLIC_URL_ENV = "ARGUS_PUBLIC_URL"
DEFAULT_PERFETTO_UI = "https://ui.perfetto.dev"
DEFAULT_EXPIRES_S = 900
MAX_EXPIRES_S = 7 * 86_400  # the longest S3 honours (SigV4)
LOOKBACK_S = 600
"""A window that started longer than this before the requested time is not "the one at T"."""
FILE_ROUTE = "/v1/traces/file/"
MAX_RANK = 2**31 - 1
MAX_JOB_CHARS = 1024
DEFAULT_MAX_DOWNLOADS = 8
DEFAULT_WRITE_TIMEOUT_S = 30.0
CHUNK_BYTES = 256 * 1024
RETRY_AFTER_S = 5
_RANK_TEXT = re.compile(r"[0-9]{1,10}")
_EXPIRY_TEXT = re.compile(r"[0-9]{1,12}")
_SIGNATURE_TEXT = re.compile(r"[0-9a-f]{64}")
_SIGNING_CONTEXT = b"argus trace file link v1"


class LinkError(Exception):
    """A request the caller can fix (4xx), a trace that is not there (404), or a refusal."""

    def __init__(self, status: int, message: str, headers: Mapping[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = dict(headers or {})


# -- what a link asks for --------------------------------------------------------------------------
def _shown(text: str, limit: int = 40) -> str:
    """``repr(text)``, cut to ``limit`` characters so a huge argument never fills an answer."""
    shown = repr(text)
    return shown if len(shown) <= limit else shown[:limit - 4] + "...'"


def parse_at(text: str) -> int:
    """Nanoseconds since the epoch of ``at`` (:func:`argus_core.timeparse.parse_instant`);
    LinkError(400) naming the argument for text that is no time."""
    try:
        return parse_instant(text)
    except ValueError as exc:
        raise LinkError(400, f"at={_shown(text)}: {exc}") from None


def parse_link_query(query: Mapping[str, str]) -> tuple[str, int, int]:
    """(job, rank, at in ns) of a link's query; LinkError(400) naming the first bad argument.

    A rank is ASCII digits up to :data:`MAX_RANK` (``str.isdigit`` would take ``²``), a job is
    non-empty and at most :data:`MAX_JOB_CHARS` characters.
    """
    job = query.get("job", "")
    rank = query.get("rank", "")
    at = query.get("at", "")
    if not job:
        raise LinkError(400, "job is missing (?job=J&rank=R&at=T)")
    if len(job) > MAX_JOB_CHARS:
        raise LinkError(400, f"job is {len(job)} characters long: at most {MAX_JOB_CHARS}")
    if not _RANK_TEXT.fullmatch(rank) or int(rank) > MAX_RANK:
        raise LinkError(400, f"rank={_shown(rank)}: an integer from 0 to {MAX_RANK} "
                             "(ASCII digits) is needed")
    if not at:
        raise LinkError(400, "at is missing: ISO-8601 or Unix milliseconds")
    return job, int(rank), parse_at(at)


def check_file_key(store: TraceStore, key: str) -> TraceRef:
    """The trace a ``/file`` key names, if it has the store's layout exactly
    (``{prefix}/JOB/rank=R/LABEL.pftrace.gz``, no other segments): LinkError(400) otherwise,
    so no path trick (``..``, empty or foreign segments) ever reaches the store."""
    prefix_parts = store.prefix.split("/") if store.prefix else []
    parts = key.split("/")
    ref = parse_key(key)
    if ref is None or parts[:-3] != prefix_parts or len(parts) != len(prefix_parts) + 3:
        layout = "/".join([*prefix_parts, "JOB", "rank=R", "YYYYMMDDTHHMMSSZ.pftrace.gz"])
        raise LinkError(400, f"{_shown(key, 80)} is not a trace key of {store.url} "
                             f"(expected {layout})")
    return ref


def perfetto_ui_url(trace_url: str, ui: str | None = None) -> str:
    """The Perfetto UI link that opens ``trace_url`` (fully percent-encoded into ``url=``)."""
    base = (ui or os.environ.get(PERFETTO_UI_ENV) or DEFAULT_PERFETTO_UI).rstrip("/")
    return f"{base}/#!/?url={quote(trace_url, safe='')}"


def find_window(store: TraceStore, job: str, rank: int, at_ns: int,
                lookback_s: float = LOOKBACK_S) -> TraceRef:
    """The stored window of (job, rank) holding ``at_ns``: the newest starting at or before it,
    within ``lookback_s``. Raises LinkError(404) naming what is there instead."""
    since_ns = max(at_ns - int(lookback_s * 1e9), 0)
    found = [ref for ref, _ in find_traces(store, job, rank, since_ns)
             if ref.window_start_ns <= at_ns]
    if found:
        return found[-1]
    raise LinkError(404, f"no trace of job {job!r} rank {rank} starts in the "
                         f"{lookback_s:g} s before {_iso(at_ns)} in {store.url}")


def presigned_url(store: TraceStore, key: str, expires_s: int) -> str | None:
    """A time-limited URL that GETs ``key`` with no credentials; None for a file store."""
    presign = getattr(store, "presigned_url", None)
    return None if presign is None else presign(key, expires_s)


def _iso(ns: int) -> str:
    """``ns`` as ISO-8601 UTC with microseconds (exact), or plain ns outside years 1-9999."""
    try:
        moment = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=ns // 1000)
        return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    except OverflowError:
        return f"{ns} ns since the epoch"


# -- who may read ----------------------------------------------------------------------------------
def secret_equal(given: str, expected: str) -> bool:
    """Constant-time comparison of two strings of any characters (compare_digest on bytes)."""
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"),
                               expected.encode("utf-8", "surrogatepass"))


def sign_file_key(read_token: str, key: str, expires_at: int) -> str:
    """The ``sig`` of a signed ``/file`` link: hex HMAC-SHA256 of the key and its expiry (Unix
    seconds) under a key derived from the read token, so a link opens one file until then and
    reveals nothing about the token."""
    signing_key = hmac.new(read_token.encode("utf-8", "surrogatepass"), _SIGNING_CONTEXT,
                           hashlib.sha256).digest()
    message = f"{key}\n{expires_at}".encode("utf-8", "surrogatepass")
    return hmac.new(signing_key, message, hashlib.sha256).hexdigest()


def signed_file_path(read_token: str, key: str, expires_at: int) -> str:
    """``/v1/traces/file/KEY?exp=E&sig=S``: what the Perfetto UI may fetch without a token."""
    signature = sign_file_key(read_token, key, expires_at)
    return f"{FILE_ROUTE}{quote(key, safe='/=')}?exp={expires_at}&sig={signature}"


def bearer(header: str) -> str | None:
    """The credentials of an ``Authorization: Bearer X`` header (scheme case-insensitive)."""
    scheme, _, credentials = header.strip().partition(" ")
    return credentials.strip() if scheme.lower() == "bearer" else None


def authorize(request: web.Request, read_token: str | None, key: str | None = None,
              now: Callable[[], float] = time.time) -> None:
    """Let the request through, or raise LinkError: 401 without the read token, 403 for a
    signed ``/file`` link (``key`` given) that is expired, tampered with or for another key.

    Without a read token every request passes and ``token``/``exp``/``sig`` are ignored, so a
    dashboard link carrying an empty ``&token=`` keeps working.
    """
    if read_token is None:
        return
    given = bearer(request.headers.get("Authorization", ""))
    if given is None:
        given = request.query.get("token")
    if given is not None and secret_equal(given, read_token):
        return
    if key is not None and ("sig" in request.query or "exp" in request.query):
        _check_signature(request.query, read_token, key, now())
        return
    raise LinkError(401, "missing or wrong read token: send Authorization: Bearer TOKEN "
                         "or ?token=TOKEN", {"WWW-Authenticate": 'Bearer realm="argus traces"'})


def _check_signature(query: Mapping[str, str], read_token: str, key: str, now_s: float) -> None:
    """A signed link's ``exp`` is in the future and its ``sig`` is this key's (LinkError 403)."""
    expiry = query.get("exp", "")
    signature = query.get("sig", "")
    if not _EXPIRY_TEXT.fullmatch(expiry) or not _SIGNATURE_TEXT.fullmatch(signature):
        raise LinkError(403, "malformed signed link: exp (Unix seconds) and sig (64 hex "
                             "digits) are needed")
    if not secret_equal(signature, sign_file_key(read_token, key, int(expiry))):
        raise LinkError(403, "the link's signature does not match this key and expiry")
    if int(expiry) < now_s:
        raise LinkError(403, f"the link expired at {_iso(int(expiry) * 1_000_000_000)}: "
                             "follow the dashboard's link again")


# -- HTTP ------------------------------------------------------------------------------------------
class DownloadSlots:
    """At most ``limit`` trace files streaming at once (the event loop is one thread: no lock)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.active = 0

    def take(self) -> bool:
        """Take a slot if one is free; False when ``limit`` downloads are in progress."""
        if self.active >= self.limit:
            return False
        self.active += 1
        return True

    def give_back(self) -> None:
        """Free a slot taken with :meth:`take`."""
        self.active -= 1


@dataclass(frozen=True)
class LinkSettings:
    """What the routes need: the store, link lifetime, Perfetto UI, access and download limits."""

    store: TraceStore
    expires_s: int
    perfetto_ui: str
    public_url: str | None  # this processor as browsers reach it (else the connection's address)
    read_token: str | None
    downloads: DownloadSlots
    write_timeout_s: float


SETTINGS_KEY = web.AppKey("trace_links", LinkSettings)


def add_routes(app: web.Application, store: TraceStore, *, read_token: str | None = None,
               max_downloads: int = DEFAULT_MAX_DOWNLOADS,
               write_timeout_s: float = DEFAULT_WRITE_TIMEOUT_S) -> None:
    """Serve the trace links of ``store`` from ``app``.

    ``read_token`` (None or empty: open to anyone reaching the port) protects every route;
    ``max_downloads`` caps concurrent file downloads; a download is cut off when the client
    takes no chunk for ``write_timeout_s``. Link lifetime, Perfetto UI and public URL come from
    the environment (ValueError naming the variable when one is malformed).
    """
    if max_downloads < 1:
        raise ValueError(f"max_downloads must be >= 1, got {max_downloads}")
    if not write_timeout_s > 0:
        raise ValueError(f"write_timeout_s must be > 0, got {write_timeout_s}")
    expires = os.environ.get(EXPIRES_ENV, "")
    if expires and not (expires.isascii() and expires.isdigit()
                        and 1 <= int(expires) <= MAX_EXPIRES_S):
        raise ValueError(f"{EXPIRES_ENV}={expires!r}: seconds, 1 to {MAX_EXPIRES_S} "
                         f"(S3's limit)")
    app[SETTINGS_KEY] = LinkSettings(
        store=store, expires_s=int(expires or DEFAULT_EXPIRES_S),
        perfetto_ui=(os.environ.get(PERFETTO_UI_ENV) or DEFAULT_PERFETTO_UI).rstrip("/"),
        public_url=_public_url(os.environ.get(PUBLIC_URL_ENV, "")),
        read_token=read_token or None, downloads=DownloadSlots(max_downloads),
        write_timeout_s=write_timeout_s)
    app.router.add_get("/v1/traces/open", _open)
    app.router.add_get("/v1/traces/perfetto", _perfetto)
    app.router.add_get(FILE_ROUTE + "{key:.+}", _file)


def _public_url(text: str) -> str | None:
    """``ARGUS_PUBLIC_URL`` without its trailing slash; None when unset; ValueError if it is
    not an http(s) URL without query or fragment."""
    value = text.strip().rstrip("/")
    if not value:
        return None
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query \
            or parts.fragment:
        raise ValueError(f"{PUBLIC_URL_ENV}={text!r}: an http(s)://host[:port][/path] URL "
                         "is needed")
    return value


def _own_origin(request: web.Request) -> str:
    """This processor's origin as the request's connection reached it: the local socket
    address (the client cannot choose it, unlike the Host header)."""
    transport = request.transport
    sockname = transport.get_extra_info("sockname") if transport is not None else None
    if not isinstance(sockname, tuple) or len(sockname) < 2:
        raise LinkError(500, f"cannot tell this processor's address (a Unix socket?): set "
                             f"{PUBLIC_URL_ENV} to the URL browsers reach it at")
    host, port = str(sockname[0]), int(sockname[1])
    scheme = "https" if transport.get_extra_info("sslcontext") is not None else "http"
    if ":" in host:  # IPv6, with its zone (fe80::1%eth0) percent-encoded
        host = "[" + host.replace("%", "%25") + "]"
    return f"{scheme}://{host}:{port}"


async def _blocking(func: Callable[..., Any], *args: Any) -> Any:
    """Run a store call (boto3 and file reads block) off the event loop."""
    return await asyncio.get_running_loop().run_in_executor(None, func, *args)


async def _resolve(request: web.Request) -> tuple[LinkSettings, TraceRef, str | None]:
    settings = request.app[SETTINGS_KEY]
    authorize(request, settings.read_token)
    job, rank, at_ns = parse_link_query(request.query)
    ref = await _blocking(find_window, settings.store, job, rank, at_ns)
    url = await _blocking(presigned_url, settings.store, ref.key, settings.expires_s)
    return settings, ref, url


def _answer_errors(handler):
    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except LinkError as exc:
            return web.json_response({"error": exc.message}, status=exc.status,
                                     headers=exc.headers)
        except NotFoundError as exc:
            return web.json_response({"error": str(exc)}, status=404)
        except StoreError as exc:
            return web.json_response({"error": str(exc)}, status=502)
    return wrapped


@_answer_errors
async def _open(request: web.Request) -> web.StreamResponse:
    settings, ref, url = await _resolve(request)
    if url is not None:
        return _redirect(url, ref)
    return await _send_file(request, settings, ref)


@_answer_errors
async def _perfetto(request: web.Request) -> web.StreamResponse:
    settings, ref, url = await _resolve(request)
    if url is None:
        base = settings.public_url or _own_origin(request)
        if settings.read_token is None:
            url = base + FILE_ROUTE + quote(ref.key, safe="/=")
        else:
            expires_at = int(time.time()) + settings.expires_s
            url = base + signed_file_path(settings.read_token, ref.key, expires_at)
    return _redirect(perfetto_ui_url(url, settings.perfetto_ui), ref)


@_answer_errors
async def _file(request: web.Request) -> web.StreamResponse:
    settings = request.app[SETTINGS_KEY]
    key = request.match_info["key"]
    authorize(request, settings.read_token, key)
    ref = check_file_key(settings.store, key)
    return await _send_file(request, settings, ref)


def _open_stream(store: TraceStore, key: str) -> tuple[BinaryIO, int]:
    """The store's streaming read of ``key`` (a whole-file ``get`` for stores without one)."""
    open_stream = getattr(store, "open_stream", None)
    if open_stream is not None:
        return open_stream(key)
    data = store.get(key)
    return io.BytesIO(data), len(data)


async def _send_file(request: web.Request, settings: LinkSettings,
                     ref: TraceRef) -> web.StreamResponse:
    """Stream one trace file, holding a download slot (503 with Retry-After when none is free)."""
    slots = settings.downloads
    if not slots.take():
        raise LinkError(503, f"{slots.limit} trace downloads are in progress, the most this "
                             f"processor serves at once: retry in {RETRY_AFTER_S} s",
                        {"Retry-After": str(RETRY_AFTER_S)})
    try:
        stream, size = await _blocking(_open_stream, settings.store, ref.key)
        try:
            return await _stream(request, settings, ref, stream, size)
        finally:
            await _blocking(stream.close)
    finally:
        slots.give_back()


async def _stream(request: web.Request, settings: LinkSettings, ref: TraceRef,
                  stream: BinaryIO, size: int) -> web.StreamResponse:
    """Copy ``stream`` to the client chunk by chunk; each write (the headers and the end too)
    must drain within ``write_timeout_s``, else the connection is aborted, freeing its buffer."""
    segment, rank, label = ref.key.split("/")[-3:]
    name = f"{segment}.{rank.replace('=', '')}.{label}"
    response = web.StreamResponse(headers={
        "Content-Type": "application/gzip",
        "Content-Disposition": f'attachment; filename="{name}"',
        "Access-Control-Allow-Origin": settings.perfetto_ui,
        "Cache-Control": "private, max-age=300",
        "Referrer-Policy": "no-referrer",
        **_window_header(ref)})
    response.content_length = size
    timeout = settings.write_timeout_s
    try:
        async with asyncio.timeout(timeout):
            await response.prepare(request)
        while request.method != "HEAD":
            chunk = await _blocking(stream.read, CHUNK_BYTES)
            if not chunk:
                break
            async with asyncio.timeout(timeout):
                await response.write(chunk)
        async with asyncio.timeout(timeout):
            await response.write_eof()
    except TimeoutError:
        log.info("trace download of %s: the client took nothing for %g s; cut off",
                 ref.key, timeout)
        _abort(request)
    except ConnectionError:  # the client went away: nothing left to answer
        _abort(request)
    except Exception as exc:  # a store read failed after the headers went out
        log.warning("trace download of %s failed mid-stream: %s", ref.key, exc)
        _abort(request)
    return response


def _abort(request: web.Request) -> None:
    """Drop the connection and whatever it still buffers (the client gets a cut response)."""
    transport = request.transport
    if transport is not None:
        transport.abort()


def _redirect(url: str, ref: TraceRef) -> web.Response:
    """A 302 to ``url`` exactly as given (aiohttp's HTTPFound would re-normalise the URL and
    decode the percent-encoded ``url=`` argument of a Perfetto link); no Referer carries the
    link's token onwards."""
    return web.Response(status=302, headers={"Location": url, "Cache-Control": "no-store",
                                             "Referrer-Policy": "no-referrer",
                                             **_window_header(ref)})


def _window_header(ref: TraceRef | None) -> dict[str, str]:
    return {} if ref is None else {"X-Argus-Window-Start": _iso(ref.window_start_ns)}
