"""Read schema-v1 NDJSON from files, directories, gzip files or stdin into columnar traces.

A bad line is rejected with its source, line number and field, counted, and skipped: the rest
of the input is still read. ``load_traces`` raises ``InputError`` only when nothing usable is
left (no input files, or no valid record at all).

Kernel batches are parsed in bulk: exporters ship many small batches (a few kernels each), and
validating them one by one cost more than everything else diagnosis does. Well-formed batches
are gathered and converted a few thousand at a time, one numpy conversion per column; a group
with anything wrong in it goes record by record through ``schema.parse_record``, so every
reject still names its line and field.
"""

from __future__ import annotations

import gzip
import io
import itertools
import sys
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np
import orjson

from argus_core.gcpause import cycle_collection_paused
from argus_core.schema import KERNEL_COLUMNS, SchemaError, parse_record
from argus_core.trace import Trace, TraceBuilder

TRACE_SUFFIXES = (".ndjson", ".jsonl", ".json")
GZIP_MAGIC = b"\x1f\x8b"
GZIP_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile)  # truncated or corrupt .gz
MAX_KEPT_REJECTS = 1000


class InputError(Exception):
    """The input as a whole cannot be diagnosed (nothing to read, or nothing valid in it)."""


@dataclass(frozen=True)
class Reject:
    """One rejected line: where it was and what was wrong with it."""

    source: str
    line: int
    field: str
    reason: str

    def __str__(self) -> str:
        return f"{self.source}:{self.line}: {self.field}: {self.reason}"


@dataclass
class LoadResult:
    """Traces per job plus an account of what was skipped and why."""

    traces: dict[str, Trace]
    records: int = 0
    rejects: list[Reject] = field(default_factory=list)
    reject_counts: Counter = field(default_factory=Counter)
    empty_sources: list[str] = field(default_factory=list)

    @property
    def rejected(self) -> int:
        """Total number of rejected lines (including those not kept in ``rejects``)."""
        return sum(self.reject_counts.values())


def trace_files(paths: Iterable[str | Path]) -> list[str]:
    """Expand paths into trace sources: files as given, directories recursively, ``-`` = stdin."""
    out: list[str] = []
    for raw in paths:
        if str(raw) == "-":
            out.append("-")
            continue
        path = Path(raw)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and _is_trace_name(p.name))
            out.extend(str(p) for p in found)
        elif path.exists():
            out.append(str(path))
        else:
            raise InputError(f"{path}: no such file or directory")
    return out


def _is_trace_name(name: str) -> bool:
    name = name.removesuffix(".gz")
    return name.endswith(TRACE_SUFFIXES)


def _open(source: str) -> BinaryIO:
    """The source's bytes, gunzipped when they start with gzip's magic (files and stdin)."""
    if source == "-":
        stream = sys.stdin.buffer
        if not hasattr(stream, "peek"):
            stream = io.BufferedReader(stream)  # type: ignore[arg-type]
        if stream.peek(len(GZIP_MAGIC)).startswith(GZIP_MAGIC):
            return gzip.GzipFile(fileobj=stream)  # type: ignore[return-value]
        return stream
    handle = open(source, "rb")  # noqa: SIM115 - closed by the caller
    if handle.read(2) == GZIP_MAGIC:
        handle.seek(0)
        return gzip.GzipFile(fileobj=handle)  # type: ignore[return-value]
    handle.seek(0)
    return handle


def iter_lines(source: str) -> Iterator[tuple[int, bytes]]:
    """Yield (line number, raw line) for each non-blank line of a source."""
    stream = _open(source)
    try:
        for number, line in enumerate(stream, start=1):
            if line.strip():
                yield number, line
    finally:
        if source != "-":
            stream.close()


def load_traces(paths: Iterable[str | Path],
                progress: Callable[[int], None] | None = None) -> LoadResult:
    """Read every record under ``paths`` into one columnar Trace per job.

    ``progress`` (optional) is called with the number of bytes consumed since the last call.
    """
    sources = trace_files(paths)
    if not sources:
        raise InputError("no trace files found (looked for *.ndjson, *.jsonl, *.json, and .gz)")
    builder = TraceBuilder()
    result = LoadResult(traces={})
    with cycle_collection_paused():
        _read(sources, builder, result, progress)
    if not result.traces:
        where = ", ".join(sources[:3]) + (" ..." if len(sources) > 3 else "")
        detail = f"; first problem: {result.rejects[0]}" if result.rejects else ""
        raise InputError(f"no valid trace records in {where}{detail}")
    return result


