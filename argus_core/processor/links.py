"""Perfetto one click away: find the trace file of a rank at a time, and hand it to a browser.

Grafana's data links (and ``argus traces open``) name a job, a rank and a time; these routes of
the processor find that window's file in the trace store and answer with it:

- ``GET /v1/traces/open?job=J&rank=R&at=T``: a redirect to a presigned S3 URL valid for
  ``ARGUS_TRACE_LINK_EXPIRES_S`` seconds (default 900), or the file itself for a file store.
- ``GET /v1/traces/perfetto?job=J&rank=R&at=T``: a redirect that opens the same file in the
  Perfetto UI (``https://ui.perfetto.dev/#!/?url=...``, or ``ARGUS_PERFETTO_UI``). The UI
  fetches the file from the browser: the bucket (or this processor) must allow that origin
  (CORS, see the README), and be reachable by HTTPS (or on localhost).
- ``GET /v1/traces/file/KEY``: one trace file by key, with the CORS header for the Perfetto UI
  (what the Perfetto link points at when the store is a directory).

The window is the newest one starting at or before T, if it started less than
:data:`LOOKBACK_S` before T: a point on a kernel-summary panel shows the last *closed* window,
and a click on a live panel lands in a window not written yet, so "the newest at or before"
finds the file behind the point in both cases. ``at`` is ISO-8601 (UTC if no zone) or Unix
time in milliseconds (Grafana's ``${__value.time}``) or seconds. Because every click resolves
afresh, a dashboard's link never expires; only the presigned URL it redirects to does.
"""

from __future__ import annotations

import asyncio
import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from urllib.parse import quote

from aiohttp import web

from argus_core.processor.store import (
    NotFoundError,
    StoreError,
    TraceRef,
    TraceStore,
    find_traces,
    parse_key,
)

PERFETTO_UI_ENV = "ARGUS_PERFETTO_UI"
EXPIRES_ENV = "ARGUS_TRACE_LINK_EXPIRES_S"
PUBLIC_URL_ENV = "ARGUS_PUBLIC_URL"
DEFAULT_PERFETTO_UI = "https://ui.perfetto.dev"
DEFAULT_EXPIRES_S = 900
MAX_EXPIRES_S = 7 * 86_400  # the longest S3 honours (SigV4)
LOOKBACK_S = 600
"""A window that started longer than this before the requested time is not "the one at T"."""
FILE_ROUTE = "/v1/traces/file/"
_EPOCH_MS_DIGITS = 12  # 12+ digits: milliseconds (Grafana); fewer: seconds
_NUMBER = re.compile(r"\d+(\.\d+)?")


