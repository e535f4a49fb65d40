"""Recovery at start: replay the write-ahead log a previous processor left on this spool.

Two passes over the segments, oldest first. The first reads only the small ``D`` entries: the
windows whose files already reached the spool, whose records are skipped (a body whose records
all went to such windows is not even decoded). The second rebuilds
everything else in log order: each segment's ``K`` snapshot restores per-rank state
(identities, watermarks, closed windows), each ``B`` body is decoded and filed into windows
exactly as it was when acknowledged (the items refused then are passed over), each ``C`` entry
closes its window again, which the writer then finishes. Windows still open when the process
died come back open and carry on. Their ``.part`` files from the crashed run are deleted first:
the log holds everything they held, and more.
"""

from __future__ import annotations

import logging
import time

import orjson

from argus_core.processor.ingest import BodyError, decode_body, parse_body
from argus_core.processor.wal import BODY, CLOSED, DONE, SNAPSHOT, read_body_payload
from argus_core.processor.window_output import leftovers

logger = logging.getLogger("argus_core.processor")

REPLAY_MAX_BODY_BYTES = 1 << 30
"""Decompressed size allowed for a logged body at replay (it was accepted under the limit of
its time; a lower ``--max-body-mb`` since must not refuse it now)."""


def replay(processor) -> None:
    """Rebuild ``processor``'s windows from its log and start a fresh segment."""
    wal = processor.wal
    for _, part, key_path in leftovers(processor.work_dir):
        part.unlink(missing_ok=True)
        key_path.unlink(missing_ok=True)
    segments = wal.segments()
    windows = processor.windows
    with processor._lock:
        # New entries (windows finished while replaying) go after everything old.
        processor.roll()
    if not segments:
        return
    started = time.monotonic()
    windows.skip = {tuple(orjson.loads(entry.payload)) for segment in segments
                    for entry in wal.read(segment, kinds=(DONE,))}
    bodies = records = closed = passed = 0
    for segment in segments:
        for entry in wal.read(segment):
            if entry.kind == SNAPSHOT:
                with processor._lock:
                    windows.restore(orjson.loads(entry.payload))
            elif entry.kind == BODY:
                logged = read_body_payload(entry.payload)
                if logged.windows is not None and logged.windows <= windows.skip:
                    passed += 1  # every window it went to is written: nothing to decode
                    continue
                records += _replay_body(processor, logged, segment)
                bodies += 1
            elif entry.kind == CLOSED:
                with processor._lock:
                    handover = windows.close_key(tuple(orjson.loads(entry.payload)))
                    if handover is not None:
                        processor.finish_later(handover, log_close=False)
                        closed += 1
    skipped = len(windows.skip)
    windows.skip = set()
    with processor._lock:
        processor.stats.replayed_bodies += bodies
        processor.roll()
    processor.retire_segments()
    logger.info("argus processor: replayed %d bodies (%d records) from %d log segment(s) in "
                "%.1f s: %d windows to finish, %d still open, %d already written (%d bodies of "
                "theirs passed over)", bodies, records, len(segments),
                time.monotonic() - started, closed, len(windows.open), skipped, passed)


def _replay_body(processor, logged, segment: int) -> int:
    """File one logged body's records into windows again; returns how many."""
    try:
        data = decode_body(logged.body, logged.encoding, REPLAY_MAX_BODY_BYTES)
    except BodyError as exc:  # it decoded when it came in: the log is damaged
        logger.error("argus processor: a logged body no longer decodes (%s); skipped", exc)
        return 0
    result = parse_body(data, skip=logged.refused)
    deadline = time.monotonic() + 60
    while (processor.memory_used() >= processor.config.memory_budget_bytes
           and time.monotonic() < deadline):
        time.sleep(0.01)  # let the writer catch up: replay keeps to the budget too
    with processor._lock:
        processor.apply(result.records, segment, log_close=False)
    return len(result.records)
