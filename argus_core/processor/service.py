"""``argus processor``: the per-host trace-path service (aiohttp).

POST /v1/records takes schema-v1 records as Vector's ``http`` sink sends them (NDJSON or a JSON
array, gzip or zstd). The body is read with a timeout, decoded and validated on an intake
thread (never on the event loop, so /healthz answers while a large body is parsed), appended
to the write-ahead log and filed into windows; only then is it acknowledged. Closed windows
become kernel summaries on /metrics and one Perfetto file each in the trace store (see
``core``). Memory, the log and the spool are bounded: past them the service answers 503 with
Retry-After (Vector retries). SIGTERM stops intake, closes and writes every open window,
flushes uploads, then exits: a deploy loses nothing, and neither does a crash (the log).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time

from aiohttp import web

from argus_core.processor import links
from argus_core.processor.config import ProcessorConfig, is_loopback
from argus_core.processor.connections import (
    BodyOverBudgetError,
    BodyTimeoutError,
    BodyTooLargeError,
    ClientGoneError,
    ConnectionGuard,
    read_body,
)
from argus_core.processor.core import WINDOWS_DIR, Processor
from argus_core.processor.metrics import ProcessorCollector, render_metrics

__all__ = ["SERVER_OPTIONS", "WINDOWS_DIR", "Processor", "ProcessorConfig", "build_app",
           "protect", "serve", "server_options"]

logger = logging.getLogger("argus_core.processor")

CHARGE_STEP = 1 << 20
"""A body without (or beyond) its Content-Length is charged to the budget in steps this big."""
PROCESSOR_KEY = web.AppKey("processor", Processor)
REGISTRY_KEY = web.AppKey("registry", object)
GUARD_KEY = web.AppKey("guard", ConnectionGuard)
TASKS_KEY = web.AppKey("tasks", list)
RENDERED_KEY = web.AppKey("metrics_rendered", object)


class _Rendered:
    """The last /metrics body, when its rendering began, and the lock of the next one."""

    def __init__(self):
        self.lock = asyncio.Lock()
        self.started = -1.0
        self.body = b""


def server_options(config: ProcessorConfig) -> dict:
    """Options for aiohttp's runner (AppRunner / TestServer.start_server): no automatic
    decompression (``decode_body`` caps it), headers due within ``idle_timeout_s``."""
    return {"auto_decompress": False, "keepalive_timeout": config.idle_timeout_s,
            "access_log": None}


SERVER_OPTIONS = server_options(ProcessorConfig())
"""The default configuration's runner options."""


def build_app(processor: Processor, log_limit=None) -> web.Application:
    """The aiohttp application: /v1/records, /metrics, /healthz, /readyz."""
    from prometheus_client import CollectorRegistry, ProcessCollector

    app = web.Application(client_max_size=processor.config.max_body_bytes)
    app[PROCESSOR_KEY] = processor
    app[GUARD_KEY] = ConnectionGuard(processor.config.max_connections)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ProcessorCollector(processor, app[GUARD_KEY], log_limit,
                                         summaries=False))
    ProcessCollector(registry=registry)  # process_resident_memory_bytes and friends
    app[REGISTRY_KEY] = registry
    app[RENDERED_KEY] = _Rendered()
    app.router.add_post("/v1/records", _records)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/healthz", _healthy)
    app.router.add_get("/readyz", _ready)
    links.add_routes(app, processor.uploader.store,  # /v1/traces/*: Perfetto one click away
                     read_token=processor.config.read_token)
    app.on_startup.append(_start)
    app.on_shutdown.append(_drain)
    return app


def protect(app: web.Application, server: web.Server) -> None:
    """Put the app's connection guard on the runner's server (after ``runner.setup()``)."""
    app[GUARD_KEY].install(server)


def _authorized(header: str, token: str) -> bool:
    """A bearer token (the scheme compared case-insensitively, RFC 9110), in constant time."""
    given = links.bearer(header)
    return given is not None and links.secret_equal(given, token)