class LinkError(Exception):
    """A request the caller can fix (HTTP 400) or a trace that is not there (404)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def parse_at(text: str) -> int:
    """Nanoseconds since the epoch of ``at``: ISO-8601 (UTC if no zone), Unix ms or s."""
    value = text.strip()
    if _NUMBER.fullmatch(value):
        whole = value.split(".")[0]
        scale = 1_000_000 if len(whole) >= _EPOCH_MS_DIGITS else 1_000_000_000
        return int(Decimal(value) * scale)  # exact: a float would round nanoseconds
    try:
        moment = datetime.fromisoformat(value[:-1] + "+00:00" if value.endswith(("Z", "z"))
                                        else value)
    except ValueError:
        raise LinkError(400, f"at={text!r}: use ISO-8601 (2026-11-29T19:00:00Z) or Unix "
                             "milliseconds") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp()) * 1_000_000_000 + moment.microsecond * 1000


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
    return datetime.fromtimestamp(ns / 1e9, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# -- HTTP ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LinkSettings:
    """What the routes need: the store, how long presigned URLs live, the Perfetto UI."""

    store: TraceStore
    expires_s: int
    perfetto_ui: str
    public_url: str | None  # this processor as browsers reach it (else the request's host)


SETTINGS_KEY = web.AppKey("trace_links", LinkSettings)


def add_routes(app: web.Application, store: TraceStore) -> None:
    """Serve the trace links of ``store`` from ``app`` (settings from the environment)."""
    expires = os.environ.get(EXPIRES_ENV, "")
    if expires and not (expires.isdigit() and 1 <= int(expires) <= MAX_EXPIRES_S):
        raise ValueError(f"{EXPIRES_ENV}={expires!r}: seconds, 1 to {MAX_EXPIRES_S} "
                         f"(S3's limit)")
    app[SETTINGS_KEY] = LinkSettings(
        store=store, expires_s=int(expires or DEFAULT_EXPIRES_S),
        perfetto_ui=(os.environ.get(PERFETTO_UI_ENV) or DEFAULT_PERFETTO_UI).rstrip("/"),
        public_url=(os.environ.get(PUBLIC_URL_ENV) or "").rstrip("/") or None)
    app.router.add_get("/v1/traces/open", _open)
    app.router.add_get("/v1/traces/perfetto", _perfetto)
    app.router.add_get(FILE_ROUTE + "{key:.+}", _file)


def _query(request: web.Request) -> tuple[str, int, int]:
    job = request.query.get("job", "")
    rank = request.query.get("rank", "")
    at = request.query.get("at", "")
    if not job:
        raise LinkError(400, "job is missing (?job=J&rank=R&at=T)")
    if not rank.isdigit():
        raise LinkError(400, f"rank={rank!r}: an integer >= 0 is needed")
    if not at:
        raise LinkError(400, "at is missing: ISO-8601 or Unix milliseconds")
    return job, int(rank), parse_at(at)


async def _blocking(func, *args):
    """Run a store call (boto3 blocks) off the event loop."""
    return await asyncio.get_running_loop().run_in_executor(None, func, *args)


async def _resolve(request: web.Request) -> tuple[LinkSettings, TraceRef, str | None]:
    settings = request.app[SETTINGS_KEY]
    job, rank, at_ns = _query(request)
    ref = await _blocking(find_window, settings.store, job, rank, at_ns)
    url = await _blocking(presigned_url, settings.store, ref.key, settings.expires_s)
    return settings, ref, url


def _answer_errors(handler):
    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except LinkError as exc:
            return web.json_response({"error": exc.message}, status=exc.status)
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
    return await _file_response(settings, ref.key)


@_answer_errors
async def _perfetto(request: web.Request) -> web.StreamResponse:
    settings, ref, url = await _resolve(request)
    if url is None:
        base = settings.public_url or str(request.url.origin())
        url = base + FILE_ROUTE + quote(ref.key, safe="/=")
    return _redirect(perfetto_ui_url(url, settings.perfetto_ui), ref)


@_answer_errors
async def _file(request: web.Request) -> web.StreamResponse:
    settings = request.app[SETTINGS_KEY]
    key = request.match_info["key"]
    ref = parse_key(key)
    prefix = settings.store.prefix
    if ref is None or (prefix and not key.startswith(prefix + "/")):
        raise LinkError(404, f"{key!r} is not a trace key of {settings.store.url}")
    return await _file_response(settings, key)


async def _file_response(settings: LinkSettings, key: str) -> web.Response:
    data = await _blocking(settings.store.get, key)
    segment, rank, label = key.split("/")[-3:]
    name = f"{segment}.{rank.replace('=', '')}.{label}"
    return web.Response(body=data, headers={
        "Content-Type": "application/gzip",
        "Content-Disposition": f'attachment; filename="{name}"',
        "Access-Control-Allow-Origin": settings.perfetto_ui,
        "Cache-Control": "private, max-age=300",
        **_window_header(parse_key(key))})


def _redirect(url: str, ref: TraceRef) -> web.Response:
    """A 302 to ``url`` exactly as given (aiohttp's HTTPFound would re-normalise the URL and
    decode the percent-encoded ``url=`` argument of a Perfetto link)."""
    return web.Response(status=302, headers={"Location": url, "Cache-Control": "no-store",
                                             **_window_header(ref)})


def _window_header(ref: TraceRef | None) -> dict[str, str]:
    return {} if ref is None else {"X-Argus-Window-Start": _iso(ref.window_start_ns)}
