"""The processor's state: intake, windows, the writer thread, the log, memory and forgetting.

Intake threads decode and validate request bodies (off the event loop); under one lock each
body with accepted records is appended to the write-ahead log and its records are filed into
windows. Every ``chunk_events`` kernels (or ``chunk_bytes`` of stack samples) of a window go to
the single writer thread, which appends them to the window's Perfetto file on disk (and the
kernels to its duration sketch). Closing a window finishes both: the file moves into the upload
spool, the sketch becomes the window's /metrics summaries, and the log learns the window is
done, so the segments holding its records can go.

Memory is one budget in bytes for everything held (kernels, steps, stack samples, names, open
windows' writer state, the writer's queue, rank state, summaries, bodies being read): past it
intake answers 503 with Retry-After (Vector retries), and past half of it everything a window
holds goes to the writer at once. Rank state and summaries are forgotten ``state_ttl_s`` after
a rank's last record.

One module past 500 lines on purpose: intake, the memory budget and window closing share one
lock and one set of invariants (what a 2xx promises), which a split would spread over files.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson

from argus_core.processor.config import ProcessorConfig
from argus_core.processor.ingest import BodyError, ClockBounds, decode_body, parse_body
from argus_core.processor.memory import WINDOW_BYTES
from argus_core.processor.wal import BODY, CLOSED, DONE, WalError, WriteAheadLog, body_payload
from argus_core.processor.wal import fsync_dir as _fsync_dir
from argus_core.processor.window_output import WindowOutput
from argus_core.processor.windows import (
    Handover,
    Window,
    WindowKey,
    WindowStore,
    opened_by,
    window_keys,
)
from argus_core.schema import KernelBatch, RankRecord, Record
from argus_core.summaries import (
    KernelSummary,
    kernel_tail,
    summary_headers,
    summary_lines,
    tail_headers,
    tail_lines,
    top_kernels,
)

logger = logging.getLogger("argus_core.processor")

WINDOWS_DIR = "windows"
"""Subdirectory of the spool where windows being written live (``.part`` + ``.key`` files)."""
WAL_DIR = "wal"
"""Subdirectory of the spool holding the write-ahead log."""
STORE_RECHECK_S = 60.0


@dataclass
class Answer:
    """What intake says about one body: HTTP status, JSON answer, and (``fsync`` durability)
    a future to wait on before sending it."""

    status: int
    body: dict
    durable: Future | None = None
    retry: bool = False  # a 503: send Retry-After


@dataclass
class ProcessorStats:
    """The processor's counters, read by its /metrics (updated under the processor's lock)."""

    records_in: int = 0
    kernel_events_in: int = 0
    bytes_in: int = 0
    rejected: Counter = field(default_factory=Counter)  # records refused, by reason
    windows_written: int = 0
    kernel_events_written: int = 0
    reordered_kernels: int = 0
    skipped_records: int = 0
    write_errors: int = 0
    wal_errors: int = 0
    salvaged_windows: int = 0
    closed_early: int = 0  # windows closed to keep a rank within max_windows_per_rank
    replayed_bodies: int = 0
    metrics_left_out: int = 0  # ranks the last /metrics left out (max_metrics_series)
    summary_bytes: int = 0  # bytes of the latest kernel summaries held for /metrics


class Processor:
    """Owns the windows, the writer thread, the log, the uploader and the service's counters."""

    def __init__(self, config: ProcessorConfig, uploader=None, *, clock_ns=time.time_ns):
        from argus_core.processor.store import Uploader, open_store

        self.config = config.validate()
        self.clock_ns = clock_ns
        self.windows = WindowStore(config.window_s, config.grace_s, clock_ns=clock_ns,
                                   max_age_s=config.max_age_s, max_floors=config.max_ranks,
                                   max_open_per_rank=config.max_windows_per_rank)
        self.uploader = uploader or Uploader(open_store(config.store), Path(config.spool_dir),
                                             config.max_spool_bytes)
        spool = Path(self.uploader.spool_dir)
        self.work_dir = spool / WINDOWS_DIR
        self.wal = None if config.durability == "memory" else WriteAheadLog(
            spool / WAL_DIR, fsync_each=config.durability == "fsync",
            sync_interval_s=config.wal_sync_interval_s, segment_bytes=config.wal_segment_bytes)
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="argus-writer")
        self.intake = ThreadPoolExecutor(max_workers=config.intake_threads,
                                         thread_name_prefix="argus-intake")
        self._lock = threading.RLock()  # windows, counters and the log's order
        self._count_lock = threading.Lock()  # bodies in flight (never held for long)
        self.recovering = True
        self.recovered = threading.Event()
        self.draining = False
        self._closing: dict[WindowKey, Window] = {}  # closed, waiting for the writer
        self.pending_bytes = 0  # handed to the writer, not yet absorbed
        self.inflight_bytes = 0  # request bodies being read or decoded
        self.stats = ProcessorStats()
        self.latest: dict[tuple[str, int], tuple[int, KernelSummary]] = {}
        # the latest summaries' lines (quantiles, executions, tail seconds, tail kernels) and
        # their series count, per (job, rank)
        self.exposed: dict[tuple[str, int], tuple[str, str, str, str, int]] = {}
        self.store_problem: str | None = None
        self._store_checked = 0.0
        self._uploads_at_check = 0

    @property
    def pending_windows(self) -> int:
        """Closed windows waiting for the writer."""
        return len(self._closing)

    # -- start ------------------------------------------------------------------------------
    def recover(self) -> None:
        """Bring back what a previous processor on this spool acknowledged: replay the log
        (or, without one, upload the chunks of its unfinished windows). Intake answers 503
        until this is done."""
        try:
            self.check_store()
            if self.wal is None:
                self._salvage()
            else:
                from argus_core.processor.replay import replay

                replay(self)
        finally:
            self.recovering = False
            self.recovered.set()

    def check_store(self) -> None:
        """Ask the store whether it can take files; say so in the log and on /readyz."""
        check = getattr(self.uploader.store, "check", None)
        if check is None:
            return
        from argus_core.processor.store import StoreError

        self._store_checked = time.monotonic()
        self._uploads_at_check = self.uploader.stats.uploaded_files
        try:
            check()
        except StoreError as exc:
            if self.store_problem is None:
                logger.warning("argus processor: the trace store %s cannot take files: %s; "
                               "traces wait in the spool %s (up to %d MB) until it can",
                               self.uploader.store.url, exc, self.uploader.spool_dir,
                               self.uploader.max_spool_bytes >> 20)
            self.store_problem = str(exc)
            return
        if self.store_problem is not None:
            logger.info("argus processor: the trace store %s is usable again",
                        self.uploader.store.url)
        self.store_problem = None

    # -- intake -----------------------------------------------------------------------------
    def memory(self) -> dict[str, int]:
        """Estimated bytes held, by kind (what the memory budget counts). Takes no lock: the
        event loop asks on every request and must never wait for a writer's fsync."""
        held = self.windows.memory()
        held["windows"] += sum(w.output_bytes for w in list(self._closing.values()))
        held["writer"] = self.pending_bytes
        held["summaries"] = self.stats.summary_bytes
        held["bodies"] = self.inflight_bytes
        return held

    def memory_used(self) -> int:
        """Estimated bytes held, all kinds together."""
        return sum(self.memory().values())

    def busy(self) -> str | None:
        """Why intake must answer 503 now, or None when it can take records."""
        if self.recovering:
            return "recovering: replaying the write-ahead log"
        if self.draining:
            return "shutting down"
        used, budget = self.memory_used(), self.config.memory_budget_bytes
        if used >= budget:
            return f"memory budget full ({used >> 20} of {budget >> 20} MB)"
        if len(self._closing) >= self.config.max_pending_windows:
            return f"{len(self._closing)} closed windows waiting to be written"
        if self.wal is not None and self.wal.bytes_on_disk >= self.config.wal_max_bytes:
            return "write-ahead log full (windows are not being written fast enough)"
        if self.uploader.spool_bytes >= 0.9 * self.uploader.max_spool_bytes:
            return "upload spool nearly full (is the trace store reachable?)"
        return None

    def reserve(self, nbytes: int) -> bool:
        """Count a request body about to be read against the budget; False (nothing
        reserved) when it does not fit. One body at a time always fits (a budget smaller
        than a body must not refuse it for ever)."""
        with self._count_lock:
            if (nbytes and self.inflight_bytes
                    and self.memory_used() + nbytes > self.config.memory_budget_bytes):
                return False
            self.inflight_bytes += nbytes
            return True

    def charge(self, nbytes: int, own: int) -> bool:
        """Count ``nbytes`` more of a body being read (``own`` counted for it already);
        False (nothing counted) when they do not fit and other bodies are held too."""
        with self._count_lock:
            if (self.inflight_bytes > own
                    and self.memory_used() + nbytes > self.config.memory_budget_bytes):
                return False
            self.inflight_bytes += nbytes
            return True

    def hold(self, nbytes: int) -> None:
        """Count bytes of a body already read, whether or not they fit."""
        with self._count_lock:
            self.inflight_bytes += nbytes

    def unreserve(self, nbytes: int) -> None:
        """Release what :meth:`reserve` or :meth:`hold` counted."""
        with self._count_lock:
            self.inflight_bytes -= nbytes

    def count_rejected(self, reason: str, n: int = 1) -> None:
        """Count refused records (or bodies) by reason."""
        with self._count_lock:
            self.stats.rejected[reason] += n

    @contextlib.contextmanager
    def _holding(self, nbytes: int):
        """Count ``nbytes`` (a decoded body) as held while the block runs."""
        self.hold(nbytes)
        try:
            yield
        finally:
            self.unreserve(nbytes)

    def ingest(self, body: bytes, encoding: str | None) -> Answer:
        """Decode, validate, log and buffer one request body (runs on an intake thread)."""
        with self._lock:
            self.stats.bytes_in += len(body)
        try:
            data = decode_body(body, encoding, self.config.max_body_bytes,
                               self.config.max_members)
        except BodyError as exc:
            self.count_rejected("body")
            return Answer(exc.status, {"accepted": 0, "rejected": 0, "error": exc.message})
        bounds = ClockBounds(self.clock_ns(), int(self.config.max_skew_s * 1e9),
                             int(self.config.max_age_s * 1e9))
        with self._holding(len(data)):  # the decoded text counts until it is parsed
            result = parse_body(data, check=bounds.check)
        del data
        with self._lock:
            late: Counter = Counter()
            if result.records:
                keys = window_keys(result.records, self.windows.window_ns)
                refusal = self._admit(result.records, keys)
                if refusal is not None:
                    return refusal
                segment = None
                if self.wal is not None:
                    identities = any(isinstance(r, RankRecord) for r in result.records)
                    try:  # a body with an identity goes to no window: always replayed
                        segment = self.wal.append(BODY, *body_payload(
                            body, encoding or "", result.refused,
                            None if identities else [list(key) for key in sorted(keys)]))
                    except WalError as exc:
                        self.stats.wal_errors += 1
                        logger.error("argus processor: %s", exc)
                        return Answer(503, {"accepted": 0, "rejected": 0,
                                            "error": f"cannot make records durable: {exc}"},
                                      retry=True)
                late = self.apply(result.records, segment)
            self.stats.records_in += len(result.records)
            with self._count_lock:
                self.stats.rejected.update(result.reasons)
            rolled = self.wal is not None and self.wal.should_roll()
            if rolled:
                self.roll()
        if rolled:
            self.retire_segments()
        answer = {"accepted": len(result.records), "rejected": result.rejected}
        for kind in ("kernels", "steps", "stacks"):
            if late[kind]:
                answer[f"late_{kind}"] = late[kind]
        durable = self.wal.durable() if self.wal is not None and result.records else None
        if result.rejected:
            answer["errors"] = result.errors
            return Answer(400, answer, durable)
        return Answer(200, answer, durable)

    def _admit(self, records: list[Record], keys: set[WindowKey]) -> Answer | None:
        """Under the lock: refuse a body whose windows (``keys``) would break a bound (413
        when it never can fit, 503 when it can later), before any of it is logged or filed."""
        per_rank = opened_by(keys, self.windows)
        opening = sum(per_rank.values())
        if opening > self.config.max_body_windows:
            self.count_rejected("windows", len(records))
            return Answer(413, {"accepted": 0, "rejected": len(records), "error": (
                f"the records would open {opening} windows; at most "
                f"{self.config.max_body_windows} per body (--max-body-windows): send records "
                f"spanning less time per rank in one body")})
        cap = self.config.max_windows_per_rank  # beyond it, windows close as they go
        cost = WINDOW_BYTES * sum(min(n, cap) for n in per_rank.values())
        budget = self.config.memory_budget_bytes
        if cost > budget:
            self.count_rejected("memory", len(records))
            return Answer(413, {"accepted": 0, "rejected": len(records), "error": (
                f"the records would hold {opening} windows of {len(per_rank)} ranks open "
                f"(~{cost >> 20} MB), more than the memory budget ({budget >> 20} MB, "
                f"--memory-budget-mb)")})
        used = self.memory_used()
        if opening and used + cost > budget:
            return Answer(503, {"accepted": 0, "rejected": 0, "error": (
                f"busy (memory budget: {used >> 20} MB held, {opening} new windows need "
                f"~{cost >> 20} MB of {budget >> 20} MB); retry later")}, retry=True)
        return None

    def apply(self, records: list[Record], segment: int | None,
              log_close: bool = True) -> Counter:
        """File records into windows (under the lock); returns late items by kind. Windows
        closed to keep a rank within ``max_windows_per_rank`` go to the writer (``log_close``
        as in :meth:`finish_later`)."""
        late = self.windows.add_body(records, segment)
        self.stats.kernel_events_in += sum(len(r.name) for r in records
                                           if isinstance(r, KernelBatch))
        for handover in self.windows.take_closed_early():
            self.stats.closed_early += 1
            self.finish_later(handover, log_close)
        # Partly filled chunks of many windows can add up too: past half the budget,
        # everything held goes to the writer, so 503s always clear.
        crowded = self.memory_used() >= self.config.memory_budget_bytes // 2
        for handover in self.windows.chunks(1 if crowded else self.config.chunk_events,
                                            1 if crowded else self.config.chunk_bytes):
            self.pending_bytes += handover.bytes
            self._writer.submit(self._absorb, handover)
        return late

    def roll(self) -> None:
        """Start a new log segment (under the lock: its snapshot must match the log)."""
        try:
            self.wal.open_segment(orjson.dumps(self.windows.snapshot()))
        except (WalError, OSError) as exc:
            self.stats.wal_errors += 1
            logger.error("argus processor: cannot start a new log segment: %s", exc)

    def retire_segments(self) -> None:
        """Delete the oldest log segments whose records every window has written. Call it
        without the lock held: it fsyncs first."""
        if self.wal is None:
            return
        with self._lock:
            free = []
            for segment in self.wal.segments():
                if segment == self.wal.current or self.windows.segment_refs.get(segment):
                    break
                free.append(segment)
        if not free:
            return
        try:
            self.wal.sync()  # the "done" entries, then the files they vouch for
            _fsync_dir(Path(self.uploader.spool_dir))
        except OSError as exc:
            logger.error("argus processor: cannot sync before retiring log segments: %s", exc)
            return
        self.wal.delete(free)

    # -- closing and writing windows ---------------------------------------------------------
    def close_due(self, everything: bool = False) -> list[Future]:
        """Hand windows whose time has passed (or all) to the writer thread to finish."""
        with self._lock:
            ready = self.windows.close_all() if everything else self.windows.due()
            return [self.finish_later(handover, log_close=True) for handover in ready]

    def finish_later(self, handover: Handover, log_close: bool) -> Future:
        """Queue a closed window for the writer (under the lock); ``log_close`` records the
        close in the log (a replay reads it from there and passes False)."""
        window = handover.window
        if log_close and self.wal is not None:
            try:
                self.wal.append(CLOSED, orjson.dumps(list(window.key)))
            except WalError as exc:
                self.stats.wal_errors += 1
                logger.error("argus processor: %s", exc)
        self._closing[window.key] = window
        self.pending_bytes += handover.bytes
        return self._writer.submit(self._finish, handover)

    def _output(self, window: Window) -> WindowOutput:
        from argus_core.processor.store import trace_key

        if window.output is None:
            key = trace_key(self.uploader.store.prefix, window.job, window.rank,
                            window.start_ns)
            window.output = WindowOutput(self.work_dir, key, job=window.job, rank=window.rank,
                                         window_start_ns=window.start_ns,
                                         window_ns=window.window_ns,
                                         host=(self.windows.host(window.job, window.rank)
                                               if window.host is None else window.host))
            window.output_bytes = window.output.memory_bytes()
        return window.output

    def _absorb(self, handover: Handover) -> None:
        """Writer thread: append a window's kernels and stack samples to its file and sketch."""
        window = handover.window
        try:
            if not window.failed:
                output = self._output(window)
                output.add(window.names.names, handover.kernels, handover.stacks)
                window.output_bytes = output.memory_bytes()
        except Exception:
            self._failed(window)
        finally:
            with self._lock:
                self.pending_bytes -= handover.bytes

    def _finish(self, handover: Handover) -> None:
        """Writer thread: the last kernels, steps and samples, the file into the spool, the
        summaries out, and the log told the window is done."""
        window = handover.window
        output = None
        summary = None
        try:
            if not window.failed:
                try:
                    output = self._output(window)
                    output.add(window.names.names, handover.kernels, handover.stacks)
                    summary = output.finish(window.names.names, window.steps, [])
                except Exception:
                    self._failed(window)
            if output is not None and not window.failed:
                self.uploader.submit_file(output.key, output.path)
                output.discard()  # the key file (the trace itself has moved into the spool)
                with self._lock:
                    if len(summary):
                        self._keep_summary(window, summary)
                    self.stats.windows_written += 1
                    self.stats.kernel_events_written += output.trace.kernels
                    self.stats.reordered_kernels += output.trace.reordered
                    self.stats.skipped_records += output.trace.skipped
        finally:
            with self._lock:
                self.pending_bytes -= handover.bytes
                self._closing.pop(window.key, None)
                freed = self._done(window)
            if freed:
                self.retire_segments()

    def _done(self, window: Window) -> bool:
        """Under the lock: log that the window is written; True when segments were freed."""
        if self.wal is None:
            return False
        try:
            self.wal.append(DONE, orjson.dumps(list(window.key)))
        except WalError as exc:
            self.stats.wal_errors += 1
            logger.error("argus processor: %s", exc)
            return False  # its segments stay: a replay writes the window again (same key)
        return bool(self.windows.release(window))

    def _keep_summary(self, window: Window, summary: KernelSummary) -> None:
        key = (window.job, window.rank)
        previous = self.latest.get(key)
        if previous is not None and previous[0] > window.start_ns:
            return  # a late window never replaces a newer one's summaries
        top = top_kernels(summary, self.config.top_k)
        tail = tail_lines(window.job, kernel_tail(summary, top))
        top = _compact(top)
        if previous is not None:
            self.stats.summary_bytes -= _summary_bytes(previous[1]) + self._exposed_bytes(key)
        self.latest[key] = (window.start_ns, top)
        self.exposed[key] = (*summary_lines(top, window.job), *tail, 3 * len(top) + 2)
        self.stats.summary_bytes += _summary_bytes(top) + self._exposed_bytes(key)

    def _exposed_bytes(self, key: tuple[str, int]) -> int:
        return sum(map(len, self.exposed.get(key, ("", 0))[:-1]))

    def summary_exposition(self) -> tuple[str, int]:
        """The kernel summaries' part of /metrics, ranks in (job, rank) order up to
        ``max_metrics_series`` series, and how many ranks were left out. Takes no lock."""
        parts = [[header] for header in (*summary_headers(), *tail_headers())]
        series = left_out = 0
        for key in sorted(list(self.exposed)):
            entry = self.exposed.get(key)
            if entry is None:
                continue
            if series + entry[-1] > self.config.max_metrics_series:
                left_out += 1
                continue
            for lines, part in zip(entry[:-1], parts, strict=True):
                part.append(lines)
            series += entry[-1]
        return "".join("".join(part) for part in parts), left_out

    def _failed(self, window: Window) -> None:
        self.stats.write_errors += 1
        logger.exception("argus processor: could not write window %s/%s@%s", window.job,
                         window.rank, window.start_ns)
        if window.output is not None:
            window.output.discard()
        window.failed = True

    def _salvage(self) -> None:
        """Without a log: upload what a previous processor left of its unfinished windows."""
        from argus_core.processor.window_output import leftovers, salvage

        for key, part, key_path in leftovers(self.work_dir):
            data = salvage(part)
            if data is not None:
                self.uploader.submit(key, data)
                self.stats.salvaged_windows += 1
                logger.warning("argus processor: salvaged unfinished window %s", key)
            else:
                logger.warning("argus processor: unfinished window %s held nothing usable", key)
            part.unlink(missing_ok=True)
            key_path.unlink(missing_ok=True)

    # -- upkeep -----------------------------------------------------------------------------
    def maintain(self) -> None:
        """Once a second: close due windows, forget idle ranks, roll and retire the log,
        re-check a store that could not take files."""
        if self.recovering or self.draining:
            return
        self.close_due()
        with self._lock:
            self.windows.expire(self.config.state_ttl_s, self.config.max_ranks)
            for key in [key for key in self.latest if key not in self.windows.ranks]:
                self.stats.summary_bytes -= (_summary_bytes(self.latest.pop(key)[1])
                                       + self._exposed_bytes(key))
                self.exposed.pop(key, None)
            if self.wal is not None and self.wal.should_roll():
                self.roll()
        self.retire_segments()
        if self.store_problem is not None:
            if self.uploader.stats.uploaded_files > self._uploads_at_check:
                self.store_problem = None
            elif time.monotonic() - self._store_checked >= STORE_RECHECK_S:
                self.check_store()

    def drain(self, timeout: float = 60.0) -> None:
        """Shutdown: close every window, write them all, flush the uploader, and leave the
        log holding only the ranks' state (their identities survive a restart)."""
        self.draining = True
        self.recovered.wait(timeout)
        self.intake.shutdown(wait=True)  # bodies being parsed still reach their windows
        for future in self.close_due(everything=True):
            future.result(timeout)
        self._writer.shutdown(wait=True)
        flushed = self.uploader.flush(timeout)
        self.uploader.close(timeout)
        if self.wal is not None:
            with self._lock:
                self.roll()
            self.retire_segments()
            self.wal.close()
        logger.info("argus processor drained: windows=%d kernel_events_written=%d "
                    "records=%d rejected=%d uploads_pending=%s", self.stats.windows_written,
                    self.stats.kernel_events_written, self.stats.records_in,
                    sum(self.stats.rejected.values()), not flushed)

    def close(self) -> None:
        """Release threads and files without draining (tests, failed starts)."""
        self.draining = True
        self._writer.shutdown(wait=True)
        self.intake.shutdown(wait=True)
        with contextlib.suppress(Exception):
            self.uploader.close(1.0)
        if self.wal is not None:
            self.wal.close()