async def _records(request: web.Request) -> web.Response:
    processor = request.app[PROCESSOR_KEY]
    guard = request.app[GUARD_KEY]
    token = processor.config.token
    if token and not _authorized(request.headers.get("Authorization", ""), token):
        return web.json_response({"error": "missing or wrong bearer token"}, status=401)
    busy = processor.busy()
    reserved = request.content_length or 0
    if busy is None and not processor.reserve(reserved):
        busy = "memory budget full"
    if busy is not None:
        return web.json_response({"error": f"busy ({busy}); retry later"}, status=503,
                                 headers={"Retry-After": str(processor.config.retry_after_s)})
    def charge(size: int) -> bool:  # bytes beyond what was reserved, as they arrive
        nonlocal reserved
        if size > reserved:  # reserve a step ahead: the budget is summed once per step
            step = min(-(-size // CHARGE_STEP) * CHARGE_STEP, processor.config.max_body_bytes)
            if not processor.charge(max(step, size) - reserved, own=reserved):
                return False
            reserved = max(step, size)
        return True

    try:
        try:
            body = await read_body(request, processor.config.max_body_bytes,
                                   processor.config.read_timeout_s, guard, charge)
        except BodyOverBudgetError as exc:
            processor.count_rejected("memory")
            return await _answer_and_close(request, web.json_response(
                {"error": f"busy ({exc}); retry later"}, status=503, headers={
                    "Retry-After": str(processor.config.retry_after_s),
                    "Connection": "close"}))
        except BodyTooLargeError as exc:
            processor.count_rejected("body")
            return web.json_response({"error": str(exc)}, status=413,
                                     headers={"Connection": "close"})
        except ClientGoneError:  # nobody is left to answer; not an error of ours
            processor.count_rejected("body")
            return web.Response(status=499)
        except BodyTimeoutError as exc:
            processor.count_rejected("body")
            return await _answer_and_close(request, web.json_response(
                {"error": str(exc)}, status=408, headers={"Connection": "close"}))
        with guard.serving(request.protocol):
            # Decoding and parsing run on an intake thread: the loop keeps serving.
            try:
                answer = await asyncio.get_running_loop().run_in_executor(
                    processor.intake, processor.ingest, body,
                    request.headers.get("Content-Encoding"))
            except RuntimeError:  # intake shut down under us: the drain has begun
                return web.json_response({"error": "busy (shutting down); retry later"},
                                         status=503, headers={
                                             "Retry-After": str(processor.config.retry_after_s)})
            if answer.durable is not None:
                try:
                    await asyncio.wrap_future(answer.durable)
                except Exception as exc:  # the fsync failed: nothing may be acknowledged
                    return web.json_response(
                        {"error": f"cannot make records durable: {exc}"}, status=503,
                        headers={"Retry-After": str(processor.config.retry_after_s)})
    finally:
        processor.unreserve(reserved)
    headers = {"Retry-After": str(processor.config.retry_after_s)} if answer.retry else None
    return web.json_response(answer.body, status=answer.status, headers=headers)


async def _answer_and_close(request: web.Request, response: web.Response) -> web.Response:
    """Send ``response`` now and drop the connection (no lingering for the rest of a body
    that a stalled client will never send)."""
    await response.prepare(request)
    await response.write_eof()
    request.protocol.force_close()
    return response


async def _healthy(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _metrics(request: web.Request) -> web.Response:
    """/metrics, rendered on a thread (never on the event loop: /healthz and intake go on),
    one rendering at a time; scrapes that arrive during one share its result."""
    from prometheus_client import CONTENT_TYPE_LATEST

    app = request.app
    rendered = app[RENDERED_KEY]
    arrived = time.monotonic()
    async with rendered.lock:
        if rendered.started < arrived:  # no rendering began after this scrape arrived
            started = time.monotonic()
            rendered.body = await asyncio.get_running_loop().run_in_executor(
                None, render_metrics, app[PROCESSOR_KEY], app[REGISTRY_KEY])
            rendered.started = started
        body = rendered.body
    response = web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
    if "gzip" in request.headers.get("Accept-Encoding", ""):
        response.enable_compression()  # Prometheus asks for gzip: kernel labels compress ~10x
    return response


async def _ready(request: web.Request) -> web.Response:
    """200 when intake takes records and the store takes files; 503 with the reasons."""
    processor = request.app[PROCESSOR_KEY]
    reasons = []
    busy = processor.busy()
    if busy is not None:
        reasons.append(busy)
    if processor.store_problem is not None:
        reasons.append(f"trace store {processor.uploader.store.url}: {processor.store_problem} "
                       f"(traces wait in the spool)")
    if reasons:
        return web.json_response({"status": "not ready", "reasons": reasons}, status=503)
    return web.json_response({"status": "ready"})


async def _start(app: web.Application) -> None:
    """Replay the log on a thread (intake says 503 until done), then tick once a second."""
    processor = app[PROCESSOR_KEY]
    loop = asyncio.get_running_loop()

    async def upkeep():
        await loop.run_in_executor(None, processor.recover)
        while True:
            await asyncio.sleep(1.0)
            await loop.run_in_executor(None, processor.maintain)

    app[TASKS_KEY] = [loop.create_task(upkeep())]


async def _drain(app: web.Application) -> None:
    for task in app[TASKS_KEY]:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    processor = app[PROCESSOR_KEY]
    await asyncio.get_running_loop().run_in_executor(None, processor.drain)


def tune_malloc() -> None:
    """Cap glibc's malloc arenas at two (glibc only; a no-op elsewhere).

    The processor has busy threads (the event loop, intake and the writer); glibc would give
    each its own arenas, up to 8 x cores, and memory freed in one is not reused by another,
    so RSS creeps. Two arenas keep RSS flat. The mmap threshold is left to glibc: serving
    every mid-sized numpy temporary from fresh mmap pages (a low fixed threshold) costs a page
    fault per 4 KB, about +50% CPU per kernel event here.
    """
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name:
        return
    with contextlib.suppress(OSError, AttributeError):
        m_arena_max = -8
        ctypes.CDLL(name).mallopt(m_arena_max, 2)


async def _run(config: ProcessorConfig, log_limit) -> None:
    processor = Processor(config)
    app = build_app(processor, log_limit)
    runner = web.AppRunner(app, handle_signals=False, **server_options(config))
    await runner.setup()
    protect(app, runner.server)
    site = web.TCPSite(runner, config.host, config.port, backlog=512)
    await site.start()
    logger.info("argus processor listening on http://%s:%d (store %s, spool %s, "
                "durability %s)", config.host, config.port, processor.uploader.store.url,
                processor.uploader.spool_dir, config.durability)
    if not is_loopback(config.host) and not config.read_token:
        logger.warning("argus processor: trace files (/v1/traces/*) can be read by anyone who "
                       "reaches %s:%d; --read-token-env or --protect-reads protects them",
                       config.host, config.port)
    if not config.token and not is_loopback(config.host):
        logger.warning("argus processor: POST /v1/records takes records from anyone who "
                       "reaches %s:%d without a token (--insecure)", config.host, config.port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
        logger.info("argus processor: stopping (draining open windows)")
    finally:
        await runner.cleanup()


def serve(config: ProcessorConfig) -> None:
    """Run until SIGTERM or SIGINT, then drain."""
    from argus_core.processor.logs import configure_logging

    log_limit = configure_logging()
    tune_malloc()
    asyncio.run(_run(config.validate(), log_limit))