def _read(sources: list[str], builder: TraceBuilder, result: LoadResult,
          progress: Callable[[int], None] | None) -> None:
    """Read every source into ``builder``, counting records and rejects in ``result``."""
    bulk = KernelBulk(builder, result)
    for source in sources:
        seen = number = 0
        try:
            for number, line in iter_lines(source):
                seen += 1
                if progress is not None:
                    progress(len(line))
                try:
                    record = orjson.loads(line)
                    if not bulk.offer(record, source, number):
                        builder.add(parse_record(record))
                        result.records += 1
                except orjson.JSONDecodeError as exc:
                    _reject(result, Reject(source, number, "json", f"malformed JSON ({exc})"))
                except SchemaError as exc:
                    _reject(result, Reject(source, number, exc.field, exc.message))
        except GZIP_ERRORS as exc:  # the lines before the damage are kept
            _reject(result, Reject(source, number + 1, "gzip",
                                   f"unreadable from here on: {exc}"))
            seen += 1
        bulk.flush()
        if seen == 0:
            result.empty_sources.append(source)
    order = {source: i for i, source in enumerate(sources)}  # bulk rejects come at a flush
    result.rejects.sort(key=lambda r: (order.get(r.source, -1), r.line))
    result.traces = builder.finish()


def _reject(result: LoadResult, reject: Reject) -> None:
    result.reject_counts[reject.field.split("[")[0]] += 1
    if len(result.rejects) < MAX_KEPT_REJECTS:
        result.rejects.append(reject)


class KernelBulk:
    """Gathers well-formed kernel batches and converts them a group at a time.

    ``offer`` takes a decoded record when it has the shape of a kernel batch (its columns
    are checked later, in bulk); ``flush`` converts the group with one ``np.array`` per column
    and interns names once per distinct ``names`` list. Any problem in a group sends its
    records through ``parse_record`` one by one, which names the exact line and field.
    """

    GROUP = 4096  # records converted at once

    def __init__(self, builder: TraceBuilder, result: LoadResult):
        self.builder = builder
        self.result = result
        self.pending: list[tuple[dict, str, int]] = []
        self._luts: dict[tuple[str, ...], np.ndarray | None] = {}

    def offer(self, record, source: str, line: int) -> bool:
        """Keep ``record`` for bulk conversion if it is a kernel batch (checked in ``flush``)."""
        if not (type(record) is dict and record.get("kind") == "kernels"):
            return False
        self.pending.append((record, source, line))
        if len(self.pending) >= self.GROUP:
            self.flush()
        return True

    def flush(self) -> None:
        """Convert the pending group (or, if any record in it is bad, parse one by one)."""
        group, self.pending = self.pending, []
        if not group:
            return
        if not self._convert([record for record, _, _ in group]):
            for record, source, line in group:
                try:
                    self.builder.add(parse_record(record))
                    self.result.records += 1
                except SchemaError as exc:
                    _reject(self.result, Reject(source, line, exc.field, exc.message))
            return
        self.result.records += len(group)

    def _lut(self, names: list) -> np.ndarray | None:
        """Global ids of a ``names`` list (None when it is not a list of non-empty strings)."""
        key = tuple(names)
        lut = self._luts.get(key)
        if lut is None:
            if not all(type(n) is str and n for n in key):
                return None
            lut = self._luts[key] = self.builder.kernel_names.ids(list(key))
        return lut

    def _convert(self, records: list[dict]) -> bool:
        """Add the group's kernels column by column; False (nothing added) if any is bad."""
        versions = [r.get("v") for r in records]
        jobs = [r.get("job") for r in records]
        ranks = [r.get("rank") for r in records]
        names = [r.get("names") for r in records]
        if not (set(map(type, versions)) == {int} and set(versions) == {1}
                and set(map(type, jobs)) == {str} and "" not in jobs
                and set(map(type, ranks)) == {int} and min(ranks) >= 0
                and set(map(type, names)) == {list}):
            return False
        luts = [self._lut(n) for n in names]
        if any(lut is None for lut in luts):
            return False
        columns = []
        lengths = None
        for column in KERNEL_COLUMNS:
            parts = [r.get(column) for r in records]
            if not all(type(p) is list for p in parts):
                return False
            size = np.fromiter(map(len, parts), dtype=np.int64, count=len(parts))
            if lengths is None:
                lengths = size
            elif not np.array_equal(size, lengths):
                return False
            flat = list(itertools.chain.from_iterable(parts))
            if not set(map(type, flat)) <= {int}:  # no bool, float, str or None
                return False
            try:
                values = np.array(flat, dtype=np.int64)
            except OverflowError:
                return False
            if values.size and values.min() < 0:
                return False
            columns.append(values)
        name, stream, start, dur = columns
        distinct = {id(lut): lut for lut in luts}
        base, offset = {}, 0
        for key, lut in distinct.items():
            base[key] = offset
            offset += len(lut)
        table = np.concatenate(list(distinct.values())) if distinct else np.zeros(0, np.int32)
        width = np.repeat(np.array([len(lut) for lut in luts], dtype=np.int64), lengths)
        if name.size and (name >= width).any():
            return False
        first = np.repeat(np.array([base[id(lut)] for lut in luts], dtype=np.int64), lengths)
        global_name = table[first + name]
        rank = np.repeat(np.array(ranks, dtype=np.int64), lengths)
        for job in dict.fromkeys(jobs):
            if len(set(jobs)) == 1:
                self.builder.add_kernel_columns(job, rank, global_name, stream, start, dur)
                break
            mine = np.repeat(np.array([j == job for j in jobs]), lengths)
            self.builder.add_kernel_columns(job, rank[mine], global_name[mine], stream[mine],
                                            start[mine], dur[mine])
        return True