def _compact(summary: KernelSummary) -> KernelSummary:
    """The summary with only the kernel names it uses (a window's table holds them all)."""
    used, kernel = np.unique(summary.kernel, return_inverse=True)
    return KernelSummary(rank=summary.rank, kernel=kernel.astype(np.int64),
                         stream=summary.stream, window=summary.window, cluster=summary.cluster,
                         count=summary.count, sum_ns=summary.sum_ns, p50_ns=summary.p50_ns,
                         p99_ns=summary.p99_ns, names=[summary.names[i] for i in used.tolist()],
                         window_ns=summary.window_ns)


def _summary_bytes(summary: KernelSummary) -> int:
    arrays = sum(getattr(summary, f).nbytes for f in
                 ("rank", "kernel", "stream", "window", "cluster", "count", "sum_ns", "p50_ns",
                  "p99_ns"))
    return 500 + arrays + sum(100 + len(name) for name in summary.names)


def concat_summaries(summaries: list[KernelSummary]) -> KernelSummary:
    """One summary of several (each with its own names), kernel ids renumbered."""
    if len(summaries) == 1:
        return summaries[0]
    fields = ("rank", "stream", "window", "cluster", "count", "sum_ns", "p50_ns", "p99_ns")
    offsets = np.cumsum([0] + [len(s.names) for s in summaries[:-1]])
    return KernelSummary(**{f: np.concatenate([getattr(s, f) for s in summaries])
                            for f in fields},
                         kernel=np.concatenate([s.kernel + o for s, o in
                                                zip(summaries, offsets, strict=True)]),
                         names=[name for s in summaries for name in s.names],
                         window_ns=summaries[0].window_ns)
