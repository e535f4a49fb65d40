"""``argus processor``: the per-host trace-path service (aiohttp).

POST /v1/records takes schema-v1 records as Vector's ``http`` sink sends them (NDJSON or a JSON
array, gzip or zstd). Records are buffered per (job, rank) and time window; a closed window is
compressed (KDE valley clustering) into kernel summaries served on /metrics, and written as
one Perfetto file to the trace store through a retrying, spooling uploader. Memory is bounded:
past ``max_buffered_events`` the service answers 503 with Retry-After (Vector retries) instead
of buffering more. SIGTERM stops intake, closes and writes every open window, flushes uploads,
then exits: a deploy loses nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from aiohttp import web

from argus_core.processor import links
from argus_core.processor.ingest import BodyError, decode_body, parse_body
from argus_core.processor.store import DEFAULT_MAX_SPOOL_BYTES
from argus_core.processor.window_output import WindowOutput
from argus_core.processor.windows import KernelChunk, Window, WindowStore
from argus_core.schema import KernelBatch
from argus_core.summaries import KernelSummary, top_kernels

logger = logging.getLogger("argus_core.processor")

WINDOWS_DIR = "windows"
"""Subdirectory of the spool where windows being written live (``.part`` + ``.key`` files)."""


@dataclass(frozen=True)
class ProcessorConfig:
    """Everything ``argus processor`` can be told."""

    host: str = "127.0.0.1"
    port: int = 9700
    store: str = "file:///var/lib/argus/traces"
    spool_dir: str = "/var/lib/argus/spool"
    max_spool_bytes: int = DEFAULT_MAX_SPOOL_BYTES
    token: str | None = None
    window_s: float = 60.0
    grace_s: float = 10.0
    max_body_bytes: int = 64 << 20  # decompressed
    max_buffered_events: int = 4_000_000  # kernel events not yet absorbed (~110 MB)
    max_pending_windows: int = 64  # closed windows waiting to be written
    chunk_events: int = 65_536  # a window's kernels go to disk and sketch in chunks this big
    top_k: int = 32
    retry_after_s: int = 1


class Processor:
    """Owns the windows, the writer thread, the uploader and the service's own counters.

    The event loop parses bodies and files kernels into windows; every ``chunk_events``
    kernels of a window go to the single writer thread, which appends them to the window's
    Perfetto file on disk and its duration sketch. Closing a window finishes both: the file
    moves into the upload spool, the sketch becomes the window's /metrics summaries. Memory
    therefore follows the chunk size and the number of open windows, not the window length.
    """

    def __init__(self, config: ProcessorConfig, uploader=None):
        from argus_core.processor.store import Uploader, open_store

        self.config = config
        self.windows = WindowStore(config.window_s, config.grace_s)
        self.uploader = uploader or Uploader(open_store(config.store), Path(config.spool_dir),
                                             config.max_spool_bytes)
        self.work_dir = Path(self.uploader.spool_dir) / WINDOWS_DIR
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="argus-writer")
        self._lock = threading.Lock()  # windows are touched by the loop and by shutdown
        self.pending_windows = 0  # closed windows not yet finished by the writer
        self.pending_events = 0  # kernel events handed to the writer, not yet absorbed
        self.draining = False
        self.records_in = 0
        self.kernel_events_in = 0
        self.bytes_in = 0
        self.rejected: Counter = Counter()
        self.windows_written = 0
        self.kernel_events_written = 0
        self.reordered_kernels = 0
        self.write_errors = 0
        self.salvaged_windows = 0
        self.latest: dict[tuple[str, int], tuple[int, KernelSummary]] = {}
        self._salvage()

    # -- intake ---------------------------------------------------------------------------
    def overloaded(self) -> bool:
        """True when more records would push memory past its bounds."""
        held = self.windows.buffered_events + self.pending_events
        return (held >= self.config.max_buffered_events
                or self.pending_windows >= self.config.max_pending_windows)

    def ingest(self, body: bytes, encoding: str | None) -> tuple[int, dict]:
        """Decode, validate and buffer one request body; returns (HTTP status, JSON answer)."""
        self.bytes_in += len(body)
        try:
            data = decode_body(body, encoding, self.config.max_body_bytes)
        except BodyError as exc:
            self.rejected["body"] += 1
            return exc.status, {"accepted": 0, "rejected": 0, "error": exc.message}
        result = parse_body(data)
        late = 0
        with self._lock:
            for record in result.records:
                late += self.windows.add(record)
                if isinstance(record, KernelBatch):
                    self.kernel_events_in += len(record.name)
            # Partly filled chunks of many windows can add up too: past half the budget,
            # everything held goes to the writer, so 503s always clear.
            crowded = self.windows.buffered_events >= self.config.max_buffered_events // 2
            for window, chunk in self.windows.chunks(1 if crowded else self.config.chunk_events):
                self.pending_events += len(chunk)
                self._writer.submit(self._absorb, window, chunk)
        self.records_in += len(result.records)
        self.rejected.update(result.reasons)
        if late:
            self.rejected["late"] += late
        answer = {"accepted": len(result.records), "rejected": result.rejected}
        if late:
            answer["late_kernels"] = late
        if result.rejected:
            answer["errors"] = result.errors
            return 400, answer
        return 200, answer

    # -- writing windows (on the writer thread) ---------------------------------------------
    def close_due(self, everything: bool = False) -> list:
        """Hand windows whose time has passed (or all) to the writer thread to finish."""
        futures = []
        with self._lock:
            ready = self.windows.close_all() if everything else self.windows.due()
            for window, chunk in ready:
                self.pending_windows += 1
                self.pending_events += len(chunk)
                futures.append(self._writer.submit(self._finish, window, chunk))
        return futures

    def _output(self, window: Window) -> WindowOutput:
        from argus_core.processor.store import trace_key

        if window.output is None:
            key = trace_key(self.uploader.store.prefix, window.job, window.rank,
                            window.start_ns)
            window.output = WindowOutput(self.work_dir, key, job=window.job, rank=window.rank,
                                         window_start_ns=window.start_ns,
                                         window_ns=window.window_ns,
                                         host=self.windows.host(window.job, window.rank))
        return window.output

    def _absorb(self, window: Window, chunk: KernelChunk) -> None:
        """Writer thread: append a chunk to the window's file and sketch."""
        try:
            if not window.failed:
                self._output(window).add(self.windows.names.names, chunk)
        except Exception:
            self._failed(window)
        finally:
            with self._lock:
                self.pending_events -= len(chunk)

    def _finish(self, window: Window, chunk: KernelChunk) -> None:
        """Writer thread: the last chunk, then the finished file to the spool, summaries out."""
        try:
            self._absorb(window, chunk)
            if window.failed:
                return
            output = self._output(window)
            try:
                summary = output.finish(self.windows.names.names, window.steps, window.stacks)
            except Exception:
                self._failed(window)
                return
            self.uploader.submit_file(output.key, output.path)
            output.discard()  # the key file (the trace itself has moved into the spool)
            if len(summary):
                self.latest[(window.job, window.rank)] = (
                    window.start_ns, top_kernels(summary, self.config.top_k))
            self.windows_written += 1
            self.kernel_events_written += output.trace.kernels
            self.reordered_kernels += output.trace.reordered
        finally:
            with self._lock:
                self.pending_windows -= 1

    def _failed(self, window: Window) -> None:
        self.write_errors += 1
        logger.exception("argus processor: could not write window %s/%s@%s", window.job,
                         window.rank, window.start_ns)
        if window.output is not None:
            window.output.discard()
        window.failed = True

    def _salvage(self) -> None:
        """Upload what a previous processor left of the windows it was writing (a crash)."""
        from argus_core.processor.window_output import leftovers, salvage

        for key, part, key_path in leftovers(self.work_dir):
            data = salvage(part)
            if data is not None:
                self.uploader.submit(key, data)
                self.salvaged_windows += 1
                logger.warning("argus processor: salvaged unfinished window %s", key)
            else:
                logger.warning("argus processor: unfinished window %s held nothing usable", key)
            part.unlink(missing_ok=True)
            key_path.unlink(missing_ok=True)

    def drain(self, timeout: float = 60.0) -> None:
        """Shutdown: close every window, write them all, flush the uploader."""
        self.draining = True
        for future in self.close_due(everything=True):
            future.result(timeout)
        self._writer.shutdown(wait=True)
        flushed = self.uploader.flush(timeout)
        self.uploader.close(timeout)
        logger.info("argus processor drained: windows=%d kernel_events_written=%d "
                    "records=%d rejected=%d uploads_pending=%s", self.windows_written,
                    self.kernel_events_written, self.records_in, sum(self.rejected.values()),
                    not flushed)

    # -- metrics --------------------------------------------------------------------------
    def collect(self):
        """Prometheus collector: kernel summaries per rank and the service's health."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        from argus_core.summaries import summary_families

        by_job: dict[str, list[KernelSummary]] = {}
        latest = dict(self.latest)  # one C-level copy: the writer thread inserts concurrently
        for (job, _), (_, summary) in sorted(latest.items(), key=lambda item: item[0]):
            by_job.setdefault(job, []).append(summary)
        yield from summary_families({job: _concat(summaries)
                                     for job, summaries in by_job.items()})
        info = GaugeMetricFamily("argus_rank_info", "Identity of each rank seen (value 1).",
                                 labels=["job", "rank", "host", "dp", "tp", "pp", "ep"])
        for (job, rank), ident in sorted(self.windows.identity.items()):
            info.add_metric([job, str(rank), ident.host, *map(str, ident.coords)], 1)
        yield info

        def counter(name, doc, value):
            family = CounterMetricFamily(name, doc)
            family.add_metric([], value)
            return family

        def gauge(name, doc, value):
            family = GaugeMetricFamily(name, doc)
            family.add_metric([], value)
            return family

        yield counter("argus_processor_records", "Valid records accepted.", self.records_in)
        yield counter("argus_processor_kernel_events", "Kernel executions accepted.",
                      self.kernel_events_in)
        yield counter("argus_processor_received_bytes", "Request body bytes received.",
                      self.bytes_in)
        rejected = CounterMetricFamily("argus_processor_rejected_records",
                                       "Records rejected, by reason (field, body, late).",
                                       labels=["reason"])
        for reason, n in sorted(self.rejected.items()):
            rejected.add_metric([reason], n)
        yield rejected
        yield gauge("argus_processor_open_windows", "Windows buffering records.",
                    len(self.windows.open))
        yield gauge("argus_processor_buffered_kernel_events",
                    "Kernel events held in memory, not yet absorbed into windows' files and "
                    "sketches.",
                    self.windows.buffered_events + self.pending_events)
        yield gauge("argus_processor_pending_windows", "Closed windows waiting to be written.",
                    self.pending_windows)
        yield counter("argus_processor_windows_written", "Windows compressed and stored.",
                      self.windows_written)
        yield counter("argus_processor_kernel_events_written",
                      "Kernel executions written into Perfetto windows.",
                      self.kernel_events_written)
        yield counter("argus_processor_window_errors", "Windows that failed to be written.",
                      self.write_errors)
        yield counter("argus_processor_reordered_kernels",
                      "Kernels that arrived after later ones of their stream had been written "
                      "(they go to a 'reordered' lane of the stream's track).",
                      self.reordered_kernels)
        yield counter("argus_processor_salvaged_windows",
                      "Unfinished windows of a previous (crashed) run uploaded at start.",
                      self.salvaged_windows)
        stats = self.uploader.stats
        yield counter("argus_processor_upload_failures", "Failed upload attempts.",
                      stats.failures)
        yield counter("argus_processor_uploaded_files", "Perfetto files stored.",
                      stats.uploaded_files)
        yield counter("argus_processor_dropped_files", "Files dropped: the spool was full.",
                      stats.dropped_files)
        yield gauge("argus_processor_spool_bytes", "Bytes waiting in the upload spool.",
                    self.uploader.spool_bytes)


def _concat(summaries: list[KernelSummary]) -> KernelSummary:
    if len(summaries) == 1:
        return summaries[0]
    fields = ("rank", "kernel", "stream", "window", "cluster", "count", "sum_ns", "p50_ns",
              "p99_ns")
    return KernelSummary(**{f: np.concatenate([getattr(s, f) for s in summaries])
                            for f in fields}, names=summaries[-1].names,
                         window_ns=summaries[0].window_ns)


# -- HTTP ---------------------------------------------------------------------------------
PROCESSOR_KEY = web.AppKey("processor", Processor)
REGISTRY_KEY = web.AppKey("registry", object)
CLOSER_KEY = web.AppKey("closer", asyncio.Task)


def build_app(processor: Processor) -> web.Application:
    """The aiohttp application: /v1/records, /metrics, /healthz, /readyz."""
    from prometheus_client import CollectorRegistry, ProcessCollector

    app = web.Application(client_max_size=processor.config.max_body_bytes)
    app[PROCESSOR_KEY] = processor
    registry = CollectorRegistry(auto_describe=False)
    registry.register(processor)
    ProcessCollector(registry=registry)  # process_resident_memory_bytes and friends
    app[REGISTRY_KEY] = registry
    app.router.add_post("/v1/records", _records)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/healthz", _healthy)
    app.router.add_get("/readyz", _ready)
    links.add_routes(app, processor.uploader.store)  # /v1/traces/*: Perfetto one click away
    app.on_startup.append(_start_closer)
    app.on_shutdown.append(_drain)
    return app


async def _records(request: web.Request) -> web.Response:
    processor = request.app[PROCESSOR_KEY]
    token = processor.config.token
    if token and not hmac.compare_digest(request.headers.get("Authorization", ""),
                                         f"Bearer {token}"):
        return web.json_response({"error": "missing or wrong bearer token"}, status=401)
    if processor.draining or processor.overloaded():
        reason = "shutting down" if processor.draining else "buffers full"
        return web.json_response({"error": f"busy ({reason}); retry later"}, status=503,
                                 headers={"Retry-After": str(processor.config.retry_after_s)})
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        processor.rejected["body"] += 1
        return web.json_response({"error": f"body exceeds {processor.config.max_body_bytes} "
                                           "bytes"}, status=413)
    # aiohttp's own decompression is off (see serve): decode_body caps what a small
    # compressed body may inflate to, and names the encodings it takes.
    status, answer = processor.ingest(body, request.headers.get("Content-Encoding"))
    return web.json_response(answer, status=status)


SERVER_OPTIONS = {"auto_decompress": False}  # for web.run_app / AppRunner / TestServer


async def _healthy(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _metrics(request: web.Request) -> web.Response:
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    body = generate_latest(request.app[REGISTRY_KEY])
    response = web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
    if "gzip" in request.headers.get("Accept-Encoding", ""):
        response.enable_compression()  # Prometheus asks for gzip: kernel labels compress ~10x
    return response


async def _ready(request: web.Request) -> web.Response:
    processor = request.app[PROCESSOR_KEY]
    if processor.draining or processor.overloaded():
        return web.json_response({"status": "not ready"}, status=503)
    return web.json_response({"status": "ready"})


async def _start_closer(app: web.Application) -> None:
    async def closer():
        while True:
            await asyncio.sleep(1.0)
            app[PROCESSOR_KEY].close_due()

    app[CLOSER_KEY] = asyncio.get_running_loop().create_task(closer())


async def _drain(app: web.Application) -> None:
    app[CLOSER_KEY].cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await app[CLOSER_KEY]
    processor = app[PROCESSOR_KEY]
    await asyncio.get_running_loop().run_in_executor(None, processor.drain)


def tune_malloc() -> None:
    """Cap glibc's malloc arenas at two (glibc only; a no-op elsewhere).

    The processor has two busy threads (the event loop and the writer); glibc would give
    each its own arenas, up to 8 x cores, and memory freed in one is not reused by the other,
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


def serve(config: ProcessorConfig) -> None:
    """Run until SIGTERM or SIGINT, then drain."""
    tune_malloc()
    processor = Processor(config)
    web.run_app(build_app(processor), host=config.host, port=config.port,
                print=lambda msg: logger.info(msg), handle_signals=True, access_log=None,
                **SERVER_OPTIONS)
